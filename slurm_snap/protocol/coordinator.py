"""On-demand snapshot of a running job: request -> signal -> barrier -> cut ->
record -> finalize -> release.

    T1  check access, refuse a second set in flight for the job or its volumes,
        create the set (PENDING, owner host:pid, deadline)
        write request.json; ONE `scancel --signal` for all ranks;   T2 QUIESCING
        wait for every node's barrier (inotify on ack/, capped poll fallback)
    T3  record every ack in one transaction;                        CUTTING
        cut every volume on every node in parallel, verify manifests
    T4  record every part in one transaction;                       CUT
    T5  finalize (verdict.decide);                                  COMPLETE/PARTIAL/FAILED
        release/<epoch>, always (finally), so ranks never stay frozen

A crash anywhere leaves a non-terminal set with a dead owner that `repair`
labels; snapshot names are a function of (job, set, volume) so repair can
find any snapshot cut but not recorded.
"""
from __future__ import annotations

import datetime as dt
import enum
import gc
import logging
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..clock import utcnow
from .. import access
from ..config import Config
from ..errors import BadValueError, Busy, InvalidTransition, NotFound, SnapError
from ..jobdir import JobDir
from ..slurm import hooknames
from . import finalize, owner
from .ackledger import AckLedger
from .. import states as S
from .barrier import AckCollector, wait_for_barrier
from ..jobrecords import MAX_ACK_BYTES, ReleaseRecord, RequestRecord, VolumeRecord
from .cutter import CutPool, assign_manifests
from .verdict import judge

log = logging.getLogger(__name__)

Hook = Callable[[str], None]


def new_epoch() -> str:
    """A fresh token per request: an ack can only carry it after reading request.json."""
    return "s" + secrets.token_hex(8)


class Barrier(enum.StrEnum):
    """How an on-demand set's barrier ended: the typed fact `slurm-snap
    snapshot` picks its exit status from (never the reason's wording)."""

    NOT_ASKED = "not-asked"     # crash consistency: no signal, no barrier
    COMPLETE = "complete"       # every node's ranks acknowledged before the deadline
    # The deadline passed before every node's ranks acknowledged, or the
    # signal never reached them (then nobody is waited for). The set is still
    # cut and recorded with the label it earned.
    INCOMPLETE = "incomplete"


@dataclass
class Outcome:
    set_id: int
    job_id: int
    epoch: str
    wanted: str
    state: str = S.PENDING
    consistency: str = S.NONE
    reason: str = ""
    failed_nodes: list[str] = field(default_factory=list)
    skew_seconds: float | None = None
    checkpoint_step: int | None = None
    rejected_acks: dict[str, str] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)   # seconds each phase used
    deadline_seconds: float = 0.0
    barrier: Barrier = Barrier.NOT_ASKED

    def as_dict(self) -> dict:
        return asdict(self)


def default_signaller(cfg: Config) -> Callable[[int], None]:
    def signal(job_id: int) -> None:
        from ..slurm.commands import signal_job

        signal_job(job_id, cfg.protocol.checkpoint_signal, timeout=cfg.timeouts.slurm_command)
    return signal


def default_backend_for(cfg: Config):
    from ..backends.factory import backend_for_volume

    return lambda v: backend_for_volume(cfg, v)


class Coordinator:
    """Drives one on-demand set. Everything with a side effect outside the
    inventory and the barrier directory is injected, for tests and simulation."""

    def __init__(self, cfg: Config, inventory, *, signaller: Callable[[int], None] | None = None,
                 backend_for=None, clock: Callable[[], dt.datetime] = utcnow, hook: Hook | None = None,
                 caller: access.Caller | None = None, use_inotify: bool = True):
        self.cfg = cfg
        self.inv = inventory
        self.signal = signaller or default_signaller(cfg)
        self.backend_for = backend_for or default_backend_for(cfg)
        self.clock = clock
        self.hook = hook or (lambda phase: None)
        self.caller = caller
        self.use_inotify = use_inotify

    # -- T1 -----------------------------------------------------------------
    def _open(self, job_id: int, wanted: str, deadline_s: float, trigger: str = "manual"):
        caller = self.caller or access.current_caller()
        with self.inv.session() as repo:
            run = repo.find_job_run(job_id)
            if run is None:
                # PrologSlurmctld records after the launch: a job started a
                # moment ago may not be there yet.
                raise NotFound(f"job {job_id} not found in the inventory: it used no slurm-snap option, or "
                               "it started less than a second ago and PrologSlurmctld is still recording it "
                               f"(hooks.log: {hooknames.PROLOG_SLURMCTLD_RECORD})", what="job", value=str(job_id))
            access.require_owner_or_operator(self.cfg, caller, owner_uid=run.uid, owner_name=run.user_name,
                                             what=f"job {job_id}")
            run = repo.lock_job_run(run.id)
            # Only the shared volumes can collide with another job's set; the
            # full list is loaded after the signal, while the ranks checkpoint.
            _refuse_if_busy(repo, run, [v.path for v in repo.volume_rows(run.id, scope="shared")], job_id)
            now = self.clock()
            # The set's own deadline covers the barrier, the cut and the record:
            # past it, repair may label the set even if its owner still runs.
            overall = now + dt.timedelta(seconds=deadline_s + 2 * self.cfg.timeouts.backend_call + 10)
            st, _ = repo.create_set(run, epoch=new_epoch(), trigger=trigger, wanted=wanted,
                                    deadline=overall, owner=owner.token(), requested_at=now)
            if st.expected_parts == 0:  # raising rolls the new set back with the transaction
                raise NotFound(what="declared volume of job", value=str(job_id))
            by = caller.name if trigger == "manual" else f"the schedule runner ({caller.name})"
            self._requested_by = f"set {st.id} requested by {by} ({wanted}, deadline {deadline_s:g} s)"
            return st.id, st.epoch, now, run.id, run.uid, list(run.nodes or [])

    def snapshot(self, job_id: int, *, consistency: str | None = None, deadline: float | None = None,
                 trigger: str = "manual") -> Outcome:
        """`trigger` is "manual" (slurm-snap snapshot) or "periodic" (the schedule runner)."""
        if trigger not in ("manual", "periodic"):
            raise BadValueError(what="trigger", value=trigger, why="an on-demand set is manual or periodic")
        wanted = consistency or self.cfg.protocol.default_consistency
        if wanted not in S.WANTED:
            raise BadValueError(what="consistency", value=wanted, why=f"must be {' or '.join(S.WANTED)}")
        deadline_s = self.cfg.timeouts.barrier if deadline is None else float(deadline)
        if not deadline_s > 0:
            raise BadValueError(what="deadline", value=deadline, why="must be a positive number of seconds")
        t0 = time.monotonic()
        set_id, epoch, requested_at, run_id, uid, nodes = self._open(job_id, wanted, deadline_s, trigger)
        out = Outcome(set_id=set_id, job_id=job_id, epoch=epoch, wanted=wanted, deadline_seconds=deadline_s)
        out.phases["request"] = time.monotonic() - t0
        dirs = pool = None
        # A full collection over a 1,000-node set's objects took up to 80 ms in
        # the middle of the cut; one set's garbage is small, so collect after.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.hook("created")
            dirs = JobDir(self.cfg.paths.barrier_dir, job_id).ensure(uid)
            collector = None
            extra: list[str] = []
            if wanted == S.WANT_APP:
                collector, extra, volumes, pool = self._quiesce(out, dirs, job_id, epoch, requested_at,
                                                                deadline_s, uid, nodes, run_id, t0)
                out.barrier = Barrier.COMPLETE if collector.state.all_complete else Barrier.INCOMPLETE
                if not collector.state.all_complete and not self.cfg.protocol.allow_crash_consistent:
                    return self._fail_barrier(out, collector, extra)
            else:
                with self.inv.session() as repo:
                    repo.event("snapshot", self._requested_by, job_id=job_id, set_id=set_id)
                    volumes = [VolumeRecord.of(v) for v in repo.volume_rows(run_id)]
                pool = CutPool(volumes, self.backend_for)
            parts, outside = self._cut(out, job_id, volumes, collector, pool)
            self._finalize(out, volumes, nodes, requested_at, collector, parts, outside, extra)
            return out
        except BaseException as exc:
            self._abort(out, exc)
            raise
        finally:
            t = time.monotonic()
            if dirs is not None:
                try:
                    dirs.write_release(ReleaseRecord(epoch=epoch, set_id=set_id, state=out.state,
                                                     consistency=out.consistency))
                except OSError as exc:  # logged, never masks the set's own outcome
                    log.error("job %s: cannot write release/%s: %s", job_id, epoch, exc)
            if pool is not None:
                pool.close()
            out.phases["release"] = time.monotonic() - t
            if gc_was_enabled:
                gc.enable()

    # -- signal and barrier -------------------------------------------------------
    def _quiesce(self, out: Outcome, dirs, job_id, epoch, requested_at, deadline_s, uid, nodes, run_id, t0):
        t = time.monotonic()
        dirs.write_request(RequestRecord(job_id=dirs.job_id, epoch=epoch, requested_at=requested_at,
                                         deadline=requested_at + dt.timedelta(seconds=deadline_s)))
        extra = []
        signalled = True
        try:
            self.signal(job_id)  # ONE Slurm call reaches every rank on every node
        except SnapError as exc:
            signalled = False
            extra.append(f"signal failed: {exc}")
        signalled_at = self.clock()
        out.phases["signal"] = time.monotonic() - t
        # Everything below runs while the ranks checkpoint: off the critical path.
        with self.inv.session() as repo:
            repo.transition(out.set_id, S.QUIESCING, at=signalled_at)
            repo.event("snapshot", self._requested_by, job_id=job_id, set_id=out.set_id)
            if not signalled:
                repo.event("snapshot", extra[-1], job_id=job_id, set_id=out.set_id, level="error")
            volumes = [VolumeRecord.of(v) for v in repo.volume_rows(run_id)]
        out.state = S.QUIESCING
        pool = CutPool(volumes, self.backend_for)
        self.hook("signalled")
        t = time.monotonic()
        collector = AckCollector(dirs.ack, job_id=job_id, epoch=epoch, nodes=nodes, owner_uid=uid,
                                 max_bytes=MAX_ACK_BYTES, clock=self.clock)
        self._ledger = AckLedger(self.inv, out.set_id)
        try:
            if signalled:
                remaining = deadline_s - (time.monotonic() - t0)
                wait_for_barrier(collector, timeout=remaining, use_inotify=self.use_inotify,
                                 on_progress=lambda: self._ledger.maybe_flush(collector))
            else:
                collector.rescan()
        finally:
            collector.close()
        out.phases["barrier"] = time.monotonic() - t
        out.rejected_acks = dict(collector.state.rejected)
        if collector.state.rejected:
            sample = "; ".join(f"{k}: {v}" for k, v in list(collector.state.rejected.items())[:5])
            extra.append(f"{len(collector.state.rejected)} acknowledgements rejected ({sample})")
        self.hook("barrier")
        return collector, extra, volumes, pool

    def _fail_barrier(self, out: Outcome, collector, extra) -> Outcome:
        missing = collector.state.missing_nodes
        reason = "; ".join([f"barrier incomplete after {out.deadline_seconds:g} s on {len(missing)} of "
                            f"{len(collector.state.nodes)} nodes ({', '.join(missing[:8])})",
                            "crash-consistent sets are not allowed (protocol.allow_crash_consistent = false); "
                            "nothing was cut"] + extra)
        with self.inv.session() as repo:
            self._ledger.flush(repo, collector)
            repo.transition(out.set_id, S.FAILED, at=self.clock(), reason=reason, failed_nodes=missing,
                            consistency=S.NONE)
        out.state, out.consistency, out.reason, out.failed_nodes = S.FAILED, S.NONE, reason, missing
        return out

    # -- cut and record -----------------------------------------------------------
    def _cut(self, out: Outcome, job_id: int, volumes: list[VolumeRecord], collector, pool):
        t = time.monotonic()
        entries, outside = {}, []
        if collector is not None:
            # In the inventory's order (node, rank), as the Epilog's finalizer
            # reads them: the reason lists files in the same order either way.
            acks = sorted((a for a, _seen in collector.state.all_acks()), key=lambda a: (a.node, a.rank))
            entries, outside = assign_manifests(volumes, [(a.node, a.manifest) for a in acks])
        cut_started = self.clock()
        self.hook("cutting")
        # The last acks and CUTTING are recorded (by this thread) while the
        # workers cut: a crash before that commit leaves a QUIESCING set whose
        # snapshots repair finds by name, so nothing is lost by not waiting.
        results = pool.cut(volumes, job_id=job_id, set_id=out.set_id, entries=entries, clock=self.clock,
                           budget=2 * self.cfg.timeouts.backend_call + 5,
                           on_part=lambda r: self.hook("cut-part"),
                           meanwhile=lambda: self._mark_cutting(out.set_id, collector, cut_started))
        out.state = S.CUTTING
        out.phases["cut"] = time.monotonic() - t
        self.hook("cut")
        t = time.monotonic()
        parts = [r.record() for r in results]   # once: the verdict judges the same records
        with self.inv.session() as repo:
            st = repo.get_set(out.set_id, lock=True)
            if st.state != S.CUTTING:
                # Repair labelled the set meanwhile (its deadline passed) and
                # already removed the orphans it could see; what we cut after
                # that is recorded nowhere, so it is ours to remove.
                labelled, kept = st.state, {x.name for x in repo.snapshots(out.set_id, include_deleted=True)}
                repo.event("snapshot", f"set {out.set_id} was labelled {labelled} by repair while cutting; "
                           "removing the snapshots cut since", job_id=job_id, set_id=out.set_id, level="error")
            else:
                labelled = None
                repo.record_parts(out.set_id, parts)
                self.hook("record")  # inside the transaction: a crash here records nothing
                repo.transition(out.set_id, S.CUT, at=self.clock())
        if labelled is not None:
            self._remove_unrecorded(pool, results, kept)
            raise InvalidTransition(set_id=out.set_id, old=labelled, new=S.CUT)
        out.state = S.CUT
        out.phases["record_parts"] = time.monotonic() - t
        self.hook("recorded")
        return parts, outside

    @staticmethod
    def _remove_unrecorded(pool, results, recorded_names: set[str]) -> None:
        """Best effort: delete what this process cut that no inventory row names.
        Coalesced (shared) snapshots may serve other sets: never touched here."""
        for r in results:
            if not r.ok or r.ref is None or r.shared_key or r.name in recorded_names:
                continue
            try:
                pool.backend_for(r.volume).delete(r.ref)
            except Exception as exc:  # left for an operator: the log names it
                log.error("set: could not remove unrecorded snapshot %s (%s): %s", r.name, r.ref.ref, exc)

    def _mark_cutting(self, set_id: int, collector, cut_started: dt.datetime) -> None:
        with self.inv.session() as repo:
            if collector is not None:
                self._ledger.flush(repo, collector)   # the rows the barrier wait did not record yet
                if collector.state.all_complete and collector.state.complete_at:
                    repo.update_set(set_id, barrier_at=max(collector.state.complete_at.values()))
            repo.transition(set_id, S.CUTTING, at=cut_started)

    def _finalize(self, out: Outcome, volumes, nodes, requested_at, collector, parts, outside, extra) -> None:
        """The verdict from what this process saw (the same pure rules as the
        inventory-based finalizer), recorded in one transaction."""
        t = time.monotonic()
        v = judge(wanted=out.wanted, volumes=volumes, nodes=nodes,
                  acks=collector.state.records() if collector is not None else [],
                  parts=parts, requested_at=requested_at,
                  allow_crash=self.cfg.protocol.allow_crash_consistent, outside=outside, extra_reasons=extra)
        with self.inv.session() as repo:
            st = repo.get_set(out.set_id, lock=True)
            finalize.apply(repo, st, v, at=self.clock())
            out.phases["finalize"] = time.monotonic() - t
            budget = ", ".join(f"{k} {v_:.3f} s" for k, v_ in out.phases.items())
            repo.event("snapshot", f"set {out.set_id} {v.state} {v.consistency}; time used: {budget} "
                       f"(barrier deadline {out.deadline_seconds:g} s)", job_id=out.job_id, set_id=out.set_id)
        out.state, out.consistency, out.reason = v.state, v.consistency, v.reason
        out.failed_nodes, out.skew_seconds, out.checkpoint_step = list(v.failed_nodes), v.skew_seconds, v.checkpoint_step

    def _abort(self, out: Outcome, exc: BaseException) -> None:
        """Best effort: label the set FAILED now rather than leave it to repair."""
        why = f"coordinator stopped: {type(exc).__name__}: {exc}"[:2000]
        try:
            with self.inv.session() as repo:
                st = repo.get_set(out.set_id, lock=True)
                if st.state in S.ACTIVE and S.allowed(st.state, S.FAILED):
                    repo.transition(out.set_id, S.FAILED, at=self.clock(), reason=why)
                    out.state, out.reason = S.FAILED, why
        except Exception as inner:  # the inventory may be what failed; repair will see the set
            log.error("set %s: could not record the failure (%s); run `slurm-snap repair`", out.set_id, inner)


def _refuse_if_busy(repo, run, shared_paths, job_id: int) -> None:
    for st in repo.active_sets(job_run_id=run.id):
        raise Busy(what="job", value=str(job_id), why=_in_flight(st))
    paths = sorted(set(shared_paths))
    if paths:
        for st in repo.active_sets(volume_paths=paths):
            theirs = {v.path for v in repo.volume_rows(st.job_run_id, scope="shared")} & set(paths)
            raise Busy(what="volume", value=sorted(theirs)[0] if theirs else paths[0],
                       why=f"{_in_flight(st)} (job {st.job_id})")


def _in_flight(st) -> str:
    return (f"snapshot set {st.id} ({st.trigger}, {st.state}, requested {st.requested_at:%Y-%m-%dT%H:%M:%SZ}, "
            f"owner {st.owner or 'unknown'}) is in flight; wait for it, or run `slurm-snap repair` "
            "if its coordinator died")
