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
import logging
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from .. import access
from ..client.ack import MAX_ACK_BYTES
from ..config import Config
from ..errors import BadValueError, Busy, InvalidTransition, NotFound, SnapError
from ..inventory.repository import AckRecord
from . import finalize, jobfiles, owner
from . import states as S
from .barrier import AckCollector, wait_for_barrier
from .cutter import VolumeInfo, assign_manifests, cut_all

log = logging.getLogger(__name__)

Hook = Callable[[str], None]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_epoch() -> str:
    """A fresh token per request: an ack can only carry it after reading request.json."""
    return "s" + secrets.token_hex(8)


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
    def _open(self, job_id: int, wanted: str, deadline_s: float):
        caller = self.caller or access.current_caller()
        with self.inv.session() as repo:
            run = repo.find_job_run(job_id)
            if run is None:
                raise NotFound(what="job", value=str(job_id))
            access.require_owner_or_operator(self.cfg, caller, owner_uid=run.uid, owner_name=run.user_name,
                                             what=f"job {job_id}")
            run = repo.lock_job_run(run.id)
            volumes = repo.volumes(run)
            if not volumes:
                raise NotFound(what="declared volume of job", value=str(job_id))
            _refuse_if_busy(repo, run, volumes, job_id)
            now = self.clock()
            # The set's own deadline covers the barrier, the cut and the record:
            # past it, repair may label the set even if its owner still runs.
            overall = now + dt.timedelta(seconds=deadline_s + 2 * self.cfg.timeouts.backend_call + 10)
            st, _ = repo.create_set(run, epoch=new_epoch(), trigger="manual", wanted=wanted,
                                    deadline=overall, owner=owner.token(), requested_at=now)
            repo.event("snapshot", f"set {st.id} requested by {caller.name} ({wanted}, deadline {deadline_s:g} s)",
                       job_id=job_id, set_id=st.id)
            return (st.id, st.epoch, now, run.uid, list(run.nodes or []),
                    [VolumeInfo.of(v) for v in volumes])

    def snapshot(self, job_id: int, *, consistency: str | None = None, deadline: float | None = None) -> Outcome:
        wanted = consistency or self.cfg.protocol.default_consistency
        if wanted not in ("app", "crash"):
            raise BadValueError(what="consistency", value=wanted, why="must be app or crash")
        deadline_s = self.cfg.timeouts.barrier if deadline is None else float(deadline)
        if not deadline_s > 0:
            raise BadValueError(what="deadline", value=deadline, why="must be a positive number of seconds")
        t0 = time.monotonic()
        set_id, epoch, requested_at, uid, nodes, volumes = self._open(job_id, wanted, deadline_s)
        out = Outcome(set_id=set_id, job_id=job_id, epoch=epoch, wanted=wanted, deadline_seconds=deadline_s)
        out.phases["request"] = time.monotonic() - t0
        dirs = None
        try:
            self.hook("created")
            dirs = jobfiles.ensure(self.cfg.paths.barrier_dir, job_id, uid)
            collector = None
            extra: list[str] = []
            if wanted == "app":
                collector, extra = self._quiesce(out, dirs, job_id, epoch, requested_at, deadline_s, uid, nodes, t0)
                if collector is not None and not collector.state.all_complete \
                        and not self.cfg.protocol.allow_crash_consistent:
                    return self._fail_barrier(out, collector, extra)
            self._cut(out, job_id, volumes, collector, t0)
            self._finalize(out, extra, t0)
            return out
        except BaseException as exc:
            self._abort(out, exc)
            raise
        finally:
            t = time.monotonic()
            if dirs is not None:
                try:
                    jobfiles.write_release(dirs, epoch=epoch, set_id=set_id, state=out.state,
                                           consistency=out.consistency)
                except OSError as exc:  # logged, never masks the set's own outcome
                    log.error("job %s: cannot write release/%s: %s", job_id, epoch, exc)
            out.phases["release"] = time.monotonic() - t

    # -- signal and barrier -------------------------------------------------------
    def _quiesce(self, out: Outcome, dirs, job_id, epoch, requested_at, deadline_s, uid, nodes, t0):
        t = time.monotonic()
        jobfiles.write_request(dirs, job_id=job_id, epoch=epoch, requested_at=requested_at,
                               deadline=requested_at + dt.timedelta(seconds=deadline_s))
        extra = []
        signalled = True
        try:
            self.signal(job_id)  # ONE Slurm call reaches every rank on every node
        except SnapError as exc:
            signalled = False
            extra.append(f"signal failed: {exc}")
        with self.inv.session() as repo:
            repo.transition(out.set_id, S.QUIESCING, at=self.clock())
            if not signalled:
                repo.event("snapshot", extra[-1], job_id=job_id, set_id=out.set_id, level="error")
        out.state = S.QUIESCING
        out.phases["signal"] = time.monotonic() - t
        self.hook("signalled")
        t = time.monotonic()
        collector = AckCollector(dirs.ack, job_id=job_id, epoch=epoch, nodes=nodes, owner_uid=uid,
                                 max_bytes=MAX_ACK_BYTES, clock=self.clock)
        try:
            if signalled:
                remaining = deadline_s - (time.monotonic() - t0)
                wait_for_barrier(collector, timeout=remaining, use_inotify=self.use_inotify)
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
        return collector, extra

    def _fail_barrier(self, out: Outcome, collector, extra) -> Outcome:
        missing = collector.state.missing_nodes
        reason = "; ".join([f"barrier incomplete after {out.deadline_seconds:g} s on {len(missing)} of "
                            f"{len(collector.state.nodes)} nodes ({', '.join(missing[:8])})",
                            "crash-consistent sets are not allowed (protocol.allow_crash_consistent = false); "
                            "nothing was cut"] + extra)
        with self.inv.session() as repo:
            self._record_acks(repo, out.set_id, collector)
            repo.transition(out.set_id, S.FAILED, at=self.clock(), reason=reason, failed_nodes=missing,
                            consistency=S.NONE)
        out.state, out.consistency, out.reason, out.failed_nodes = S.FAILED, S.NONE, reason, missing
        return out

    @staticmethod
    def _record_acks(repo, set_id: int, collector) -> None:
        rows = [(AckRecord(node=a.node, rank=a.rank, local_rank=a.local_rank, local_size=a.local_size,
                           step=a.step, written_at=a.written_at,
                           manifest=[{"path": e.path, "size": e.size, **({"sha256": e.sha256} if e.sha256 else {})}
                                     for e in a.manifest]), seen)
                for a, seen in collector.state.all_acks()]
        repo.record_acks_seen(set_id, rows)

    # -- cut and record -----------------------------------------------------------
    def _cut(self, out: Outcome, job_id: int, volumes: list[VolumeInfo], collector, t0) -> None:
        t = time.monotonic()
        entries = {}
        if collector is not None:
            entries, _outside = assign_manifests(
                volumes, [(a.node, a.manifest) for a, _seen in collector.state.all_acks()])
        with self.inv.session() as repo:
            if collector is not None:
                self._record_acks(repo, out.set_id, collector)
                if collector.state.all_complete and collector.state.complete_at:
                    repo.update_set(out.set_id, barrier_at=max(collector.state.complete_at.values()))
            repo.transition(out.set_id, S.CUTTING, at=self.clock())
        out.state = S.CUTTING
        out.phases["record_acks"] = time.monotonic() - t
        self.hook("cutting")
        t = time.monotonic()
        results = cut_all(volumes, job_id=job_id, set_id=out.set_id, backend_for=self.backend_for,
                          entries=entries, clock=self.clock,
                          budget=2 * self.cfg.timeouts.backend_call + 5,
                          on_part=lambda r: self.hook("cut-part"))
        out.phases["cut"] = time.monotonic() - t
        self.hook("cut")
        t = time.monotonic()
        with self.inv.session() as repo:
            st = repo.get_set(out.set_id, lock=True)
            if st.state != S.CUTTING:  # repair labelled it meanwhile: our snapshots are its orphans
                raise InvalidTransition(set_id=out.set_id, old=st.state, new=S.CUT)
            repo.record_parts(out.set_id, [part_row(r, self.clock) for r in results])
            self.hook("record")  # inside the transaction: a crash here records nothing
            repo.transition(out.set_id, S.CUT, at=self.clock())
        out.state = S.CUT
        out.phases["record_parts"] = time.monotonic() - t
        self.hook("recorded")

    def _finalize(self, out: Outcome, extra: list[str], t0) -> None:
        t = time.monotonic()
        with self.inv.session() as repo:
            st = repo.get_set(out.set_id, lock=True)
            v = finalize.verdict_for(repo, st, allow_crash=self.cfg.protocol.allow_crash_consistent,
                                     extra_reasons=extra)
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


def part_row(r, clock) -> dict:
    """An inventory snapshot row for a cut result (CUT, or MISSING with the error)."""
    v = r.volume
    now = clock()
    return dict(volume_id=v.id, backend=v.backend, name=r.name,
                ref=(r.ref.ref if r.ref else ""), path=(r.ref.path or "") if r.ref else "",
                node=v.node, state="CUT" if r.ok else "MISSING",
                cut_started_at=r.cut_started_at or now, cut_at=r.cut_at or now,
                site=v.site, region=v.region, manifest_ok=r.manifest_ok if r.ok else None,
                error=(r.manifest_why if r.ok else r.error)[:2000])


def _refuse_if_busy(repo, run, volumes, job_id: int) -> None:
    for st in repo.active_sets(job_run_id=run.id):
        raise Busy(what="job", value=str(job_id), why=_in_flight(st))
    paths = sorted({v.path for v in volumes if v.scope == "shared"})
    if paths:
        for st in repo.active_sets(volume_paths=paths):
            theirs = {v.path for v in repo.volumes(st.job_run)} & set(paths)
            raise Busy(what="volume", value=sorted(theirs)[0] if theirs else paths[0],
                       why=f"{_in_flight(st)} (job {st.job_id})")


def _in_flight(st) -> str:
    return (f"snapshot set {st.id} ({st.trigger}, {st.state}, requested {st.requested_at:%Y-%m-%dT%H:%M:%SZ}, "
            f"owner {st.owner or 'unknown'}) is in flight; wait for it, or run `slurm-snap repair` "
            "if its coordinator died")
