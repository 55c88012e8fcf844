"""What a requeued run resumes from, for programs not in Python: a bash
wrapper, a JAX or C++ launcher passes it on as an argument.

    RESUME=$(slurm-snap resume-path)        # empty on a fresh start
    srun ./train ${RESUME:+--resume-from "$RESUME"}

Also `python3 -m slurm_snap.client.resume_path` where only the client (its
own wheel, a container) is installed. Inside the running job it reads the
job's resume.json (written by the Prolog of a requeued run: the newest
app-consistent set, checkpoints inside its snapshot) and prints this rank's
checkpoint there (a file or directory, as the rank acknowledged it), or rank
0's for a caller that is no rank (the batch script), or with --step the set's
step, or with --json the whole record. A fresh start (no resume.json, or not
a slurm-snap job at all) prints nothing and exits 0; a resume.json that does
not parse is an error naming what is wrong (exit 2).
"""
from __future__ import annotations

import argparse
import json
import sys

from slurm_snap.client.checkpointer import Checkpointer
from slurm_snap.errors import SnapError


def checkpoint_for(info: dict, rank: int) -> str | None:
    """This rank's checkpoint in the set (resume.json "ranks"), else rank 0's
    (its "checkpoint": the snapshot's copy first)."""
    mine = info.get("ranks", {}).get(str(rank)) or {}
    if mine.get("checkpoint"):
        return mine["checkpoint"]
    return info["checkpoint"]["snapshot"] or info["checkpoint"]["live"]


def answer(args: argparse.Namespace, ckpt: Checkpointer) -> str:
    info = ckpt.resume_info()
    if info is None:
        return ""
    if args.json:
        return json.dumps(info, sort_keys=True)
    if args.step:
        return str(info["step"])
    return checkpoint_for(info, ckpt.rank if args.rank is None else args.rank) or ""


def parser(prog: str = "slurm-snap resume-path") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Print what this run of the job resumes from "
                                "(nothing on a fresh start).")
    p.add_argument("--rank", type=int, metavar="N", help="that rank's checkpoint (default: this process's "
                   "rank, from torchrun's or Slurm's variables; 0 in the batch script)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--step", action="store_true", help="the set's step instead of a path")
    what.add_argument("--json", action="store_true", help="the whole resume.json")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m slurm_snap.client.resume_path") -> int:
    args = parser(prog).parse_args(argv)
    try:
        if args.rank is not None and args.rank < 0:
            raise SnapError(f"invalid --rank {args.rank}: expected an integer >= 0")
        out = answer(args, Checkpointer())
    except SnapError as exc:
        print(f"slurm-snap: {exc}", file=sys.stderr)
        return 2
    if out:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
