"""ack/early-<epoch>.decision (EarlyDecision): what rank 0 decided about
requeueing a preempted job early (client/early.py)."""
from __future__ import annotations


from ..record import record
from .fields import Fields


# What rank 0 may decide about giving the nodes back early (client/early.py).
EARLY_WAITED = "waited"          # not every rank acknowledged in time
EARLY_KEPT = "kept"              # Slurm shows no preemption, or the job may not be requeued
EARLY_REQUEUEING = "requeueing"  # the intent, written before scontrol requeue (which ends the job at once)
EARLY_REQUEUED = "requeued"
EARLY_FAILED = "failed"
# Rank 0 has no scontrol (a container): the node's slurm-snap hook, outside
# the container, decides and requeues (client/early.watch_for_asked).
EARLY_ASKED = "asked"
EARLY_DECISIONS = (EARLY_WAITED, EARLY_KEPT, EARLY_REQUEUEING, EARLY_REQUEUED, EARLY_FAILED, EARLY_ASKED)
# The decisions that mean "rank 0 requeued the job". "requeueing" is the intent
# it writes before calling scontrol requeue, which ends the job at once: left
# alone, rank 0 died inside the call (or scontrol, inside the job, died of the
# requeue's kill). Had slurmctld refused, scontrol would have exited non-zero
# and rank 0 written "failed"; the one other way to die there is Slurm's own
# kill at the end of GraceTime, and then the kill came within the call's time
# of `at` either way.
EARLY_RELEASED = (EARLY_REQUEUED, EARLY_REQUEUEING)


@record
class EarlyDecision:
    """ack/early-<epoch>.decision: what rank 0 decided about requeueing a
    preempted job early, and when (Unix seconds); the head node's Epilog
    records it with the set."""

    epoch: str
    decision: str
    at: float
    why: str = ""
    all_acknowledged_at: float | None = None

    LABEL = "early-release decision"

    @property
    def released(self) -> bool:
        return self.decision in EARLY_RELEASED

    def to_json(self) -> dict:
        out = {"epoch": self.epoch, "decision": self.decision, "at": self.at, "why": self.why}
        if self.all_acknowledged_at is not None:
            out["all_acknowledged_at"] = self.all_acknowledged_at
        return out

    @classmethod
    def parse(cls, data, source: str = "") -> "EarlyDecision":
        f = Fields(cls.LABEL, data, source)
        f.only(("epoch", "decision", "at", "why", "all_acknowledged_at"))
        decision = f.get("decision")
        if decision not in EARLY_DECISIONS:
            raise f.bad("decision", decision, f"expected one of {', '.join(EARLY_DECISIONS)}")
        seen_all = f.get("all_acknowledged_at", None)
        return cls(epoch=f.name("epoch", f.get("epoch"), "epoch"), decision=decision, at=f.number("at", f.get("at")),
                   why=f.string("why", f.get("why", "")),
                   all_acknowledged_at=None if seen_all is None else f.number("all_acknowledged_at", seen_all))
