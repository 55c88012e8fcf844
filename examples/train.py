#!/opt/slurm-snap/venv/bin/python
"""A small but real PyTorch (CPU) training job that takes part in slurm-snap
snapshots through slurm_snap.client: data-parallel (DDP over gloo) across
every rank of the step, as GPU jobs run, or with --independent one model
per rank.

Launch it with `srun` (one task per rank) or `srun ... torchrun` (one agent
per node, see examples/train-torchrun.sbatch); the client reads who it is
from torchrun's or Slurm's variables. Output on stdout:

    rank R pid P node N world W           once, at start
    resumed from step N (PATH)            when it resumes
    step N loss X                         every step, every rank
    params step N rank R SHA256           after a checkpoint and after the first resumed step
    SLURM_SNAP_FIRST_STEP N               after the first resumed step (the restore-drill marker)

At a checkpoint every rank decides at the same step (the client's step
agreement, one all-reduce per step overlapped with the next step); rank 0
saves model and optimizer to <ckpt-dir>/step-<N>/model.pt and points
<ckpt-dir>/latest at it, every rank acknowledges what it wrote (rank 0 its
files, the others none) and waits for the release; then training goes on
(on-demand snapshot) or ends cleanly (preemption). With --independent each
rank saves step-<N>/rank-<r>.pt and latest.rank-<r> and may stop at its
own step. With --dcp the checkpoint is torch.distributed.checkpoint's,
saved asynchronously into step-<N>/dcp/, every rank acknowledging its own
shard files once its save is durable.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
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
from slurm_snap.client import dcp as snap_dcp
from slurm_snap.client.signals import parse_signal
from slurm_snap.errors import SnapError

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEP_DIR = re.compile(r"^step-(\d+)$")
MODEL = "model.pt"


def say(line: str, stream=None) -> None:
    """One write per line. torchrun's workers on a node share one pipe, and
    print() writes the text and its newline separately: under load two
    workers' lines merged into one ("step 835 loss 0.51step 835 loss 0.54"),
    and a line the drills and tests read was lost in it."""
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def log(message: str) -> None:
    # stdout carries the lines the tests and the drills read; the rest is for humans.
    say(f"train.py: {message}", sys.stderr)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-dir", help="checkpoint directory (default: <CLASS volume>/ckpt from job.json)")
    parser.add_argument("--ckpt-volume", default="pfs", metavar="CLASS",
                        help="volume class whose per-job volume holds the checkpoints (default pfs)")
    parser.add_argument("--steps", type=int, default=1000, help="last step to train (default 1000)")
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="extra seconds to sleep per step, so tests can catch a running job")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="K",
                        help="also save a local checkpoint every K steps (no acknowledgement)")
    parser.add_argument("--resume-from", help="checkpoint file or directory to resume from")
    parser.add_argument("--release-timeout", type=float, default=120.0,
                        help="seconds to wait for the coordinator's release (default 120)")
    parser.add_argument("--ignore-signal", action="store_true",
                        help="ignore checkpoint requests (never acknowledge; for barrier-timeout tests); "
                             "implies --independent: a rank of a process group cannot stay out of the "
                             "step agreement without stalling its peers")
    parser.add_argument("--independent", action="store_true",
                        help="no process group: each rank trains and checkpoints its own model "
                             "(also SLURM_SNAP_INDEPENDENT=1, set by sbatch --snapshot-independent-ranks)")
    parser.add_argument("--workers", type=int, default=0, metavar="K", help="DataLoader worker processes")
    parser.add_argument("--worker-start", choices=("fork", "spawn", "forkserver"), default="spawn",
                        help="how DataLoader workers start (default spawn: the hard case for signals)")
    parser.add_argument("--dcp", action="store_true",
                        help="checkpoint with torch.distributed.checkpoint.async_save")
    parser.add_argument("--sync-agreement", action="store_true",
                        help="agree on the step without overlapping it with the next step")
    parser.add_argument("--no-early-release", action="store_true",
                        help="at preemption, keep the nodes until GraceTime ends instead of rank 0 requeueing "
                             "the job once every rank acknowledged")
    parser.add_argument("--dist-timeout", type=float, default=300.0, help="process group timeout, seconds")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    args.independent = args.independent or args.ignore_signal
    if args.steps < 1 or args.checkpoint_every < 0 or args.step_time < 0 or args.workers < 0:
        parser.error("--steps must be >= 1, --checkpoint-every, --step-time and --workers >= 0")
    return args


# -- the process group --------------------------------------------------------
def rendezvous(ckpt: snap.Checkpointer) -> tuple[str, int]:
    """MASTER_ADDR/MASTER_PORT: torchrun's, else rank 0's node (the first of
    the step's node list under srun's block distribution) and a port derived
    from the job, so two jobs on one node and a job's requeued run differ."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return addr, int(port)
    from slurm_snap.slurm import hostlist

    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodes:
        sys.exit("train.py: several ranks but no MASTER_ADDR and no SLURM_STEP_NODELIST")
    job = int(os.environ.get("SLURM_JOB_ID", "0"))
    return hostlist.expand(nodes)[0], 20000 + (job * 7 + ckpt.restart_count * 131) % 20000


def init_group(ckpt: snap.Checkpointer, args) -> bool:
    if args.independent or ckpt.independent or (ckpt.world_size or 1) <= 1:
        return False
    addr, port = rendezvous(ckpt)
    store = dist.TCPStore(addr, port, ckpt.world_size, is_master=ckpt.rank == 0,
                          timeout=dt.timedelta(seconds=args.dist_timeout))
    dist.init_process_group("gloo", store=store, rank=ckpt.rank, world_size=ckpt.world_size,
                            timeout=dt.timedelta(seconds=args.dist_timeout))
    return True


# -- model, data ----------------------------------------------------------------
def make_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


class StepBatches(Dataset):
    """Batch `step` of `rank`, derived from (seed, rank, step) alone, so a
    resumed run sees the data it would have seen."""

    def __init__(self, seed: int, rank: int):
        self.seed, self.rank = seed, rank

    def __len__(self) -> int:
        return 1 << 40

    def __getitem__(self, step: int):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank * 10_007 + step)
        x = torch.randn(64, 16, generator=gen)
        y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * x[:, :1]
        return x, y


def batches(args, rank: int, start: int):
    data = StepBatches(args.seed, rank)
    steps = range(start + 1, args.steps + 1)
    if not args.workers:
        return (data[s] for s in steps)
    return iter(DataLoader(data, batch_size=None, sampler=steps, num_workers=args.workers,
                           multiprocessing_context=args.worker_start))


def params_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


# -- checkpoints -----------------------------------------------------------------
def default_ckpt_dir(ckpt: snap.Checkpointer, vclass: str = "pfs") -> str:
    # In a restore drill (`slurm-snap restore-test`) the class's volume is a
    # clone of the snapshot: train from there, never from the live tree.
    restored = os.environ.get("SLURM_SNAP_RESTORE_" + vclass.upper().replace("-", "_"))
    if os.environ.get("SLURM_SNAP_RESTORE") == "1" and restored:
        return os.path.join(restored, "ckpt")
    if ckpt.enabled:
        try:
            return os.path.join(ckpt.volume_path(vclass), "ckpt")
        except SnapError as exc:  # no job.json or no such volume declared
            log(f"no {vclass} volume ({exc}); using ./ckpt")
    return os.path.abspath("ckpt")


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


def own_names(args, rank: int) -> tuple[str, str]:
    """(checkpoint file, pointer) names: one model for the job, or one per rank."""
    if args.independent:
        return f"rank-{rank}.pt", f"latest.rank-{rank}"
    return MODEL, "latest"


def save_checkpoint(args, ckpt_dir: str, rank: int, step: int, model, optimizer) -> list[str]:
    """Save this rank's share; returns the files it wrote. In a data-parallel
    job every rank holds the same weights and optimizer state: rank 0 saves
    them and the others have nothing of their own to save."""
    name, pointer_name = own_names(args, rank)
    if not args.independent and rank != 0:
        return []
    step_dir = os.path.join(ckpt_dir, f"step-{step}")
    os.makedirs(step_dir, exist_ok=True)
    path = os.path.join(step_dir, name)
    atomic_save({"step": step, "rank": rank, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict()}, path)
    pointer = os.path.join(ckpt_dir, pointer_name)
    atomic_text(pointer, os.path.relpath(path, ckpt_dir) + "\n")
    return [path, pointer]


def dcp_state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


def save_dcp(ckpt: snap.Checkpointer, ckpt_dir: str, step: int, model, optimizer) -> None:
    """DCP's asynchronous save; every rank acknowledges its own shards (and
    rank 0 the metadata) from a thread once its save completed."""
    import torch.distributed.checkpoint as dcp

    target = os.path.join(ckpt_dir, f"step-{step}", "dcp")
    os.makedirs(target, exist_ok=True)
    future = dcp.async_save(dcp_state(model, optimizer), checkpoint_id=target)

    def files():
        own = snap_dcp.shard_files(target, ckpt.rank)
        if ckpt.rank == 0:
            pointer = os.path.join(ckpt_dir, "latest")
            atomic_text(pointer, os.path.relpath(target, ckpt_dir) + "\n")
            own.append(pointer)
        return own
    if ckpt.enabled:
        ckpt.commit_async(step, future, files)
    else:
        getattr(future, "upload_completion", future).result()


def find_checkpoint(location: str, args, rank: int) -> str | None:
    """A checkpoint at `location`: the file itself, a step directory holding
    model.pt / rank-<r>.pt / dcp/, or a checkpoint directory (its pointer,
    else its newest step-N)."""
    if os.path.isfile(location):
        return location
    if not os.path.isdir(location):
        return None
    name, pointer_name = own_names(args, rank)
    for candidate in (os.path.join(location, name), os.path.join(location, "dcp", snap_dcp.METADATA)):
        if os.path.isfile(candidate):
            return candidate if not candidate.endswith(snap_dcp.METADATA) else os.path.dirname(candidate)
    if os.path.basename(location.rstrip("/")) == "dcp" and os.path.isfile(os.path.join(location, snap_dcp.METADATA)):
        return location
    pointer = os.path.join(location, pointer_name)
    if os.path.isfile(pointer):
        with open(pointer) as handle:
            found = find_checkpoint(os.path.join(location, handle.read().strip()), args, rank)
        if found:
            return found
    steps = sorted((int(m.group(1)), n) for n in os.listdir(location) if (m := STEP_DIR.match(n)))
    for _, step_name in reversed(steps):
        found = find_checkpoint(os.path.join(location, step_name), args, rank)
        if found:
            return found
    return None


def resume_source(args, ckpt: snap.Checkpointer, ckpt_dir: str) -> str | None:
    if args.resume_from:
        found = find_checkpoint(os.path.abspath(args.resume_from), args, ckpt.rank)
        if found is None:
            sys.exit(f"train.py: --resume-from {args.resume_from!r}: no checkpoint for rank {ckpt.rank}")
        return found
    info = ckpt.resume_info()
    if info is not None:
        mine = info["ranks"].get(str(ckpt.rank))
        if mine is not None:
            # This rank's own entry: its checkpoint where it now runs (a
            # node-local one brought over from the node it ran on before).
            found = mine.get("checkpoint") and find_checkpoint(mine["checkpoint"], args, ckpt.rank)
            if found:
                return found
            if mine.get("missing"):
                log(f"rank {ckpt.rank}: {mine['missing']}")
        for key in ("snapshot", "live"):
            location = info["checkpoint"][key]
            found = location and find_checkpoint(location, args, ckpt.rank)
            if found:
                return found
        log(f"resume.json of set {info['set_id']} names no checkpoint for rank {ckpt.rank}")
    return find_checkpoint(ckpt_dir, args, ckpt.rank)


def load_checkpoint(source: str, model, optimizer) -> int:
    if os.path.isdir(source):   # a DCP checkpoint
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = dcp_state(model, optimizer)
        dcp.load(state, checkpoint_id=source)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        match = STEP_DIR.match(os.path.basename(os.path.dirname(source.rstrip("/"))))
        return int(match.group(1))
    state = torch.load(source, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


# -- the loop -----------------------------------------------------------------------
class Terminated(Exception):
    """Slurm is ending the job (SIGTERM after the preemption's checkpoint, or
    the requeue of an early release): leave at once."""


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # several ranks share a few cores
    ckpt = snap.Checkpointer(independent=True if args.independent else None,
                             overlap=not args.sync_agreement,
                             early_release=False if args.no_early_release else None)
    args.independent = ckpt.independent
    if args.ignore_signal:
        # Keep training through requests without ever acknowledging; SIGTERM
        # keeps its default action so Slurm can still end the rank.
        for name in {"SIGUSR1", os.environ.get("SLURM_SNAP_SIGNAL") or "SIGUSR1"}:
            signal.signal(parse_signal(name), signal.SIG_IGN)
    else:
        ckpt.install()
    say(f"rank {ckpt.rank} pid {os.getpid()} node {ckpt.node} world {ckpt.world_size or 1}")
    grouped = init_group(ckpt, args)
    ckpt_dir = os.path.abspath(args.ckpt_dir) if args.ckpt_dir else default_ckpt_dir(ckpt, args.ckpt_volume)
    os.makedirs(ckpt_dir, exist_ok=True)

    # One model for the job (DDP broadcasts rank 0's weights at wrapping), or one per rank.
    model, optimizer = make_model(args.seed + (ckpt.rank if args.independent else 0))
    start = 0
    source = resume_source(args, ckpt, ckpt_dir)
    if source is not None:
        start = load_checkpoint(source, model, optimizer)
        say(f"resumed from step {start} ({source})")
    train_model = nn.parallel.DistributedDataParallel(model) if grouped else model

    loss_fn = nn.MSELoss()
    ignored = 0
    try:
        for step, (x, y) in zip(range(start + 1, args.steps + 1), batches(args, ckpt.rank, start)):
            optimizer.zero_grad()
            loss = loss_fn(train_model(x), y)
            loss.backward()
            optimizer.step()
            say(f"step {step} loss {loss.item():.6f}")
            if source is not None and step == start + 1:
                say(f"params step {step} rank {ckpt.rank} {params_digest(model)}")
                snap.mark_first_step(step)
            action = ckpt.decide(step)
            if ckpt.ignored_signals != ignored:
                ignored = ckpt.ignored_signals
                log(f"step {step}: a checkpoint signal with no slurm-snap request and no preemption: ignored")
            if action.stop:
                log(f"terminating at step {step}")
                raise Terminated
            if action.checkpoint:
                if args.dcp:
                    save_dcp(ckpt, ckpt_dir, step, model, optimizer)
                    files = None
                else:
                    files = save_checkpoint(args, ckpt_dir, ckpt.rank, step, model, optimizer)
                say(f"params step {step} rank {ckpt.rank} {params_digest(model)}")
                if not ckpt.enabled:
                    log(f"checkpoint at step {step} saved; no barrier directory, not acknowledging")
                    continue
                if files is not None:
                    ckpt.commit(step, files)
                requested_by = ckpt.last_signal[0] if ckpt.last_signal else None
                epoch = ckpt.epoch()
                if ckpt.wait_for_release(args.release_timeout):
                    log(f"acknowledged and released at step {step} for epoch {epoch}; continuing")
                elif ckpt.terminating or requested_by == "SIGTERM":
                    log(f"terminating after the checkpoint of step {step}")
                    raise Terminated
                else:
                    log(f"no release within {args.release_timeout:g} s; continuing")
            elif args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint(args, ckpt_dir, ckpt.rank, step, model, optimizer)
            if args.step_time:
                time.sleep(args.step_time)
        return 0
    finally:
        ckpt.close()
        if grouped and not ckpt.terminating:
            dist.destroy_process_group()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Terminated:
        # Everything the requeued run needs is durable and acknowledged. The
        # interpreter's teardown of torch took 3-4 s of CPU per rank on the dev
        # cluster, keeping the preemptor's nodes (slurmstepd waits for every
        # task): skip it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
