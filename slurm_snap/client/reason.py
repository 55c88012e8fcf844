"""Does a checkpoint signal come with a reason to checkpoint?

A signal is a request only when slurm-snap asked for a snapshot (on-demand
and periodic sets write request.json before they signal), Slurm is
preempting the job (scontrol shows a PreemptTime, as rank 0 already reads
before an early release), or the job asked for --snapshot-before-timelimit
(the ranks get its margin) and its EndTime is within the margin and
SIGNAL_SLACK: Slurm's --signal=USR1@MARGIN comes with no PreemptTime and no
request.json. Anything else (a user's `scancel -s USR1`, a user's own
`--signal` warning before the time limit of a job that did not ask) is a
stray signal: before this check every rank checkpointed and then waited for
a release nobody would send (seen: 15 steps in 15 s where 300 were
expected). Measured in benchmarks/stray.py: steps lost per stray signal.

Slurm that cannot be asked (no scontrol, slurmctld away or slower than
ASK_TIMEOUT) is no reason to skip: a real preemption must never be missed
for a slow answer; nor, for a job that asked, is an EndTime Slurm does not
show. The question holds up the asking rank's step (and a
lockstep job's peers at the next exchange), once per signal: bounded here.
"""
from __future__ import annotations

import subprocess
from typing import Callable

from slurm_snap.client import early
from slurm_snap.errors import SnapError
from slurm_snap.jobdir import JobDir

REQUEST = "request"          # request.json of an on-demand or periodic set, still current
PREEMPTION = "preemption"    # Slurm shows the job's PreemptTime
TIMELIMIT = "timelimit"      # --snapshot-before-timelimit, and the job's EndTime is near (or not shown)
UNKNOWN = "unknown"          # Slurm could not be asked: checkpoint all the same
STRAY = ""                   # neither: no checkpoint
ASK_TIMEOUT = 5.0


def _ask(args: list[str]) -> subprocess.CompletedProcess:
    return early.run_scontrol(args, timeout=ASK_TIMEOUT)


def checkpoint_reason(jobdir: JobDir | None, run: Callable = _ask, *, margin: int | None = None,
                      now: float | None = None) -> str:
    """REQUEST, PREEMPTION, TIMELIMIT, UNKNOWN or STRAY for a checkpoint
    signal now (Unix seconds `now`, the clock's when None). `margin` is
    the job's --snapshot-before-timelimit margin in seconds (Checkpointer.
    timelimit_margin), None when it did not ask."""
    if jobdir is None:
        return UNKNOWN
    try:
        request = jobdir.read_request()
        if request is not None and jobdir.request_is_current(request):
            return REQUEST
    except (OSError, SnapError):
        return UNKNOWN   # a request file that cannot be read may still be a request
    try:
        fields = early.job_state(jobdir.job_id, run)
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        return UNKNOWN
    if early.shows_preemption(fields):
        return PREEMPTION
    if margin is not None:
        left = early.seconds_left(fields, now)
        if left is None or early.near_time_limit(left, margin):
            return TIMELIMIT
    return STRAY
