"""Failure counters: how many times a set went into FAILED, PARTIAL,
ROLLED_BACK or FAILED_RESTORE, per (state, reason class), since the inventory
was created.

Prometheus reads a counter that falls as a restart and adds the drop back, so
`slurm_snap_failures_total` cannot be a count of current rows: prune moves a
failed set to DELETED and a passing drill moves FAILED_RESTORE to VERIFIED.
These rows are only ever incremented, in the transaction of the state change
itself (sets.SetQueries.transition), so a counted failure is one that was
recorded and a rolled-back transition counts nothing.
"""
from __future__ import annotations

import re

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .. import states as S
from .models import Event, FailureCount

FAILURE_STATES = frozenset({S.FAILED, S.PARTIAL, S.ROLLED_BACK, S.FAILED_RESTORE})

# The kind of event a failing hook leaves (protocol.preempt's hook-failed op).
HOOK_FAILED = "hook-failed"

REASON_CLASS_MAX = 64
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_HEAD_END = re.compile(r"[:;(]")


def reason_class(reason: str) -> str:
    """The bounded label of a free-text reason: its head (before the first
    ':', ';' or '('), numbers replaced by N, at most 64 characters.

    Reasons carry ids and counts ("restore test 12: ...", "barrier incomplete
    after 60 s on 2 of 4 nodes (n1, n2)"); as labels those would make one
    series per set."""
    head = _HEAD_END.split(reason or "", 1)[0]
    head = " ".join(_NUMBER.sub("N", head).split())
    return (head or "unknown")[:REASON_CLASS_MAX]


class FailureQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def count_failure(self, state: str, reason: str) -> None:
        """Add one to the (state, reason class) counter.

        UPDATE ... SET count = count + 1 is atomic on every backend, so two
        sets failing for the same reason at once both count; the first
        failure of a class inserts, and an insert that lost the race to
        another transaction's becomes the update."""
        if state not in FAILURE_STATES:
            raise ValueError(f"{state!r} is not a failure state")
        key = (FailureCount.state == state, FailureCount.reason == reason_class(reason))
        bump = update(FailureCount).where(*key).values(count=FailureCount.count + 1)
        if self.s.execute(bump).rowcount:
            return
        try:
            with self.s.begin_nested():
                self.s.add(FailureCount(state=state, reason=reason_class(reason), count=1))
        except IntegrityError:
            self.s.execute(bump)

    def failure_counts(self) -> list[tuple[str, str, int]]:
        """(state, reason class, count), sorted."""
        rows = self.s.execute(select(FailureCount.state, FailureCount.reason, FailureCount.count)
                              .order_by(FailureCount.state, FailureCount.reason))
        return [(st, r, int(n)) for st, r, n in rows]

    def hook_failure_count(self) -> int:
        """Hooks that failed (the event log is append-only: nothing deletes an event)."""
        return int(self.s.scalar(select(func.count()).select_from(Event).where(Event.kind == HOOK_FAILED)) or 0)
