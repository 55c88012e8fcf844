#!/opt/slurm-snap/venv/bin/python
"""A small but real PyTorch (CPU) training job that takes part in slurm-snap
snapshots through slurm_snap.client.

Each rank trains its own MLP on synthetic regression data (no
torch.distributed: the point is the checkpoint/acknowledge/release protocol,
not collective communication). Output, one line per step on stdout:

    step N loss X

On a checkpoint request (SIGUSR1, or the first SIGTERM) the rank saves model
and optimizer state to <ckpt-dir>/step-<N>/rank-<r>.pt, updates its pointer
<ckpt-dir>/latest.rank-<r>, acknowledges through the barrier directory and
waits for the release; then it continues (on-demand snapshot) or exits
cleanly when termination follows (preemption).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
import time

try:
    from slurm_snap import client as snap
except ImportError:  # running from a source checkout without installing it
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from slurm_snap import client as snap
from slurm_snap.errors import SnapError

import torch
from torch import nn

STEP_DIR = re.compile(r"^step-(\d+)$")


def log(message: str) -> None:
    # stdout carries only the step lines and the resume line; the rest is for humans.
    print(f"train.py: {message}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", help="checkpoint directory (default: <pfs volume>/ckpt from job.json)")
    parser.add_argument("--steps", type=int, default=1000, help="last step to train (default 1000)")
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="extra seconds to sleep per step, so tests can catch a running job")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                        help="also save a local checkpoint every K steps (no acknowledgement)")
    parser.add_argument("--resume-from", help="checkpoint file or directory to resume from")
    parser.add_argument("--release-timeout", type=float, default=120.0,
                        help="seconds to wait for the coordinator's release (default 120)")
    parser.add_argument("--ignore-signal", action="store_true",
                        help="ignore checkpoint requests (never acknowledge; for barrier-timeout tests)")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 0 or args.step_time < 0:
        parser.error("--steps must be >= 1, --checkpoint-every and --step-time >= 0")
    return args


def default_ckpt_dir(ckpt: snap.Checkpointer) -> str:
    # In a restore drill (`slurm-snap restore-test`) the pfs volume is a clone
    # of the snapshot: train from there, never from the live tree.
    restored = os.environ.get("SLURM_SNAP_RESTORE_PFS")
    if os.environ.get("SLURM_SNAP_RESTORE") == "1" and restored:
        return os.path.join(restored, "ckpt")
    if ckpt.enabled:
        try:
            return os.path.join(ckpt.volume_path("pfs"), "ckpt")
        except SnapError as exc:  # no job.json or no pfs volume declared
            log(f"no pfs volume ({exc}); using ./ckpt")
    return os.path.abspath("ckpt")


def make_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(seed: int, rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Derived from (seed, rank, step) so a resumed run sees the same data it would have.
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step)
    x = torch.randn(64, 16, generator=gen)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * x[:, :1]
    return x, y


def atomic_save(obj, path: str) -> None:
    """torch.save to a temp file in the same directory, then rename."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_text(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def save_checkpoint(ckpt_dir: str, rank: int, step: int, model, optimizer) -> list[str]:
    """Save this rank's state; returns the files written (checkpoint, pointer).
    The pointer is per rank: ranks on a shared volume may be at different steps."""
    step_dir = os.path.join(ckpt_dir, f"step-{step}")
    os.makedirs(step_dir, exist_ok=True)
    path = os.path.join(step_dir, f"rank-{rank}.pt")
    atomic_save({"step": step, "rank": rank, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict()}, path)
    pointer = os.path.join(ckpt_dir, f"latest.rank-{rank}")
    atomic_text(pointer, os.path.relpath(path, ckpt_dir) + "\n")
    return [path, pointer]


def find_checkpoint(location: str, rank: int) -> str | None:
    """A checkpoint file for `rank` at `location`: the file itself, a step
    directory holding rank-<r>.pt, or a checkpoint directory (its
    latest.rank-<r> pointer, else its newest step-N/rank-<r>.pt)."""
    if os.path.isfile(location):
        return location
    if not os.path.isdir(location):
        return None
    direct = os.path.join(location, f"rank-{rank}.pt")
    if os.path.isfile(direct):
        return direct
    pointer = os.path.join(location, f"latest.rank-{rank}")
    if os.path.isfile(pointer):
        with open(pointer) as handle:
            target = os.path.join(location, handle.read().strip())
        if os.path.isfile(target):
            return target
    steps = sorted((int(m.group(1)), name) for name in os.listdir(location)
                   if (m := STEP_DIR.match(name)))
    for _, name in reversed(steps):
        candidate = os.path.join(location, name, f"rank-{rank}.pt")
        if os.path.isfile(candidate):
            return candidate
    return None


def resume_source(args, ckpt: snap.Checkpointer, ckpt_dir: str) -> str | None:
    if args.resume_from:
        found = find_checkpoint(os.path.abspath(args.resume_from), ckpt.rank)
        if found is None:
            sys.exit(f"train.py: --resume-from {args.resume_from!r}: no checkpoint for rank {ckpt.rank}")
        return found
    info = ckpt.resume_info()
    if info is not None:
        for key in ("snapshot", "live"):
            location = info["checkpoint"][key]
            found = location and find_checkpoint(location, ckpt.rank)
            if found:
                return found
        log(f"resume.json of set {info['set_id']} names no checkpoint for rank {ckpt.rank}")
    return find_checkpoint(ckpt_dir, ckpt.rank)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # several ranks share a few cores
    ckpt = snap.Checkpointer()
    if args.ignore_signal:
        # Keep training through requests without ever acknowledging; SIGTERM
        # keeps its default action so Slurm can still end the rank.
        for name in {"SIGUSR1", os.environ.get("SLURM_SNAP_SIGNAL") or "SIGUSR1"}:
            signal.signal(snap.parse_signal(name), signal.SIG_IGN)
    else:
        ckpt.install()
    ckpt_dir = os.path.abspath(args.ckpt_dir) if args.ckpt_dir else default_ckpt_dir(ckpt)
    os.makedirs(ckpt_dir, exist_ok=True)

    model, optimizer = make_model(args.seed + ckpt.rank)
    start = 0
    source = resume_source(args, ckpt, ckpt_dir)
    if source is not None:
        state = torch.load(source, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"resumed from step {start} ({source})", flush=True)

    loss_fn = nn.MSELoss()
    for step in range(start + 1, args.steps + 1):
        x, y = batch(args.seed, ckpt.rank, step)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if source is not None and step == start + 1:
            snap.mark_first_step(step)
        if ckpt.terminating:
            log(f"terminating at step {step}")
            return 0
        if ckpt.should_checkpoint():
            files = save_checkpoint(ckpt_dir, ckpt.rank, step, model, optimizer)
            if not ckpt.enabled:
                log(f"checkpoint at step {step} saved; no barrier directory, not acknowledging")
            else:
                ack = ckpt.commit(step, files)
                log(f"acknowledged step {step} for epoch {ckpt.epoch()}: {ack}")
                requested_by = ckpt.last_signal[0] if ckpt.last_signal else None
                if ckpt.wait_for_release(args.release_timeout):
                    log(f"released at step {step}; continuing")
                elif ckpt.terminating or requested_by == "SIGTERM":
                    log(f"terminating after the checkpoint of step {step}")
                    return 0
                else:
                    log(f"no release within {args.release_timeout:g} s; continuing")
        elif args.checkpoint_every and step % args.checkpoint_every == 0:
            save_checkpoint(ckpt_dir, ckpt.rank, step, model, optimizer)
        if args.step_time:
            time.sleep(args.step_time)
    return 0


if __name__ == "__main__":
    sys.exit(main())
