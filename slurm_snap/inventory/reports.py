"""What report, show and metrics read. They select plain columns (no ORM
objects) so a window of many thousand sets costs one indexed scan; the
counts and sums run in the database."""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterator, Sequence

from sqlalchemy import Float, and_, func, or_, select, type_coerce
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.sql.expression import ColumnElement
from sqlalchemy.types import NullType

from ..clock import aware
from ..errors import NotFound
from .. import states as S
from .models import Event, JobRun, PartCopy, RestoreTest, Snapshot, SnapshotSet, Volume
from .records import SetFilter


class ReportQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def report_set_rows(self, f: SetFilter, *, with_parts: bool = True,
                        keys: frozenset[str] | None = None) -> Iterator[Any]:
        """Sets matching `f`, oldest request first, as row mappings; with
        `keys`, only those columns (a narrow line need not fetch 28).

        Fetched in chunks (yield_per) so the driver does not buffer the whole
        result on top of what the caller keeps.
        """
        cols = [SnapshotSet.id.label("set_id"), SnapshotSet.job_id, JobRun.restart_count,
                SnapshotSet.user_name, JobRun.partition, JobRun.nodes, JobRun.snapshot_every, JobRun.sluid,
                SnapshotSet.epoch, SnapshotSet.trigger,
                SnapshotSet.wanted, SnapshotSet.consistency, SnapshotSet.parts_consistency, SnapshotSet.state,
                SnapshotSet.reason,
                SnapshotSet.requested_at, SnapshotSet.signalled_at, SnapshotSet.barrier_at,
                SnapshotSet.released_at, SnapshotSet.release, SnapshotSet.cut_started_at, SnapshotSet.cut_done_at, SnapshotSet.finished_at,
                SnapshotSet.verified_at, SnapshotSet.skew_seconds, SnapshotSet.checkpoint_step,
                SnapshotSet.manifest_ok, SnapshotSet.expected_parts, SnapshotSet.failed_nodes]
        if keys is not None:
            cols = [c for c in cols if c.key in keys]
            with_parts = with_parts and "parts" in keys
        if with_parts:
            # Parts that were cut (a MISSING part records a failure, not a volume cut).
            cols.append(select(func.count()).select_from(Snapshot)
                        .where(Snapshot.set_id == SnapshotSet.id, Snapshot.state != S.PART_MISSING)
                        .correlate(SnapshotSet).scalar_subquery().label("parts"))
        dialect = self.s.get_bind().dialect
        if dialect.name != "sqlite":
            # PostgreSQL's and MariaDB's drivers hand back times, floats and
            # JSON already converted: SQLAlchemy's processors add little there.
            for m in self.s.connection().execute(_set_query(select(*cols), f)).mappings():
                yield dict(m)
            return
        # SQLite hands back text: the driver's values, each converted by its
        # column type's own processor when first read (LazyRow). A window of
        # 10,000 sets reads a few of its 28 columns per line, and converting
        # all of them up front (9 times, 2 JSON documents) was most of
        # report's time on the controller's local inventory (issue 36).
        shape = _Shape([c.key for c in cols], [c.type.dialect_impl(dialect).result_processor(dialect, None)
                                               for c in cols])
        as_read = select(*(type_coerce(c, _DRIVER).label(c.key) for c in cols))
        # Through the session's connection: the ORM's row loading adds nothing to a Core select.
        for raw in self.s.connection().execute(_set_query(as_read, f)):
            yield LazyRow(raw, shape)

    def report_snapshot_rows(self, set_ids: Sequence[int]) -> list[Any]:
        """Every part of the given sets (deleted ones too: report is a record)."""
        out: list[Any] = []
        ids = list(set_ids)
        for i in range(0, len(ids), _IN_CHUNK):
            # Complete copies of the part on another node (part_copy): whether
            # the set survives the loss of the part's node.
            elsewhere = (select(func.count(PartCopy.id))
                         .where(PartCopy.snapshot_id == Snapshot.id, PartCopy.state == S.COPY_OK,
                                PartCopy.node != Snapshot.node)
                         .scalar_subquery())
            q = (select(Snapshot.id.label("snapshot_id"), Snapshot.set_id, Snapshot.node, Snapshot.backend,
                        Snapshot.name, Snapshot.ref, Snapshot.path, Snapshot.state, Snapshot.cut_started_at,
                        Snapshot.cut_at, Snapshot.site, Snapshot.region, Snapshot.manifest_ok, Snapshot.error,
                        Volume.path.label("volume_path"), Volume.volume_class, Volume.scope,
                        elsewhere.label("copies_elsewhere"))
                 .join(Volume, Volume.id == Snapshot.volume_id)
                 .where(Snapshot.set_id.in_(ids[i:i + _IN_CHUNK]))
                 .order_by(Snapshot.set_id, Snapshot.id))
            out.extend(self.s.execute(q).mappings())
        return out

    def report_drill_rows(self, set_ids: Sequence[int]) -> dict[int, Any]:
        """The newest finished drill of each given set: its result, where the
        program ran, the queue wait and the time to first step, apart."""
        out: dict[int, Any] = {}
        ids = list(set_ids)
        for i in range(0, len(ids), _IN_CHUNK):
            q = (select(RestoreTest.id.label("test_id"), RestoreTest.set_id, RestoreTest.result, RestoreTest.ran_on,
                        RestoreTest.queued_seconds, RestoreTest.time_to_first_step, RestoreTest.finished_at)
                 .where(RestoreTest.set_id.in_(ids[i:i + _IN_CHUNK]), RestoreTest.result != "RUNNING")
                 .order_by(RestoreTest.set_id, RestoreTest.id))
            for m in self.s.execute(q).mappings():
                out[m["set_id"]] = m   # the last one of its set is the newest
        return out

    def report_job_owners(self, job_ids: Sequence[int]) -> dict[int, set[str]]:
        """Owner names of the given jobs (every run), for the access check of -j."""
        owners: dict[int, set[str]] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), _IN_CHUNK):
            rows = self.s.execute(select(JobRun.job_id, JobRun.user_name)
                                  .where(JobRun.job_id.in_(ids[i:i + _IN_CHUNK])).distinct())
            for jid, user in rows:
                owners.setdefault(jid, set()).add(user)
        return owners

    def report_newest_verified(self, job_ids: Sequence[int]) -> dict[int, dt.datetime]:
        """newest_verified_by_job, chunked for long -j lists and wide windows."""
        out: dict[int, dt.datetime] = {}
        ids = list(job_ids)
        for i in range(0, len(ids), _IN_CHUNK):
            out.update(self.newest_verified_by_job(ids[i:i + _IN_CHUNK]))
        return out

    def newest_verified_by_job(self, job_ids: Sequence[int]) -> dict[int, dt.datetime]:
        """Cut time of the newest VERIFIED set per job: the base of RPO."""
        if not job_ids:
            return {}
        return self._newest_verified(SnapshotSet.job_id.in_(list(job_ids)))

    def report_newest_verified_in(self, f: SetFilter) -> dict[int, dt.datetime]:
        """newest_verified_by_job for the jobs of the sets matching `f`, in one
        statement: a window of 10,000 sets holds thousands of jobs, whose ids
        in chunks of 900 cost report half again its set query (issue 36)."""
        jobs = select(SnapshotSet.job_id).join(JobRun, JobRun.id == SnapshotSet.job_run_id).where(*filter_conds(f))
        return self._newest_verified(SnapshotSet.job_id.in_(jobs.scalar_subquery()))

    def _newest_verified(self, which) -> dict[int, dt.datetime]:
        rows = self.s.connection().execute(select(SnapshotSet.job_id, func.max(SnapshotSet.cut_done_at))
                                           .where(which, SnapshotSet.state == S.VERIFIED)
                                           .group_by(SnapshotSet.job_id)).all()
        return {jid: _aware(t) for jid, t in rows if t is not None}

    def report_newest_set(self, job_id: int, restart_count: int | None = None) -> SnapshotSet | None:
        """The newest set of a job (or of one run), whatever its state: what `show JOB` shows."""
        q = select(SnapshotSet).where(SnapshotSet.job_id == job_id)
        if restart_count is not None:
            q = q.join(JobRun, JobRun.id == SnapshotSet.job_run_id).where(JobRun.restart_count == restart_count)
        return self.s.scalar(q.order_by(SnapshotSet.requested_at.desc(), SnapshotSet.id.desc()).limit(1))

    def report_set_detail(self, set_id: int) -> SnapshotSet:
        """One set with its run, parts, acks and drills loaded, for `show`."""
        st = self.s.scalar(select(SnapshotSet).where(SnapshotSet.id == set_id).options(
            selectinload(SnapshotSet.job_run), selectinload(SnapshotSet.acks),
            selectinload(SnapshotSet.restore_tests),
            selectinload(SnapshotSet.snapshots).selectinload(Snapshot.volume)))
        if st is None:
            raise NotFound(what="snapshot set", value=str(set_id))
        return st

    def report_events(self, set_id: int, job_id: int) -> list[Event]:
        """Events of the set, and the job's events that name no set (hook failures)."""
        q = select(Event).where(or_(Event.set_id == set_id, and_(Event.job_id == job_id, Event.set_id.is_(None))))
        return list(self.s.scalars(q.order_by(Event.at, Event.id)))

    def report_job_rpo(self, since: dt.datetime) -> list[tuple[int, str, dt.datetime | None]]:
        """(job, user, newest verified cut or None) for jobs with a set requested since `since`.

        Two indexed steps (the window on requested_at, then the covering
        job/state/cut index) instead of grouping the whole table.
        """
        # De-duplicated here, not with DISTINCT: SQLite then prefers a full scan
        # of the job index over the range on requested_at (4 s vs 0.1 s at 1M sets).
        jobs = sorted(set(self.s.execute(select(SnapshotSet.job_id, SnapshotSet.user_name)
                                         .where(SnapshotSet.requested_at >= since))))
        newest = self.report_newest_verified(sorted({j for j, _ in jobs}))
        return [(jid, user, newest.get(jid)) for jid, user in jobs]

    def report_job_objectives(self, job_ids) -> dict[int, int]:
        """Job -> seconds between its newest run's periodic snapshots (its RPO
        objective), for the jobs among `job_ids` that take them."""
        out: dict[int, int] = {}
        ids = sorted(set(job_ids))
        for i in range(0, len(ids), 500):
            rows = self.s.execute(select(JobRun.job_id, JobRun.restart_count, JobRun.snapshot_every)
                                  .where(JobRun.job_id.in_(ids[i:i + 500]), JobRun.snapshot_every.is_not(None))
                                  .order_by(JobRun.job_id, JobRun.restart_count))
            for job_id, _rc, every in rows:
                out[job_id] = int(every)   # the newest run's wins
        return out

    def report_jobs_with_resume_cmd(self, job_ids) -> set[int]:
        """The jobs among `job_ids` whose newest run recorded a
        --snapshot-resume-cmd: the ones scheduled drills can verify."""
        out: set[int] = set()
        ids = sorted(set(job_ids))
        for i in range(0, len(ids), 500):
            newest: dict[int, dict] = {}
            rows = self.s.execute(select(JobRun.job_id, JobRun.restart_count, JobRun.options)
                                  .where(JobRun.job_id.in_(ids[i:i + 500]))
                                  .order_by(JobRun.job_id, JobRun.restart_count))
            for job_id, _rc, options in rows:
                newest[job_id] = options or {}   # the newest run's wins
            out.update(j for j, options in newest.items() if options.get("resume_cmd"))
        return out

    def report_phase_durations(self) -> dict[str, tuple[float, int]]:
        """Sum (seconds) and count of each phase over every set that went through it."""
        phases = {
            "signal": (SnapshotSet.requested_at, SnapshotSet.signalled_at),
            "quiesce": (SnapshotSet.signalled_at, SnapshotSet.barrier_at),
            "cut": (SnapshotSet.cut_started_at, SnapshotSet.cut_done_at),
            "finalize": (SnapshotSet.cut_done_at, SnapshotSet.finished_at),
            "total": (SnapshotSet.requested_at, SnapshotSet.finished_at),
            # A preemption's first signal -> its nodes given back (early or at GraceTime's end).
            "release": (SnapshotSet.requested_at, SnapshotSet.released_at),
        }
        # One scan for every phase: a difference with a NULL end is NULL, which
        # sum() and count(expr) both skip.
        cols = []
        for start, end in phases.values():
            diff = _SecondsBetween(start, end)
            cols += [func.sum(diff), func.count(diff)]
        row = self.s.execute(select(*cols).select_from(SnapshotSet)).one()
        return {name: (float(row[2 * i] or 0.0), int(row[2 * i + 1] or 0)) for i, name in enumerate(phases)}

    def preempt_checkpoint_times(self, since: dt.datetime, *, limit: int = 1000) -> dict[str, list[tuple[float, str]]]:
        """Per partition, each recent preemption's first signal -> last
        acknowledgement in seconds, with what its checkpoint earned (the
        parts' label: a PARTIAL set's missing part says nothing of the
        ranks' timing): what doctor sizes GraceTime from. Newest `limit`
        preemption sets since `since`."""
        rows = self.s.execute(select(JobRun.partition, SnapshotSet.requested_at, SnapshotSet.barrier_at,
                                     SnapshotSet.parts_consistency)
                              .join(JobRun, JobRun.id == SnapshotSet.job_run_id)
                              .where(SnapshotSet.trigger == "preempt", SnapshotSet.requested_at >= since,
                                     SnapshotSet.barrier_at.is_not(None))
                              .order_by(SnapshotSet.requested_at.desc()).limit(limit))
        out: dict[str, list[tuple[float, str]]] = {}
        for part, req, bar, label in rows:
            out.setdefault(part or "", []).append((max(0.0, (_aware(bar) - _aware(req)).total_seconds()), label))
        return out

    def report_restore_first_step(self) -> tuple[float, int]:
        """Sum and count of time_to_first_step over passed restore drills."""
        total, n = self.s.execute(select(func.sum(RestoreTest.time_to_first_step), func.count())
                                  .where(RestoreTest.result == "PASSED",
                                         RestoreTest.time_to_first_step.is_not(None))).one()
        return float(total or 0.0), int(n or 0)

    def count_sets_by(self) -> list[tuple[str, str, int]]:
        rows = self.s.execute(select(SnapshotSet.state, SnapshotSet.consistency, func.count())
                              .group_by(SnapshotSet.state, SnapshotSet.consistency))
        return [(a, b, n) for a, b, n in rows]

class LazyRow(dict):
    """A report row: a dict of the columns that need no conversion (read as
    plain dict lookups), and the others (times, JSON, booleans) converted by
    their column's own processor when first read (__missing__) and kept.
    It answers get/in/len/keys/items for every column of the row."""

    __slots__ = ("_raw", "_shape")

    def __init__(self, raw, shape: "_Shape"):
        super().__init__(zip(shape.plain_keys, shape.pick(raw)) if shape.plain_keys else ())
        self._raw, self._shape = raw, shape

    def __missing__(self, key: str):
        index, process = self._shape.converted[key]
        value = self._raw[index]
        if value is not None:
            value = process(value)
        self[key] = value
        return value

    def get(self, key, default=None):
        return self[key] if key in self._shape.index else default

    def __contains__(self, key) -> bool:
        return key in self._shape.index

    def __iter__(self):
        return iter(self._shape.index)

    def __len__(self) -> int:
        return len(self._shape.index)

    def keys(self):
        return self._shape.index.keys()

    def items(self):
        return [(k, self[k]) for k in self._shape.index]

    def values(self):
        return [self[k] for k in self._shape.index]


class _Shape:
    """Where each column of a report row is, and which need converting."""

    def __init__(self, keys: list[str], processors: list):
        from operator import itemgetter

        self.index = {k: i for i, k in enumerate(keys)}
        plain = [i for i, p in enumerate(processors) if p is None]
        self.plain_keys = [keys[i] for i in plain]
        self.pick = (itemgetter(*plain) if len(plain) > 1 else (lambda raw: (raw[plain[0]],))) if plain else None
        self.converted = {keys[i]: (i, p) for i, p in enumerate(processors) if p is not None}


def _set_query(q, f: SetFilter):
    """report_set_rows's select `q` over the sets matching `f`, oldest request first, in chunks."""
    q = q.join(JobRun, JobRun.id == SnapshotSet.job_run_id).where(*filter_conds(f))
    q = q.order_by(SnapshotSet.requested_at, SnapshotSet.id)
    if f.limit:
        q = q.limit(f.limit)
    return q.execution_options(yield_per=2000)


def _aware(t):
    if isinstance(t, str):  # SQLite aggregate bypasses the TypeDecorator
        t = dt.datetime.fromisoformat(t)
    return aware(t)


# No conversion in the result: LazyRow applies each column's own, when read.
_DRIVER = NullType()

# Largest IN list per statement: below SQLite's oldest bound-parameter limit (999).
_IN_CHUNK = 900


def filter_conds(f: SetFilter, *, job_id=SnapshotSet.job_id, user=SnapshotSet.user_name,
                 at=SnapshotSet.requested_at, state=SnapshotSet.state) -> list:
    """report's filter -> WHERE conditions, on a set's columns by default or on
    a run's (refusals.unprotected_runs: job_id, user_name, created_at and no
    state); the caller joins JobRun (for restart_count and partition)."""
    conds = []
    if f.job_ids or f.job_runs:
        alts = []
        if f.job_ids:
            alts.append(job_id.in_(list(f.job_ids)))
        for jid, rc in f.job_runs:
            alts.append(and_(job_id == jid, JobRun.restart_count == rc))
        conds.append(or_(*alts))
    if f.users:
        conds.append(user.in_(list(f.users)))
    if f.partitions:
        conds.append(JobRun.partition.in_(list(f.partitions)))
    if f.states and state is not None:
        conds.append(state.in_(list(f.states)))
    if f.start is not None:
        conds.append(at >= f.start)
    if f.end is not None:
        conds.append(at <= f.end)
    return conds


class _SecondsBetween(ColumnElement):
    """end - start in seconds as a float, on every supported database.

    Each dialect spells timestamp arithmetic differently; compiling one portable
    expression per dialect keeps the sum in the database instead of loading
    every set's timestamps into Python for the metrics scrape.
    """

    inherit_cache = True
    type = Float()

    def __init__(self, start, end):
        self.start = start
        self.end = end


@compiles(_SecondsBetween, "sqlite")
def _seconds_sqlite(el, compiler, **kw):
    # julianday() is a double of days: round to the millisecond so 5 s reads 5.0, not 4.99997.
    return (f"(round((julianday({compiler.process(el.end, **kw)}) - "
            f"julianday({compiler.process(el.start, **kw)})) * 86400000.0) / 1000.0)")


@compiles(_SecondsBetween, "postgresql")
def _seconds_pg(el, compiler, **kw):
    return f"EXTRACT(EPOCH FROM ({compiler.process(el.end, **kw)} - {compiler.process(el.start, **kw)}))"


@compiles(_SecondsBetween, "mysql")
@compiles(_SecondsBetween, "mariadb")
def _seconds_mysql(el, compiler, **kw):
    return (f"(TIMESTAMPDIFF(MICROSECOND, {compiler.process(el.start, **kw)}, "
            f"{compiler.process(el.end, **kw)}) / 1000000.0)")
