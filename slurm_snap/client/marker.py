"""The restore-drill marker: how a resumed program says where it restarted.

Protocol (for any program, not only Python ones): after the first training
step that succeeded after a restore, print exactly one line

    SLURM_SNAP_FIRST_STEP <step>

to stdout, and if the environment variable SLURM_SNAP_RESTORE_MARKER names a
file, write that same line to the file atomically. A restore drill compares
<step> with the snapshot set's step.
"""
from __future__ import annotations

import os
import sys

from slurm_snap.fsio import atomic_write
from slurm_snap.errors import BadValueError

FIRST_STEP_MARKER = "SLURM_SNAP_FIRST_STEP"
MARKER_FILE_ENV = "SLURM_SNAP_RESTORE_MARKER"


def mark_first_step(step: int, env=None, stream=None) -> str:
    """Emit the marker line; returns it (without newline)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise BadValueError(what="first step", value=step, why="expected an integer >= 0")
    line = f"{FIRST_STEP_MARKER} {step}"
    stream = sys.stdout if stream is None else stream
    stream.write(line + "\n")
    stream.flush()
    target = (os.environ if env is None else env).get(MARKER_FILE_ENV)
    if target:
        atomic_write(os.path.abspath(target), (line + "\n").encode(), mode=0o644, durable=True)
    return line
