"""A training job without torch, for the dev cluster's fault tests: each rank
counts steps, checkpoints its count into its node's volume of CLASS (from
job.json) when slurm-snap asks, and resumes from resume.json after a
requeue. Standard library and slurm_snap.client only, so twenty of them fit
on the dev cluster's three 2-core nodes.

    srun PYTHON counting_job.py STEP_SECONDS [CLASS]

Output, one line each (flushed):
    start rank R node N restart C
    resumed from step S (PATH)          the checkpoint it resumed from
    not resumed: WHY                    a requeued run with no checkpoint to use
    step S
    checkpoint step S
    released | no release               after its acknowledgement
    exit rank R node N                  leaving (its node's Epilog comes next)
"""
from __future__ import annotations

import os
import sys
import time

from slurm_snap.client import Checkpointer


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def resume_step(ckpt: Checkpointer) -> int:
    info = ckpt.resume_info()
    if info is None:
        if int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0:
            say("not resumed: no resume.json")
        return 0
    mine = info.get("ranks", {}).get(str(ckpt.rank)) or {}
    path = mine.get("checkpoint") or (info["checkpoint"]["snapshot"] if ckpt.rank == 0 else None)
    if not path or not os.path.exists(path):
        say(f"not resumed: {mine.get('missing') or info.get('missing') or 'no checkpoint for this rank'}")
        return 0
    with open(path) as f:
        step = int(f.read().split()[0])
    say(f"resumed from step {step} ({path})")
    return step


def main() -> int:
    step_time = float(sys.argv[1]) if len(sys.argv) > 1 else 0.2
    volume_class = sys.argv[2] if len(sys.argv) > 2 else "scratch"
    ckpt = Checkpointer().install()
    say(f"start rank {ckpt.rank} node {ckpt.node} restart {ckpt.restart_count}")
    step = resume_step(ckpt)
    base = os.path.join(ckpt.volume_path(volume_class), "ckpt")
    os.makedirs(base, exist_ok=True)
    while True:
        time.sleep(step_time)
        step += 1
        say(f"step {step}")
        action = ckpt.decide(step)
        if action.stop:
            break
        if not action.checkpoint:
            continue
        path = os.path.join(base, f"rank-{ckpt.rank}")
        with open(path + ".tmp", "w") as f:
            f.write(f"{step}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        ckpt.commit(step, [path])
        say(f"checkpoint step {step}")
        released = ckpt.wait_for_release(120)
        say("released" if released else "no release")
        if ckpt.terminating:
            break
    ckpt.close()
    say(f"exit rank {ckpt.rank} node {ckpt.node}")
    # Once terminating, leave at once (docs/client.md): Slurm keeps the
    # nodes until every task is gone.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
