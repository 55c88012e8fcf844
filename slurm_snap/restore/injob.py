"""Inside a drill's Slurm job: wait for the nodes, run the drilled command, write the result.

    python -m slurm_snap.restore.injob <marker_dir>/spec.json

Runs as the job's owner on the job's first node (no privilege change), with
the environment the drill prepared plus Slurm's own SLURM_* variables, and
writes result.json atomically next to the spec for the waiting drill.

Before the command starts, every node's Prolog must have made its clones
(restore/onnode.py): each leaves its file in the job's prolog directory
(jobdir), empty when all was well. The command never runs without a rank's
state: a node that failed, or left no word within the deadline, is the
result. The time to first step is then measured here, on the node, from the
program's start; the time before it is the queue's and the Prologs'.

When the drill's positions are not in Slurm's node order (a position held
on a partner copy's node), the command gets SLURM_HOSTFILE with the
positions in order and SLURM_DISTRIBUTION=arbitrary, so `srun` starts rank
k on the node that holds rank k's state.
"""
from __future__ import annotations

import json
import os
import sys
import time

from ..fsio import write_json
from .runner import RunResult, run_program

PROLOG_POLL = 0.2


def _wait_for_prologs(spec: dict, env: dict, deadline: float) -> str:
    """"" once every node's Prolog left an empty file; else why not."""
    from ..jobdir import JobDir
    from ..slurm.hostlist import expand

    barrier = spec.get("barrier_dir")
    job = os.environ.get("SLURM_JOB_ID", "")
    if not barrier or not job.isdigit():
        return ""   # a drill of a set without node-local parts asks nothing of the Prologs
    nodes = expand(os.environ.get("SLURM_JOB_NODELIST", "")) or [os.environ.get("SLURMD_NODENAME", "")]
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    jobdir = JobDir(barrier, job)
    end = time.monotonic() + deadline
    while True:
        words = {n: jobdir.read_prolog_done(n, restart) for n in nodes}
        said = {n: w.strip() for n, w in words.items() if w}
        if said:
            return "; ".join(said[n] for n in sorted(said))
        missing = [n for n, w in words.items() if w is None]
        if not missing:
            return ""
        if time.monotonic() >= end:
            return (f"the Prolog on {', '.join(missing)} left no word within {deadline:g} s "
                    "(is the slurm-snap Prolog configured there?)")
        time.sleep(PROLOG_POLL)


def _placement_env(spec: dict, marker_dir: str) -> dict[str, str]:
    from ..slurm.hostlist import expand

    positions = list(spec.get("positions") or [])
    if len(positions) < 2 or positions == expand(os.environ.get("SLURM_JOB_NODELIST", "")):
        return {}
    hostfile = os.path.join(marker_dir, "hostfile")
    with open(hostfile, "w") as f:
        f.write("".join(f"{n}\n" for n in positions))
    return {"SLURM_HOSTFILE": hostfile, "SLURM_DISTRIBUTION": "arbitrary"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m slurm_snap.restore.injob SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        spec = json.load(f)
    env = dict(spec["env"])
    env.update({k: v for k, v in os.environ.items() if k.startswith("SLURM_") and not k.startswith("SLURM_SNAP_")})
    host = os.environ.get("SLURMD_NODENAME", "")
    try:
        deadline = float(spec["deadline"])
        problem = _wait_for_prologs(spec, env, deadline)
        if problem:
            result = RunResult(started=False, error=problem, host=host)
        else:
            env.update(_placement_env(spec, spec["cwd"]))
            result = run_program(spec["argv"], env=env, cwd=spec["cwd"], deadline=deadline,
                                 marker_file=spec.get("marker_file"))
            result.host = host
    except Exception as exc:  # the drill must get a result, whatever happened
        result = RunResult(started=False, error=f"in-job runner failed: {type(exc).__name__}: {exc}", host=host)
    write_json(spec["result"], result.as_dict(), mode=0o644, durable=True)
    print(f"slurm-snap restore drill: first step {result.first_step}, exit status {result.exit_status}"
          + (f": {result.error}" if result.error else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
