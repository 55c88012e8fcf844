"""Carry out retention decisions: delete sets' snapshots through their backends.

Each set goes DELETING (committed) -> every snapshot deleted through its
backend and marked DELETED (one commit per snapshot) -> DELETED. A prune
killed anywhere leaves the set in DELETING with some snapshots already
DELETED; the policy always selects DELETING sets, so the next prune finishes
exactly what is left (a snapshot the backend no longer has counts as deleted).
A snapshot another live set still references (whole-filesystem backends share
one snapshot between sets cut together) is only marked, never removed.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .. import errors, progress
from .. import states as S
from ..restore.parts import BackendFor, ref_from_row
from .policy import KEEP, Decision, Policy, SetSummary, decide


@dataclass
class PruneResult:
    deleted: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


def summary(st) -> SetSummary:
    cut = st.cut_done_at or st.cut_started_at or st.requested_at
    return SetSummary(id=st.id, job_id=st.job_id, cut_at=cut, state=st.state, consistency=st.consistency)


class Pruner:
    def __init__(self, inventory, backend_for: BackendFor, copy_backend=None):
        self.inv = inventory
        self.backend_for = backend_for
        # (volume class, node) -> backend on that node: for the set's copies
        # of node-local parts on other nodes (part_copy), deleted with it.
        self.copy_backend = copy_backend

    def plan(self, policy: Policy, now: Callable[[], dt.datetime], *, job_id: int | None = None,
             user: str | None = None) -> tuple[list[Decision], dict[int, object]]:
        """Decisions for the selected sets, and the set rows by id (for printing)."""
        with self.inv.session() as repo:
            sets = repo.sets_for_retention(job_id=job_id, user=user)
            drilled = {rt.set_id: rt.id for rt in repo.running_restore_tests()}
        decisions = decide([summary(st) for st in sets], policy, now)
        by_id = {st.id: st for st in sets}
        out = []
        for d in decisions:
            if d.delete and d.set_id in drilled and by_id[d.set_id].state != S.DELETING:
                d = Decision(d.set_id, d.job_id, KEEP, (f"restore test {drilled[d.set_id]} is running",))
            out.append(d)
        return out, by_id

    def apply(self, decisions: Iterable[Decision]) -> PruneResult:
        result = PruneResult()
        doomed = [d for d in decisions if d.delete]
        progress.phase("delete sets", total=len(doomed))
        for d in doomed:
            try:
                self.delete_set(d.set_id, why="; ".join(d.reasons))
                result.deleted.append(d.set_id)
            except errors.SnapError as exc:
                result.failed[d.set_id] = str(exc)
            progress.advance()
        return result

    def delete_set(self, set_id: int, *, why: str = "") -> None:
        with self.inv.session() as repo:
            st = repo.get_set(set_id, lock=True)
            if st.state == S.DELETED:
                return
            if st.state != S.DELETING:
                running = repo.running_restore_tests(set_id)
                if running:
                    raise errors.Busy(what="snapshot set", value=str(set_id),
                                      why=f"restore test {running[0].id} is running")
                repo.transition(set_id, S.DELETING)
                repo.event("prune", f"deleting set {set_id}: {why}", job_id=st.job_id, set_id=set_id)
            job_id = st.job_id
        with self.inv.session() as repo:
            snaps = repo.snapshots(set_id)
            copies = [(c.id, c.snapshot.volume.volume_class, c.node, c.snapshot.backend, c.snapshot.volume.path,
                       c.snapshot.name, c.ref, c.path) for c in repo.copies(set_id, states=(S.COPY_OK,))]
        failures = []
        for copy in copies:
            try:
                self._delete_copy(copy)
            except errors.SnapError as exc:
                failures.append(f"copy {copy[6]} on {copy[2]}: {exc}")
        for snap in snaps:
            if snap.state == S.PART_LOST:
                # Gone with its node or disk (repair): nothing to ask a backend.
                with self.inv.session() as repo:
                    repo.set_snapshot_state(snap.id, S.PART_DELETED, error=f"lost before prune: {snap.error}"[:4000])
                continue
            try:
                self._delete_snapshot(set_id, snap)
            except errors.SnapError as exc:
                failures.append(f"{snap.ref}: {exc}")
                with self.inv.session() as repo:
                    repo.set_snapshot_state(snap.id, "DELETING", error=str(exc)[:4000])
        if failures:
            with self.inv.session() as repo:
                repo.event("prune", f"set {set_id} stays DELETING: {'; '.join(failures)}",
                           job_id=job_id, set_id=set_id, level="error")
            raise errors.BackendError(backend="prune", why=f"set {set_id}: {'; '.join(failures)}")
        with self.inv.session() as repo:
            repo.transition(set_id, S.DELETED)
            repo.event("prune", f"set {set_id} deleted", job_id=job_id, set_id=set_id)

    def _delete_copy(self, copy) -> None:
        from ..backends.base import SnapshotRef

        copy_id, vclass, node, backend, volume, name, ref, path = copy
        if self.copy_backend is None:
            raise errors.ConfigError(path="prune", key="copies", why="no backend for copies on other nodes")
        self.copy_backend(vclass, node).delete(SnapshotRef(backend, volume, name, ref, path or None))
        with self.inv.session() as repo:
            repo.set_copy_state(copy_id, S.COPY_DELETED)

    def _delete_snapshot(self, set_id: int, snap) -> None:
        with self.inv.session() as repo:
            shared = repo.snapshot_refs_in_use(snap.backend, snap.ref, excluding_set=set_id)
        if not shared:
            # False (already gone) is fine: deleting is idempotent by contract.
            self.backend_for(snap).delete(ref_from_row(snap))
        with self.inv.session() as repo:
            repo.set_snapshot_state(snap.id, S.PART_DELETED,
                                    error="" if not shared else f"kept: still used by {shared} other set(s)")
