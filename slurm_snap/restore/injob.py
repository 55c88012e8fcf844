"""Inside a `restore-test --submit` Slurm job: run the drilled command, write the result.

    python -m slurm_snap.restore.injob <marker_dir>/spec.json

Runs as the job's owner (no privilege change), with the environment the
drill prepared plus Slurm's own SLURM_* variables, and writes result.json
atomically next to the spec for the waiting CLI. Stdlib and runner only.
"""
from __future__ import annotations

import json
import os
import sys

from ..fsio import write_json
from .runner import RunResult, run_program


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m slurm_snap.restore.injob SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        spec = json.load(f)
    env = dict(spec["env"])
    env.update({k: v for k, v in os.environ.items() if k.startswith("SLURM_") and not k.startswith("SLURM_SNAP_")})
    try:
        result = run_program(spec["argv"], env=env, cwd=spec["cwd"], deadline=float(spec["deadline"]),
                             marker_file=spec.get("marker_file"))
    except Exception as exc:  # the CLI must get a result, whatever happened
        result = RunResult(started=False, error=f"in-job runner failed: {type(exc).__name__}: {exc}")
    write_json(spec["result"], result.as_dict(), mode=0o644, durable=True)
    print(f"slurm-snap restore drill: first step {result.first_step}, exit status {result.exit_status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
