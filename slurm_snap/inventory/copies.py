"""Copies of node-local parts on other nodes (part_copy, migration 0010):
what a requeued run's Prolog brought where, and partner copies."""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from ..clock import utcnow
from .models import PartCopy
from .records import CopyRecord


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

    def mark_copies_lost(self, node: str, why: str) -> int:
        """Every OK copy on `node` is gone with it."""
        res = self.s.execute(update(PartCopy).where(PartCopy.node == node, PartCopy.state == "OK")
                             .values(state="LOST", error=why))
        return res.rowcount or 0
