"""The inventory handle and the one Repository: every query slurm-snap makes
lives in this package, one module per concern, and nothing outside it
writes SQL or builds a select. Callers get a Repository inside
`Inventory.session()`, whose exit commits (or rolls back) one transaction.

  runs.py      job runs and volumes          (hooks, coordinator, repair)
  sets.py      snapshot sets, state machine  (coordinator, preemption, repair, prune)
  parts.py     acknowledgements and parts    (barrier, cut, verdict, prune)
  drills.py    restore drills                (restore-test)
  events.py    the event log                 (every step; show)
  reports.py   report, show, metrics

Batch verbs take lists (acks, snapshots, volumes) so a 1,000-node set costs
one transaction, not one fsync'd transaction per node. Tests call the same
verbs; seeding helpers for tests and benchmarks live in tests/.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from ..errors import InventoryError
from . import db
from .drills import DrillQueries
from .events import EventQueries
from .parts import PartQueries
from .records import AckRecord, SetFilter, SnapshotRecord, VolumeSpec  # noqa: F401 (re-exported)
from .reports import ReportQueries
from .runs import RunQueries
from .sets import SetQueries


class Repository(RunQueries, SetQueries, PartQueries, DrillQueries, EventQueries, ReportQueries):
    def __init__(self, session: Session):
        self.s = session


class Inventory:
    """The inventory handle: an engine and a way to run one transaction."""

    def __init__(self, url: str, *, busy_timeout: float = 30.0):
        self.url = url
        self.engine = db.make_engine(url, busy_timeout=busy_timeout)
        self._factory = db.session_factory(self.engine)
        self._read_factory = db.session_factory(self.engine.execution_options(slurm_snap_readonly=True))

    @classmethod
    def from_config(cls, cfg) -> "Inventory":
        if cfg.via_service:
            from ..errors import ServiceUnavailable

            raise ServiceUnavailable(
                why=f"this host reaches the inventory only through the slurm-snap service ({cfg.inventory.url}), "
                    "which runs report, show, snapshot and restore-test for users and the hooks' recording; "
                    "run anything else on the controller")
        return cls(cfg.inventory.url, busy_timeout=cfg.inventory.busy_timeout)

    def upgrade(self) -> str:
        return db.upgrade(self.engine)

    @contextlib.contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Repository]:
        """One transaction. `readonly` sessions never wait behind a writer on
        SQLite (WAL readers see the last committed state)."""
        factory = self._read_factory if readonly else self._factory
        try:
            with factory() as session, session.begin():
                yield Repository(session)
        except OperationalError as exc:
            raise InventoryError(url=db._redact(self.url), why=str(exc.orig).strip().splitlines()[0]) from None
        except DBAPIError as exc:
            if isinstance(exc, IntegrityError):
                raise
            raise InventoryError(url=db._redact(self.url), why=str(exc.orig).strip().splitlines()[0]) from None

    def dispose(self) -> None:
        self.engine.dispose()
