#!/opt/slurm-snap/venv/bin/python
"""The same regression as examples/train.py, written for PyTorch Lightning
(CPU, DDP over gloo under srun), taking part in slurm-snap snapshots through
slurm_snap.client.lightning.SnapshotCallback. Lightning's own SLURM
auto-requeue stays on (its default): the callback takes SIGUSR1 first, so a
preemption gives one checkpoint, one requeue (Slurm's), one set.

    srun python train_lightning.py --steps 100000

Output on stdout, as train.py: `step N loss X` (every rank),
`resumed from step N (PATH)`, `SLURM_SNAP_FIRST_STEP N` after the first
resumed step.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

try:
    from slurm_snap.client.lightning import SnapshotCallback
except ImportError:  # a source checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from slurm_snap.client.lightning import SnapshotCallback

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def say(line: str) -> None:
    """One write per line (as examples/train.py): print() writes the newline
    separately, and ranks sharing a pipe then merge their lines."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Samples(Dataset):
    def __init__(self, n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 16, generator=gen)
        self.y = torch.sin(self.x.sum(dim=1, keepdim=True)) + 0.1 * self.x[:, :1]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Regression(L.LightningModule):
    def __init__(self, step_time: float = 0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
        self.step_time = step_time

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        # global_step counts finished optimizer steps: this one is the next.
        say(f"step {self.global_step + 1} loss {loss.item():.6f}")
        if self.step_time:
            time.sleep(self.step_time)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--ckpt-dir", help="default: <pfs volume>/ckpt from job.json")
    parser.add_argument("--release-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(1234)

    snap = SnapshotCallback(args.ckpt_dir, release_timeout=args.release_timeout)
    # Lightning wants devices x nodes = the step's tasks.
    per_node = int((os.environ.get("SLURM_NTASKS_PER_NODE") or "1").split("(")[0])
    nodes = int(os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES") or 1)
    distributed = per_node * nodes > 1 and "SLURM_PROCID" in os.environ and os.environ.get("SLURM_SNAP_RESTORE") != "1"
    trainer = L.Trainer(accelerator="cpu", devices=per_node if distributed else 1,
                        num_nodes=nodes if distributed else 1, strategy="ddp" if distributed else "auto",
                        max_steps=args.steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[snap])
    resume = snap.resume_path()
    if resume is not None:
        say(f"resumed from step {snap.resumed_step} ({resume})")
    data = DataLoader(Samples(64 * 512, seed=7), batch_size=64, shuffle=False)
    trainer.fit(Regression(args.step_time), data, ckpt_path=resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
