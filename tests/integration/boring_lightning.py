"""A Lightning user's program, as docs/client.md shows it, around Lightning's
own demo model (BoringModel) on 3 nodes with DDP: the slurm-snap lines are
the three the doc gives; everything under "instrumentation" only prints
what the tests read (not needed for snapshots).

    srun python boring_lightning.py [--stateful]

--stateful trains on a dataset whose sample i starts with the number i,
through torchdata's StatefulDataLoader (the resumable loading docs/client.md
recommends), so the test can tell which samples the resumed run sees.

Prints: `rank R node N`, `batch step S rank R FIRST`, `params step S rank R
SHA` (after each checkpoint and at the first resumed step), `resumed from
step S (PATH)`.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import lightning.pytorch as L
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from slurm_snap.client.lightning import SnapshotCallback


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- instrumentation --------------------------------------------------------
def digest(module) -> str:
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class Show(L.Callback):
    def __init__(self, snap, step_time: float):
        self.snap, self.step_time, self.first = snap, step_time, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        first = batch[0][0] if isinstance(batch, (list, tuple)) else batch[0]
        say(f"batch step {trainer.global_step + 1} rank {trainer.global_rank} {int(first[0])}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.step_time:
            time.sleep(self.step_time)
        step = trainer.global_step
        if self.snap.resumed_step is not None and self.first is None and step > self.snap.resumed_step:
            self.first = step
            say(f"params step {step} rank {trainer.global_rank} {digest(pl_module)}")
        if self.snap.saved and self.snap.saved[-1][0] == step:
            say(f"params step {step} rank {trainer.global_rank} {digest(pl_module)}")


class Numbered(torch.utils.data.Dataset):
    """Sample i: 32 values, the first of which is i."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.zeros(32)
        x[0] = float(i)
        return x


class NumberedBoring(BoringModel):
    """BoringModel with a resumable loader over Numbered samples."""

    def train_dataloader(self):
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(Numbered(300000), batch_size=2, shuffle=False)

    def training_step(self, batch, batch_idx):
        return super().training_step(batch / 1e5, batch_idx)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stateful", action="store_true")
    parser.add_argument("--step-time", type=float, default=0.25)
    args = parser.parse_args()
    torch.set_num_threads(1)
    say(f"rank {os.environ.get('SLURM_PROCID')} node {os.environ.get('SLURMD_NODENAME')}")
    model = NumberedBoring() if args.stateful else BoringModel()

    # -- the user's program, as docs/client.md shows it ------------------------
    snap = SnapshotCallback()
    trainer = L.Trainer(strategy="ddp", num_nodes=3, callbacks=[snap, Show(snap, args.step_time)],
                        accelerator="cpu", devices=1, max_epochs=-1, max_steps=100000, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=snap.checkpoint_dir())
    resume = snap.resume_path()
    if resume is not None:
        say(f"resumed from step {snap.resumed_step} ({resume})")
    trainer.fit(model, ckpt_path=resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
