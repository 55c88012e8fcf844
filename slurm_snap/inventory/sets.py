"""Snapshot sets and their state machine: created, moved along the table in
slurm_snap/states.py (nothing else changes a set's state), found again."""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterable, Sequence

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..clock import utcnow
from ..errors import InvalidTransition, NotFound
from .. import states as S
from .failures import FAILURE_STATES
from .models import JobRun, SnapshotSet, Volume


# Which timestamp column a state change stamps.
_PHASE_STAMP = {
    S.QUIESCING: "signalled_at",
    S.CUTTING: "cut_started_at",
    S.CUT: "cut_done_at",
    S.COMPLETE: "finished_at",
    S.PARTIAL: "finished_at",
    S.FAILED: "finished_at",
    S.ROLLED_BACK: "finished_at",
    S.VERIFIED: "verified_at",
}


class SetQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def create_set(self, run: JobRun, *, epoch: str, trigger: str, wanted: str = S.WANT_APP,
                   deadline: dt.datetime | None = None, owner: str = "",
                   requested_at: dt.datetime | None = None) -> tuple[SnapshotSet, bool]:
        """Get or create the set of (job run, epoch). Returns (set, created).

        Idempotent so that every node's Epilog at preemption can call it and
        all land in the same set.
        """
        found = self.s.scalar(select(SnapshotSet).where(SnapshotSet.job_run_id == run.id,
                                                        SnapshotSet.epoch == epoch))
        if found is not None:
            return found, False
        nvol = self.s.scalar(select(func.count()).select_from(Volume).where(Volume.job_run_id == run.id)) or 0
        st = SnapshotSet(job_run_id=run.id, job_id=run.job_id, user_name=run.user_name, epoch=epoch,
                         trigger=trigger, wanted=wanted, consistency=S.NONE, state=S.PENDING, owner=owner,
                         deadline=deadline, requested_at=requested_at or utcnow(), expected_parts=nvol,
                         failed_nodes=[])
        try:
            with self.s.begin_nested():
                self.s.add(st)
        except IntegrityError:
            # Another node's hook created it between our select and insert;
            # its transaction has committed (our insert waited on its key).
            found = self.s.scalar(select(SnapshotSet).where(SnapshotSet.job_run_id == run.id,
                                                            SnapshotSet.epoch == epoch))
            if found is None:
                raise
            return found, False
        return st, True

    def get_set(self, set_id: int, *, lock: bool = False) -> SnapshotSet:
        q = select(SnapshotSet).where(SnapshotSet.id == set_id)
        if lock:
            q = q.with_for_update()
        st = self.s.scalar(q)
        if st is None:
            raise NotFound(what="snapshot set", value=str(set_id))
        return st

    def transition(self, set_id: int, new: str, *, at: dt.datetime | None = None, late: bool = False,
                   **fields: Any) -> SnapshotSet:
        """Move a set along the state machine, stamping the phase time.

        Row-locked (FOR UPDATE on servers; SQLite's BEGIN IMMEDIATE already
        serializes writers) so two finalizers cannot both win. A move into a
        failure state counts in the same transaction (failures.py): the
        counter and the set cannot disagree. `late`: a late part's delivery,
        the one caller that may take states.LATE_JOIN's edges.
        """
        st = self.get_set(set_id, lock=True)
        if not S.allowed(st.state, new, late=late):
            raise InvalidTransition(set_id=set_id, old=st.state, new=new)
        if "consistency" in fields or new in S.NOT_A_POINT:
            # The one place the two labels are written (states.labels_for): a
            # set that is no restore point never shows "app-consistent".
            earned = fields.pop("consistency", None)
            if earned is None:
                earned = st.parts_consistency if st.state in S.NOT_A_POINT else st.consistency
            fields["consistency"], fields["parts_consistency"] = S.labels_for(new, earned)
        st.state = new
        stamp = _PHASE_STAMP.get(new)
        if stamp and getattr(st, stamp) is None:
            setattr(st, stamp, at or utcnow())
        st = self._set_fields(st, fields)
        if new in FAILURE_STATES:
            self.count_failure(new, st.reason)
        return st

    def update_set(self, set_id: int, **fields: Any) -> SnapshotSet:
        """Set fields that are not state (barrier time, skew, reason)."""
        if "state" in fields:
            raise ValueError("use transition() to change state")
        return self._set_fields(self.get_set(set_id, lock=True), fields)

    def _set_fields(self, st: SnapshotSet, fields: dict[str, Any]) -> SnapshotSet:
        for key, value in fields.items():
            if not hasattr(SnapshotSet, key):  # a typo must not become a silent new attribute
                raise AttributeError(key)
            setattr(st, key, value)
        self.s.flush()
        return st

    def active_sets(self, *, job_run_id: int | None = None, volume_paths: Sequence[str] = (),
                    job_id: int | None = None) -> list[SnapshotSet]:
        """Sets still in flight, for serializing concurrent requests and for repair."""
        q = select(SnapshotSet).where(SnapshotSet.state.in_(S.ACTIVE))
        if job_run_id is not None:
            q = q.where(SnapshotSet.job_run_id == job_run_id)
        if job_id is not None:
            q = q.where(SnapshotSet.job_id == job_id)
        if volume_paths:
            q = q.join(Volume, Volume.job_run_id == SnapshotSet.job_run_id).where(Volume.path.in_(volume_paths))
        return list(self.s.scalars(q.order_by(SnapshotSet.id)).unique())

    def newest_set(self, job_id: int, *, consistency: str | None = S.APP,
                   states: Iterable[str] = S.RESTORABLE, verified_only: bool = False) -> SnapshotSet | None:
        q = select(SnapshotSet).where(SnapshotSet.job_id == job_id,
                                      SnapshotSet.state.in_(tuple(states)))
        if consistency:
            q = q.where(SnapshotSet.consistency == consistency)
        if verified_only:
            q = q.where(SnapshotSet.state == S.VERIFIED)
        return self.s.scalar(q.order_by(SnapshotSet.requested_at.desc(), SnapshotSet.id.desc()).limit(1))

    def sets_in_states(self, states: Iterable[str]) -> list[SnapshotSet]:
        return list(self.s.scalars(select(SnapshotSet).where(SnapshotSet.state.in_(tuple(states)))
                                   .order_by(SnapshotSet.id)))

    def sets_for_retention(self, job_id: int | None = None, user: str | None = None) -> list[SnapshotSet]:
        q = select(SnapshotSet).where(SnapshotSet.state != S.DELETED)
        if job_id is not None:
            q = q.where(SnapshotSet.job_id == job_id)
        if user is not None:
            q = q.where(SnapshotSet.user_name == user)
        return list(self.s.scalars(q.order_by(SnapshotSet.job_id, SnapshotSet.requested_at)))
