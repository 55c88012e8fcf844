"""ack/timelimit-<epoch>.request (TimeLimitRecord): this run stops for its
time limit, and its checkpoint is to be snapshot as a set whose trigger is
`timelimit` (sbatch --snapshot-before-timelimit=MARGIN).

Whoever requeues the job for its time limit writes it *before* the requeue:
rank 0 (client/early.py), once every rank acknowledged the checkpoint Slurm's
`--signal=USR1@MARGIN` asked for, or for a rank 0 without `scontrol` (a
container) the node's slurm-snap hook outside it, or EpilogSlurmctld when
the job reached its limit without. The node Epilogs ask
squeue first (Reason=TimeLimit while the job is not yet requeued) and read
this file after: written before the requeue, it is there whenever squeue no
longer says so.
"""
from __future__ import annotations

from ..record import record
from .fields import Fields

# Slurm sends --signal up to 60 s before the time asked, and a checkpoint
# takes a while: a signal this much nearer than the margin is the limit's,
# and a request made for the limit came at most this much before the margin.
SIGNAL_SLACK = 120

# Who decided: the two writers above.
BY_RANK = "rank 0"
BY_NODE = "node hook"          # for rank 0 without scontrol (client/early.watch_for_asked)
BY_EPILOG = "epilog-slurmctld"
TIMELIMIT_BY = (BY_RANK, BY_NODE, BY_EPILOG)


@record
class TimeLimitRecord:
    """The run of epoch `epoch` stops for its time limit, decided at `at`
    (Unix seconds) by `by`, `left` seconds before the limit (None: not
    known, e.g. already reached), for a job whose margin is `margin` s."""

    epoch: str
    at: float
    by: str
    margin: int
    left: float | None = None
    why: str = ""

    LABEL = "time-limit record"

    def to_json(self) -> dict:
        out = {"epoch": self.epoch, "at": self.at, "by": self.by, "margin": self.margin, "why": self.why}
        if self.left is not None:
            out["left"] = self.left
        return out

    @classmethod
    def parse(cls, data, source: str = "") -> "TimeLimitRecord":
        f = Fields(cls.LABEL, data, source)
        f.only(("epoch", "at", "by", "margin", "left", "why"))
        by = f.get("by")
        if by not in TIMELIMIT_BY:
            raise f.bad("by", by, f"expected one of {', '.join(TIMELIMIT_BY)}")
        left = f.get("left", None)
        return cls(epoch=f.name("epoch", f.get("epoch"), "epoch"), at=f.number("at", f.get("at")), by=by,
                   margin=f.integer("margin", f.get("margin"), minimum=1, maximum=65535),
                   left=None if left is None else f.number("left", left), why=f.string("why", f.get("why", "")))
