"""Every query slurm-snap makes. Nothing outside this module writes SQL or
builds a select: callers get a Repository inside `Inventory.session()`, whose
exit commits (or rolls back) one transaction.

Batch verbs take lists (acks, snapshots, volumes) so a 1,000-node set costs
one transaction, not one fsync'd transaction per node.
"""
from __future__ import annotations

import contextlib
import datetime as dt
from typing import Any, Iterable, Iterator, Sequence

from sqlalchemy import Float, and_, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.sql.expression import ColumnElement

from ..clock import utcnow
from ..errors import InvalidTransition, InventoryError, NotFound
from .. import states as S
from . import db
from .records import AckRecord, SetFilter, SnapshotRecord, VolumeSpec  # noqa: F401 (re-exported)
from .models import BarrierAck, Event, JobRun, RestoreTest, Snapshot, SnapshotSet, Volume


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


class Repository:
    def __init__(self, session: Session):
        self.s = session

    # ---- job runs and volumes -------------------------------------------------
    def record_job_run(self, *, job_id: int, restart_count: int, user_name: str, uid: int,
                       partition: str = "", nodes: Sequence[str] = (), options: dict | None = None) -> JobRun:
        """Idempotent: Slurm may run a hook twice; the second call updates in place."""
        run = self.s.scalar(select(JobRun).where(JobRun.job_id == job_id, JobRun.restart_count == restart_count))
        if run is None:
            run = JobRun(job_id=job_id, restart_count=restart_count, user_name=user_name, uid=uid,
                         partition=partition, nodes=list(nodes), options=dict(options or {}), created_at=utcnow())
            self.s.add(run)
        else:
            run.nodes = sorted(set(run.nodes) | set(nodes)) if nodes else run.nodes
            if options:
                run.options = {**run.options, **options}
            if partition:
                run.partition = partition
        self.s.flush()
        return run

    def add_volumes(self, run: JobRun, specs: Iterable[VolumeSpec], *, prepared: bool = False) -> list[Volume]:
        existing = {(v.path, v.node): v for v in self.s.scalars(select(Volume).where(Volume.job_run_id == run.id))}
        out = []
        now = utcnow()
        for spec in specs:
            vol = existing.get((spec.path, spec.node))
            if vol is None:
                vol = Volume(job_run_id=run.id, path=spec.path, scope=spec.scope, node=spec.node,
                             volume_class=spec.volume_class, backend=spec.backend, site=spec.site,
                             region=spec.region, created_at=now)
                self.s.add(vol)
                existing[(spec.path, spec.node)] = vol
            if prepared and vol.prepared_at is None:
                vol.prepared_at = now
            out.append(vol)
        self.s.flush()
        return out

    def job_run(self, job_id: int, restart_count: int | None = None) -> JobRun:
        q = select(JobRun).where(JobRun.job_id == job_id)
        if restart_count is not None:
            q = q.where(JobRun.restart_count == restart_count)
        run = self.s.scalar(q.order_by(JobRun.restart_count.desc()).limit(1))
        if run is None:
            label = job_id if restart_count is None else f"{job_id}.{restart_count}"
            raise NotFound(what="job", value=str(label))
        return run

    def find_job_run(self, job_id: int, restart_count: int | None = None) -> JobRun | None:
        try:
            return self.job_run(job_id, restart_count)
        except NotFound:
            return None

    def volumes(self, run: JobRun) -> list[Volume]:
        return list(self.s.scalars(select(Volume).where(Volume.job_run_id == run.id).order_by(Volume.id)))

    # ---- snapshot sets --------------------------------------------------------
    def create_set(self, run: JobRun, *, epoch: str, trigger: str, wanted: str = "app",
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
            # Another node's hook created it between our select and insert.
            found = self.s.scalar(select(SnapshotSet).where(SnapshotSet.job_run_id == run.id,
                                                            SnapshotSet.epoch == epoch))
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

    def sets_of_job(self, job_id: int, restart_count: int | None = None) -> list[SnapshotSet]:
        q = select(SnapshotSet).where(SnapshotSet.job_id == job_id)
        if restart_count is not None:
            q = q.join(JobRun).where(JobRun.restart_count == restart_count)
        return list(self.s.scalars(q.order_by(SnapshotSet.id)))

    def transition(self, set_id: int, new: str, *, at: dt.datetime | None = None, **fields: Any) -> SnapshotSet:
        """Move a set along the state machine, stamping the phase time.

        Row-locked (FOR UPDATE on servers; SQLite's BEGIN IMMEDIATE already
        serializes writers) so two finalizers cannot both win.
        """
        st = self.get_set(set_id, lock=True)
        if not S.allowed(st.state, new):
            raise InvalidTransition(set_id=set_id, old=st.state, new=new)
        st.state = new
        stamp = _PHASE_STAMP.get(new)
        if stamp and getattr(st, stamp) is None:
            setattr(st, stamp, at or utcnow())
        for key, value in fields.items():
            if not hasattr(SnapshotSet, key):
                raise AttributeError(key)
            setattr(st, key, value)
        self.s.flush()
        return st

    def update_set(self, set_id: int, **fields: Any) -> SnapshotSet:
        """Set fields that are not state (barrier time, skew, reason)."""
        if "state" in fields:
            raise ValueError("use transition() to change state")
        st = self.get_set(set_id, lock=True)
        for key, value in fields.items():
            if not hasattr(SnapshotSet, key):
                raise AttributeError(key)
            setattr(st, key, value)
        self.s.flush()
        return st

    def active_sets(self, *, job_run_id: int | None = None, volume_paths: Sequence[str] = ()) -> list[SnapshotSet]:
        """Sets still in flight, for serializing concurrent requests and for repair."""
        q = select(SnapshotSet).where(SnapshotSet.state.in_(S.ACTIVE))
        if job_run_id is not None:
            q = q.where(SnapshotSet.job_run_id == job_run_id)
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

    # ---- acknowledgements and snapshots --------------------------------------
    def acks(self, set_id: int) -> list[BarrierAck]:
        return list(self.s.scalars(select(BarrierAck).where(BarrierAck.set_id == set_id)
                                   .order_by(BarrierAck.node, BarrierAck.rank)))

    def snapshots(self, set_id: int, *, include_deleted: bool = False) -> list[Snapshot]:
        q = select(Snapshot).where(Snapshot.set_id == set_id)
        if not include_deleted:
            q = q.where(Snapshot.state != "DELETED")
        return list(self.s.scalars(q.options(selectinload(Snapshot.volume)).order_by(Snapshot.id)))

    def set_snapshot_state(self, snapshot_id: int, state: str, error: str = "") -> None:
        self.s.execute(update(Snapshot).where(Snapshot.id == snapshot_id).values(state=state, error=error))

    def snapshots_sharing(self, shared_key: str, *, since: dt.datetime) -> list[Snapshot]:
        return list(self.s.scalars(select(Snapshot).where(Snapshot.shared_key == shared_key,
                                                          Snapshot.cut_at >= since,
                                                          Snapshot.state == "CUT")))

    def snapshot_refs_in_use(self, backend: str, ref: str, *, excluding_set: int) -> int:
        return self.s.scalar(select(func.count()).select_from(Snapshot).where(
            Snapshot.backend == backend, Snapshot.ref == ref, Snapshot.set_id != excluding_set,
            Snapshot.state == "CUT")) or 0

    # ---- restore drills -------------------------------------------------------
    def start_restore_test(self, set_id: int, command: str, target: str) -> RestoreTest:
        rt = RestoreTest(set_id=set_id, command=command, target=target, result="RUNNING", started_at=utcnow())
        self.s.add(rt)
        self.s.flush()
        return rt

    def finish_restore_test(self, test_id: int, *, passed: bool, first_step: int | None,
                            time_to_first_step: float | None, reason: str = "",
                            slurm_job_id: int | None = None) -> RestoreTest:
        rt = self.s.get(RestoreTest, test_id)
        if rt is None:
            raise NotFound(what="restore test", value=str(test_id))
        rt.result = "PASSED" if passed else "FAILED"
        rt.finished_at = utcnow()
        rt.first_step = first_step
        rt.time_to_first_step = time_to_first_step
        rt.reason = reason
        if slurm_job_id is not None:
            rt.slurm_job_id = slurm_job_id
        self.s.flush()
        return rt

    def restore_tests(self, set_id: int) -> list[RestoreTest]:
        return list(self.s.scalars(select(RestoreTest).where(RestoreTest.set_id == set_id)
                                   .order_by(RestoreTest.id)))

    # ---- events -----------------------------------------------------------------
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

    # ---- report queries -------------------------------------------------------
    def query_sets(self, f: SetFilter) -> list[SnapshotSet]:
        q = select(SnapshotSet).join(JobRun)
        conds = _set_filter_conds(f)
        q = q.where(*conds).order_by(SnapshotSet.requested_at, SnapshotSet.id)
        if f.limit:
            q = q.limit(f.limit)
        return list(self.s.scalars(q.options(selectinload(SnapshotSet.job_run))))

    def newest_verified_by_job(self, job_ids: Sequence[int]) -> dict[int, dt.datetime]:
        """Cut time of the newest VERIFIED set per job: the base of RPO."""
        if not job_ids:
            return {}
        rows = self.s.execute(select(SnapshotSet.job_id, func.max(SnapshotSet.cut_done_at))
                              .where(SnapshotSet.job_id.in_(list(job_ids)), SnapshotSet.state == S.VERIFIED)
                              .group_by(SnapshotSet.job_id))
        return {jid: _aware(t) for jid, t in rows if t is not None}

    def newest_verified_by_user(self) -> dict[str, dt.datetime]:
        rows = self.s.execute(select(SnapshotSet.user_name, func.max(SnapshotSet.cut_done_at))
                              .where(SnapshotSet.state == S.VERIFIED).group_by(SnapshotSet.user_name))
        return {u: _aware(t) for u, t in rows if t is not None}

    def count_sets_by(self) -> list[tuple[str, str, int]]:
        rows = self.s.execute(select(SnapshotSet.state, SnapshotSet.consistency, func.count())
                              .group_by(SnapshotSet.state, SnapshotSet.consistency))
        return [(a, b, n) for a, b, n in rows]

    def failure_reasons(self) -> list[tuple[str, int]]:
        rows = self.s.execute(select(SnapshotSet.reason, func.count())
                              .where(SnapshotSet.state.in_((S.FAILED, S.PARTIAL, S.FAILED_RESTORE, S.ROLLED_BACK)))
                              .group_by(SnapshotSet.reason))
        return [(r or "unknown", n) for r, n in rows]

    # ---- retention ---------------------------------------------------------------
    def sets_for_retention(self, job_id: int | None = None, user: str | None = None) -> list[SnapshotSet]:
        q = select(SnapshotSet).where(SnapshotSet.state != S.DELETED)
        if job_id is not None:
            q = q.where(SnapshotSet.job_id == job_id)
        if user is not None:
            q = q.where(SnapshotSet.user_name == user)
        return list(self.s.scalars(q.order_by(SnapshotSet.job_id, SnapshotSet.requested_at)))


    # ---- restore ----------------------------------------------------------------
    def drillable_set(self, job_id: int) -> SnapshotSet | None:
        """Newest set of the job a restore drill may use: restorable and app- or crash-consistent."""
        q = select(SnapshotSet).where(SnapshotSet.job_id == job_id,
                                      SnapshotSet.state.in_(tuple(S.RESTORABLE)),
                                      SnapshotSet.consistency.in_((S.APP, S.CRASH)))
        return self.s.scalar(q.order_by(SnapshotSet.requested_at.desc(), SnapshotSet.id.desc()).limit(1))

    def live_volume_paths(self) -> list[tuple[str, int]]:
        """(path, job_id) of every volume any job declared: restore targets must stay clear of them."""
        rows = self.s.execute(select(Volume.path, JobRun.job_id).join(JobRun, Volume.job_run_id == JobRun.id)
                              .distinct().order_by(Volume.path))
        return [(p, j) for p, j in rows]

    def restore_test(self, test_id: int) -> RestoreTest:
        rt = self.s.get(RestoreTest, test_id)
        if rt is None:
            raise NotFound(what="restore test", value=str(test_id))
        return rt

    def running_restore_tests(self, set_id: int | None = None) -> list[RestoreTest]:
        q = select(RestoreTest).where(RestoreTest.result == "RUNNING")
        if set_id is not None:
            q = q.where(RestoreTest.set_id == set_id)
        return list(self.s.scalars(q.order_by(RestoreTest.id)))

    def set_restore_test_job(self, test_id: int, slurm_job_id: int) -> None:
        self.restore_test(test_id).slurm_job_id = slurm_job_id
        self.s.flush()

    def set_restore_test_target(self, test_id: int, target: str) -> None:
        self.restore_test(test_id).target = target
        self.s.flush()
    # ---- report ------------------------------------------------------------------
    # report/show/metrics read through these; they select plain columns (no ORM
    # objects) so a window of many thousand sets costs one indexed scan.
    def report_set_rows(self, f: SetFilter, *, with_parts: bool = True) -> Iterator[Any]:
        """Sets matching `f`, oldest request first, as row mappings.

        Fetched in chunks (yield_per) so the driver does not buffer the whole
        result on top of what the caller keeps.
        """
        cols = [SnapshotSet.id.label("set_id"), SnapshotSet.job_id, JobRun.restart_count,
                SnapshotSet.user_name, JobRun.partition, JobRun.nodes, SnapshotSet.epoch, SnapshotSet.trigger,
                SnapshotSet.wanted, SnapshotSet.consistency, SnapshotSet.state, SnapshotSet.reason,
                SnapshotSet.requested_at, SnapshotSet.signalled_at, SnapshotSet.barrier_at,
                SnapshotSet.cut_started_at, SnapshotSet.cut_done_at, SnapshotSet.finished_at,
                SnapshotSet.verified_at, SnapshotSet.skew_seconds, SnapshotSet.checkpoint_step,
                SnapshotSet.manifest_ok, SnapshotSet.expected_parts, SnapshotSet.failed_nodes]
        if with_parts:
            # Parts that were cut (a MISSING part records a failure, not a volume cut).
            cols.append(select(func.count()).select_from(Snapshot)
                        .where(Snapshot.set_id == SnapshotSet.id, Snapshot.state != "MISSING")
                        .correlate(SnapshotSet).scalar_subquery().label("parts"))
        q = select(*cols).join(JobRun, JobRun.id == SnapshotSet.job_run_id).where(*_set_filter_conds(f))
        q = q.order_by(SnapshotSet.requested_at, SnapshotSet.id)
        if f.limit:
            q = q.limit(f.limit)
        yield from self.s.execute(q.execution_options(yield_per=2000)).mappings()

    def report_snapshot_rows(self, set_ids: Sequence[int]) -> list[Any]:
        """Every part of the given sets (deleted ones too: report is a record)."""
        out: list[Any] = []
        ids = list(set_ids)
        for i in range(0, len(ids), _IN_CHUNK):
            q = (select(Snapshot.id.label("snapshot_id"), Snapshot.set_id, Snapshot.node, Snapshot.backend,
                        Snapshot.name, Snapshot.ref, Snapshot.path, Snapshot.state, Snapshot.cut_started_at,
                        Snapshot.cut_at, Snapshot.site, Snapshot.region, Snapshot.manifest_ok, Snapshot.error,
                        Volume.path.label("volume_path"), Volume.volume_class, Volume.scope)
                 .join(Volume, Volume.id == Snapshot.volume_id)
                 .where(Snapshot.set_id.in_(ids[i:i + _IN_CHUNK]))
                 .order_by(Snapshot.set_id, Snapshot.id))
            out.extend(self.s.execute(q).mappings())
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

    def report_phase_durations(self) -> dict[str, tuple[float, int]]:
        """Sum (seconds) and count of each phase over every set that went through it."""
        phases = {
            "signal": (SnapshotSet.requested_at, SnapshotSet.signalled_at),
            "quiesce": (SnapshotSet.signalled_at, SnapshotSet.barrier_at),
            "cut": (SnapshotSet.cut_started_at, SnapshotSet.cut_done_at),
            "finalize": (SnapshotSet.cut_done_at, SnapshotSet.finished_at),
            "total": (SnapshotSet.requested_at, SnapshotSet.finished_at),
        }
        # One scan for every phase: a difference with a NULL end is NULL, which
        # sum() and count(expr) both skip.
        cols = []
        for start, end in phases.values():
            diff = _SecondsBetween(start, end)
            cols += [func.sum(diff), func.count(diff)]
        row = self.s.execute(select(*cols).select_from(SnapshotSet)).one()
        return {name: (float(row[2 * i] or 0.0), int(row[2 * i + 1] or 0)) for i, name in enumerate(phases)}

    def report_restore_first_step(self) -> tuple[float, int]:
        """Sum and count of time_to_first_step over passed restore drills."""
        total, n = self.s.execute(select(func.sum(RestoreTest.time_to_first_step), func.count())
                                  .where(RestoreTest.result == "PASSED",
                                         RestoreTest.time_to_first_step.is_not(None))).one()
        return float(total or 0.0), int(n or 0)

    def report_bulk_seed(self, table: str, rows: Sequence[dict]) -> None:
        """Insert many rows in one executemany: for benchmarks and test data only,
        never for the product's own writes (those go through the verbs above)."""
        model = {"job_run": JobRun, "snapshot_set": SnapshotSet, "snapshot": Snapshot, "volume": Volume}[table]
        if rows:
            self.s.execute(model.__table__.insert(), list(rows))


    # ---- protocol ----------------------------------------------------------------
    # Queries of the snapshot protocol (slurm_snap/protocol): the coordinator, the
    # preemption hooks and repair. Bulk inserts go through Core executemany: a
    # 1,000-node set is one statement per table, not 1,000 ORM flushes.
    def lock_job_run(self, run_id: int) -> JobRun:
        """Row-lock a job run (FOR UPDATE on servers; SQLite's BEGIN IMMEDIATE
        already serializes writers) so two requests cannot both pass the
        'nothing in flight' check."""
        run = self.s.scalar(select(JobRun).where(JobRun.id == run_id).with_for_update())
        if run is None:
            raise NotFound(what="job run", value=str(run_id))
        return run

    def preempted_run(self, job_id: int, restart_count: int) -> JobRun | None:
        """The newest run of `job_id` with restart_count <= the given one.

        In the epilogs of a preempted run SLURM_JOB_RESTART_COUNT is already
        incremented, while the requeued run's Prolog has not recorded a row
        yet: the run that was preempted is the newest one not above it.
        """
        return self.s.scalar(select(JobRun).where(JobRun.job_id == job_id, JobRun.restart_count <= restart_count)
                             .order_by(JobRun.restart_count.desc()).limit(1))

    def open_preempt_run(self, job_id: int, max_restart_count: int) -> JobRun | None:
        """The newest run (restart_count <= the given one) whose own preemption
        set, `preempt-<its restart count>`, is still in flight."""
        rows = self.s.execute(select(JobRun, SnapshotSet.epoch).join(SnapshotSet, SnapshotSet.job_run_id == JobRun.id)
                              .where(JobRun.job_id == job_id, JobRun.restart_count <= max_restart_count,
                                     SnapshotSet.trigger == "preempt", SnapshotSet.state.in_(S.ACTIVE))
                              .order_by(JobRun.restart_count.desc()))
        for run, epoch in rows:
            if epoch == f"preempt-{run.restart_count}":
                return run
        return None

    def record_acks(self, set_id: int, acks: Sequence[AckRecord], *,
                    replace: Sequence[tuple[str, int]] | None = None, replace_all: bool = False) -> int:
        """Insert acknowledgements not yet recorded, each with the time it was
        first seen (`seen_at`, the reader's clock; now when None); one
        statement for all nodes. Re-reading the same files adds nothing.

        `replace` names (node, rank) rows to drop first (a rank rewrote its
        acknowledgement); `replace_all` drops every row of the set first."""
        if replace_all:
            self.s.execute(delete(BarrierAck).where(BarrierAck.set_id == set_id))
        elif replace:
            self.s.execute(delete(BarrierAck).where(BarrierAck.set_id == set_id,
                                                    tuple_(BarrierAck.node, BarrierAck.rank).in_(list(replace))))
        q = select(BarrierAck.node, BarrierAck.rank).where(BarrierAck.set_id == set_id)
        nodes = {a.node for a in acks}
        if len(nodes) <= 256:
            # A late batch of a few nodes need not read back the rows of all the others.
            q = q.where(BarrierAck.node.in_(sorted(nodes)))
        have = set(self.s.execute(q)) if nodes else set()
        now = utcnow()
        rows = []
        for a in acks:
            if (a.node, a.rank) in have:
                continue
            have.add((a.node, a.rank))
            rows.append(dict(set_id=set_id, node=a.node, rank=a.rank, local_rank=a.local_rank,
                             local_size=a.local_size, step=a.step, written_at=a.written_at,
                             received_at=a.seen_at or now, manifest=list(a.manifest), world_size=a.world_size,
                             independent=bool(a.independent), agreement=a.agreement[:255]))
        if rows:
            # The table, not the mapped class: plain Core executemany skips the
            # ORM bulk machinery (about 3x faster for 1,000 rows).
            self.s.execute(insert(BarrierAck.__table__), rows)
        return len(rows)

    def ack_records(self, set_id: int) -> list[AckRecord]:
        """The set's acknowledgements as the verdict reads them."""
        return [AckRecord(node=a.node, rank=a.rank, local_rank=a.local_rank, local_size=a.local_size, step=a.step,
                          written_at=a.written_at, seen_at=a.received_at, manifest=tuple(a.manifest or ()),
                          world_size=a.world_size, independent=bool(a.independent), agreement=a.agreement or "")
                for a in self.acks(set_id)]

    def record_parts(self, set_id: int, parts: Sequence[SnapshotRecord]) -> int:
        """Insert snapshot parts (cut: state CUT; failed: state MISSING with the
        error) not yet recorded for their volume; one statement. A part
        already recorded (a rerun) is kept as it is."""
        have = set(self.s.scalars(select(Snapshot.volume_id).where(Snapshot.set_id == set_id)))
        now = utcnow()
        rows = []
        for p in parts:
            if p.volume_id in have:
                continue
            have.add(p.volume_id)
            rows.append(dict(set_id=set_id, volume_id=p.volume_id, backend=p.backend, name=p.name, ref=p.ref,
                             path=p.path, node=p.node, state=p.state, cut_started_at=p.cut_started_at or now,
                             cut_at=p.cut_at or now, site=p.site, region=p.region, shared_key=p.shared_key,
                             manifest_ok=p.manifest_ok if p.ok else None, error=p.error[:2000]))
        if rows:
            self.s.execute(insert(Snapshot.__table__), rows)
        return len(rows)

    def volume_rows(self, run_id: int, *, scope: str | None = None) -> list:
        """A run's volumes as plain rows (id, path, scope, node, volume_class,
        backend, site, region, refusal): no ORM objects for a 1,000-node job."""
        q = select(Volume.id, Volume.path, Volume.scope, Volume.node, Volume.volume_class, Volume.backend,
                   Volume.site, Volume.region, Volume.refusal).where(Volume.job_run_id == run_id)
        if scope is not None:
            q = q.where(Volume.scope == scope)
        return list(self.s.execute(q.order_by(Volume.id)))

    def count_parts(self, set_id: int) -> int:
        return self.s.scalar(select(func.count()).select_from(Snapshot).where(Snapshot.set_id == set_id)) or 0

    def sets_in_states(self, states: Iterable[str]) -> list[SnapshotSet]:
        return list(self.s.scalars(select(SnapshotSet).where(SnapshotSet.state.in_(tuple(states)))
                                   .order_by(SnapshotSet.id)))

def _aware(t):
    if isinstance(t, str):  # SQLite aggregate bypasses the TypeDecorator
        t = dt.datetime.fromisoformat(t)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


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
    def from_config(cls, cfg) -> "Inventory":
        if cfg.via_service:
            from ..errors import ServiceUnavailable

            raise ServiceUnavailable(
                why=f"this host reaches the inventory only through the slurm-snap service ({cfg.inventory.url}), "
                    "which runs report, show, snapshot and restore-test for users and the hooks' recording; "
                    "run anything else on the controller")
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


# ---- report ------------------------------------------------------------------
# Largest IN list per statement: below SQLite's oldest bound-parameter limit (999).
_IN_CHUNK = 900


def _set_filter_conds(f: SetFilter) -> list:
    """SetFilter -> WHERE conditions; the caller joins JobRun (for restart_count)."""
    conds = []
    if f.job_ids or f.job_runs:
        alts = []
        if f.job_ids:
            alts.append(SnapshotSet.job_id.in_(list(f.job_ids)))
        for jid, rc in f.job_runs:
            alts.append(and_(SnapshotSet.job_id == jid, JobRun.restart_count == rc))
        conds.append(or_(*alts))
    if f.users:
        conds.append(SnapshotSet.user_name.in_(list(f.users)))
    if f.states:
        conds.append(SnapshotSet.state.in_(list(f.states)))
    if f.start is not None:
        conds.append(SnapshotSet.requested_at >= f.start)
    if f.end is not None:
        conds.append(SnapshotSet.requested_at <= f.end)
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
