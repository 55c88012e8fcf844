#!/opt/slurm-snap/venv/bin/python
"""A Hugging Face Trainer job taking part in slurm-snap snapshots through
slurm_snap.client.huggingface.SnapshotCallback: a tiny GPT-2 built from a
config (nothing downloaded; HF_HUB_OFFLINE=1), trained on CPU with DDP over
gloo, one rank per srun task (examples/train-hf.sbatch).

    srun python train_hf.py --steps 100000

Output on stdout, as examples/train.py: `step N loss X` (every rank),
`resumed from step N (PATH)`, `params step N rank R SHA256` after each
checkpoint and after the first resumed step, `batch step N rank R FIRST`
(the first token of the step's batch: which sample it trained on), and
`SLURM_SNAP_FIRST_STEP N` after the first resumed step.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def say(line: str) -> None:
    """One write per line: ranks share the job's output."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def torch_distributed_env() -> None:
    """What Accelerate reads to join the job's ranks, from Slurm's task
    variables (srun starts one task per rank; no torchrun): rank 0's node (the
    first of the step's node list) and a port derived from the job and its
    run, as examples/train.py does. The four torchrun variables are also what
    the slurm-snap client takes its identity from when they are all set."""
    if "SLURM_PROCID" not in os.environ or "RANK" in os.environ:
        return
    from slurm_snap.slurm import hostlist

    nodes = hostlist.expand(os.environ.get("SLURM_STEP_NODELIST") or os.environ["SLURM_JOB_NODELIST"])
    per_node = os.environ.get("SLURM_STEP_TASKS_PER_NODE", "1").split("(")[0].split(",")[0]
    job, run = int(os.environ.get("SLURM_JOB_ID", "0")), int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    os.environ.update(RANK=os.environ["SLURM_PROCID"], LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"),
                      WORLD_SIZE=os.environ.get("SLURM_STEP_NUM_TASKS", os.environ.get("SLURM_NTASKS", "1")),
                      LOCAL_WORLD_SIZE=per_node, MASTER_ADDR=nodes[0],
                      MASTER_PORT=str(20000 + (job * 7 + run * 131 + 3) % 20000))


def main(argv=None) -> int:
    try:
        import slurm_snap  # noqa: F401
    except ImportError:  # a source checkout
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--release-timeout", type=float, default=120.0)
    parser.add_argument("--resume-from", help="a checkpoint-N directory (default: what resume.json names; "
                        "`slurm-snap resume-path` prints it for a batch script)")
    args = parser.parse_args(argv)
    torch_distributed_env()

    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from slurm_snap.client.huggingface import SnapshotCallback

    torch.set_num_threads(1)

    class Tokens(Dataset):
        """Sample i is a fixed sequence whose first token says which sample it is."""

        def __init__(self, n: int, length: int = 16, vocab: int = 64):
            gen = torch.Generator().manual_seed(7)
            self.ids = torch.randint(1, vocab, (n, length), generator=gen)
            self.ids[:, 0] = torch.arange(n) % vocab

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    def digest(model) -> str:
        h = hashlib.sha256()
        for p in model.parameters():
            h.update(p.detach().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    class Show(TrainerCallback):
        """What the example prints (not needed for snapshots)."""

        def __init__(self, snap):
            self.snap, self.first = snap, None

        def on_step_begin(self, a, state, control, **kw):
            if args.step_time:
                time.sleep(args.step_time)

        def on_log(self, a, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                say(f"step {state.global_step} loss {float(logs['loss']):.6f}")

        def on_step_end(self, a, state, control, model=None, **kw):
            step = state.global_step
            if self.snap.resumed_step is not None and self.first is None:
                self.first = step
                say(f"params step {step} rank {int(os.environ.get('RANK', 0))} {digest(model)}")

        def on_save(self, a, state, control, model=None, **kw):
            say(f"params step {state.global_step} rank {int(os.environ.get('RANK', 0))} {digest(model)}")

    class Batches(Trainer):
        """Prints which sample each rank's batch starts with, as it trains on it."""

        def training_step(self, model, inputs, *rest, **kw):
            say(f"batch step {self.state.global_step + 1} rank {self.args.process_index} "
                f"{int(inputs['input_ids'][0, 0])}")
            return super().training_step(model, inputs, *rest, **kw)

    torch.manual_seed(1234)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                       bos_token_id=0, eos_token_id=0))
    snap = SnapshotCallback(release_timeout=args.release_timeout)
    targs = TrainingArguments(output_dir=snap.checkpoint_dir(), max_steps=args.steps, per_device_train_batch_size=4,
                              learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                              ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
                              dataloader_drop_last=True, disable_tqdm=True, seed=1234)
    trainer = Batches(model=model, args=targs, train_dataset=Tokens(64 * 1024), callbacks=[snap])
    trainer.remove_callback(PrinterCallback)     # the example prints its own lines
    trainer.add_callback(Show(snap))
    resume = snap.resume_path(args.resume_from)
    if resume is not None:
        say(f"resumed from step {snap.resumed_step} ({resume})")
    trainer.train(resume_from_checkpoint=resume)
    if snap.ckpt is not None and snap.ckpt.terminating:
        # Everything the requeued run needs is durable: leave at once (docs/client.md).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
