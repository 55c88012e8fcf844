"""The inventory handle and the one Repository: every query slurm-snap makes
lives in this package, one module per concern, and nothing outside it
writes SQL or builds a select. Callers get a Repository inside
`Inventory.session()`, whose exit commits (or rolls back) one transaction.

  runs.py      job runs and volumes          (hooks, coordinator, repair)
  sets.py      snapshot sets, state machine  (coordinator, preemption, repair, prune)
  parts.py     acknowledgements and parts    (barrier, cut, verdict, prune)
  copies.py    node-local parts on other nodes (requeued run's Prolog, show, repair)
  drills.py    restore drills                (restore-test)
  events.py    the event log                 (every step; show)
  failures.py  failure counters              (set transitions; metrics)
  reports.py   report, show, metrics
  refusals.py  volumes a node Prolog refused (functions over a Repository)

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
from .copies import CopyQueries
from .drills import DrillQueries
from .events import EventQueries
from .failures import FailureQueries
from .parts import PartQueries
from .records import CopyRecord, SetFilter, SnapshotRecord  # noqa: F401 (re-exported)
from .reports import ReportQueries
from .runs import RunQueries
from .schedule import ScheduleQueries
from .sets import SetQueries


class Repository(RunQueries, SetQueries, PartQueries, CopyQueries, DrillQueries, EventQueries, FailureQueries,
                 ReportQueries, ScheduleQueries):
    def __init__(self, session: Session):
        self.s = session


class Inventory:
    """The inventory handle: an engine and a way to run one transaction."""

    def __init__(self, url: str, *, busy_timeout: float = 30.0):
        self.url = url
        self.busy_timeout = busy_timeout
        self.engine = db.make_engine(url, busy_timeout=busy_timeout)
        self._factory = db.session_factory(self.engine)
        self._read_factory = db.session_factory(self.engine.execution_options(slurm_snap_readonly=True))
        self._ready = False

    @classmethod
    def from_config(cls, cfg, command: str = "") -> "Inventory":
        if cfg.via_service:
            from ..errors import ControllerOnly

            raise ControllerOnly(command=command or "this command", url=cfg.inventory.url)
        return cls(cfg.inventory.url, busy_timeout=cfg.inventory.busy_timeout)

    def upgrade(self) -> str:
        """Create or migrate the schema: the only verb that may (db upgrade)."""
        engine = db.make_engine(self.url, busy_timeout=self.busy_timeout, create=True)
        try:
            return db.upgrade(engine)
        finally:
            engine.dispose()

    def revision(self) -> str | None:
        """The schema revision in the database (None: none); creates nothing."""
        db.check_ready_file(self.url)
        return db.current_revision(self.engine)

    @contextlib.contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Repository]:
        """One transaction. `readonly` sessions never wait behind a writer on
        SQLite (WAL readers see the last committed state)."""
        factory = self._read_factory if readonly else self._factory
        if not self._ready:
            # Once per handle (the hooks open one per run): a missing or
            # unmigrated inventory is named as such before any query fails on it.
            db.check_ready(self.engine, self.url)
            self._ready = True
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