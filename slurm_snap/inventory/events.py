"""The event log: what each step did and why it failed, per job and set
(`show` prints them as the set's timeline)."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..clock import utcnow
from .models import Event


class EventQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def event(self, kind: str, message: str, *, job_id: int | None = None, set_id: int | None = None,
              node: str = "", level: str = "info") -> None:
        self.s.add(Event(at=utcnow(), job_id=job_id, set_id=set_id, node=node, kind=kind, level=level,
                         message=message[:8000]))
        self.s.flush()

    def events(self, *, job_id: int | None = None, set_id: int | None = None, kind: str | None = None) -> list[Event]:
        q = select(Event)
        if job_id is not None:
            q = q.where(Event.job_id == job_id)
        if set_id is not None:
            q = q.where(Event.set_id == set_id)
        if kind is not None:
            q = q.where(Event.kind == kind)
        return list(self.s.scalars(q.order_by(Event.id)))
