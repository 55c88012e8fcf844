"""Copies of node-local parts on other nodes (part_copy, migration 0010):
what a requeued run's Prolog brought where, and partner copies."""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.orm import Session, selectinload

from .. import states as S
from ..clock import utcnow
from .models import PartCopy, Snapshot, SnapshotSet, Volume
from .records import CopyRecord

# A part whose partner copy failed this often is left for an operator (show
# lists each attempt); the runner does not retry it every minute forever.
PARTNER_ATTEMPTS = 3


class CopyQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def record_copies(self, set_id: int, copies: Sequence[CopyRecord]) -> int:
        """One statement for every copy (or failed attempt) of a set's parts."""
        if not copies:
            return 0
        now = utcnow()
        self.s.execute(insert(PartCopy), [
            {"snapshot_id": c.snapshot_id, "set_id": set_id, "node": c.node, "ref": c.ref, "path": c.path,
             "purpose": c.purpose, "for_restart": c.for_restart, "ranks": list(c.ranks),
             "source_node": c.source_node, "method": c.method, "bytes": c.bytes, "seconds": c.seconds,
             "state": c.state, "error": c.error, "created_at": now} for c in copies])
        return len(copies)

    def copies(self, set_id: int, *, states: Sequence[str] | None = None) -> list[PartCopy]:
        q = select(PartCopy).where(PartCopy.set_id == set_id)
        if states is not None:
            q = q.where(PartCopy.state.in_(tuple(states)))
        return list(self.s.scalars(q.order_by(PartCopy.id)))

    def set_copy_state(self, copy_id: int, state: str, error: str = "") -> None:
        self.s.execute(update(PartCopy).where(PartCopy.id == copy_id).values(state=state, error=error))

    def mark_copy_deleted(self, set_id: int, *, node: str, ref: str, purpose: str) -> int:
        """The OK copy of `ref` that `purpose` put on `node` is gone (a drill's,
        removed when the drill ended): it must no longer count as held."""
        res = self.s.execute(update(PartCopy).where(PartCopy.set_id == set_id, PartCopy.node == node,
                                                    PartCopy.ref == ref, PartCopy.purpose == purpose,
                                                    PartCopy.state == S.COPY_OK).values(state=S.COPY_DELETED))
        return res.rowcount or 0

    def mark_copies_lost(self, node: str, why: str) -> int:
        """Every OK copy on `node` is gone with it."""
        res = self.s.execute(update(PartCopy).where(PartCopy.node == node, PartCopy.state == S.COPY_OK)
                             .values(state=S.COPY_LOST, error=why))
        return res.rowcount or 0

    def parts_needing_partner(self, limit: int) -> list[Snapshot]:
        """Node-local CUT parts of restorable sets with no partner copy yet
        (and fewer than PARTNER_ATTEMPTS failed ones), oldest set first; rows
        come with their volume and set's run loaded."""
        ok = select(PartCopy.id).where(PartCopy.snapshot_id == Snapshot.id, PartCopy.purpose == "partner",
                                       PartCopy.state == S.COPY_OK).exists()
        failed = (select(func.count(PartCopy.id)).where(PartCopy.snapshot_id == Snapshot.id,
                                                        PartCopy.purpose == "partner", PartCopy.state == S.COPY_FAILED)
                  .scalar_subquery())
        q = (select(Snapshot).join(Volume, Volume.id == Snapshot.volume_id)
             .join(SnapshotSet, SnapshotSet.id == Snapshot.set_id)
             .where(Snapshot.state == S.PART_CUT, Volume.scope == "node-local",
                    SnapshotSet.state.in_(tuple(S.RESTORABLE)), ~ok, failed < PARTNER_ATTEMPTS)
             .options(selectinload(Snapshot.volume), selectinload(Snapshot.set).selectinload(SnapshotSet.job_run))
             .order_by(Snapshot.set_id, Snapshot.id).limit(limit))
        return list(self.s.scalars(q))

    def partner_parent(self, *, node: str, partner: str, volume_path: str, before_set: int) -> Snapshot | None:
        """The newest earlier part of the same volume path on `node` that is
        still there and has a partner copy on `partner`: what an incremental
        stream to `partner` can be taken against."""
        q = (select(Snapshot).join(Volume, Volume.id == Snapshot.volume_id)
             .join(PartCopy, and_(PartCopy.snapshot_id == Snapshot.id, PartCopy.node == partner,
                                  PartCopy.state == S.COPY_OK))
             .where(Snapshot.node == node, Snapshot.state == S.PART_CUT, Volume.path == volume_path,
                    Snapshot.set_id < before_set)
             .order_by(Snapshot.set_id.desc()).limit(1))
        return self.s.scalar(q)
