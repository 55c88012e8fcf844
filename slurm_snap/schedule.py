"""Continuous protection: one pass of the schedule runner (`slurm-snap
schedule`, on the controller, every minute from a systemd timer or a
scrontab line: etc/slurm-snap-schedule.*, etc/README.md §9).

    1. ask Slurm once which jobs run (one `squeue --json`);
    2. ask the inventory (two queries per 500 of them) which take periodic snapshots, with
       each run's newest set and whether one is in flight;
    3. take the due sets through the on-demand path (the coordinator: the
       same signal, barrier, cut and honest label as `slurm-snap snapshot`),
       at most schedule.concurrency at once and each start schedule.signal_gap
       after the previous, so jobs due in the same minute are not signalled
       together; a job with a set in flight is never signalled again (the
       coordinator refuses a second set under the run's row lock, too);
    4. drill the newest never-drilled COMPLETE sets (restore.verify_within
       set), at most schedule.drills at once, as the job's user with the
       resume command it recorded;
    5. with [restore] partner_copies, copy node-local parts of restorable
       sets to their partner node (protocol.partner), outside the cut's
       critical path, before this pass's drills start: a set with node-local
       parts is then drilled on nodes that cut none of it (restore.drill
       Placement), each part brought from its partner copy when there is
       one, so the drill proves what a requeue after a node's loss needs.

A run is due when DURATION has passed since the later of its start and its
newest set of any kind (a requeued run counts from its own start, not from
the set its preemption cut). That is `every` seconds after the run's newest
set (of any trigger: a preemption set or a manual one counts) was requested,
or after the run was recorded when it has none. README, docs/design.md and `schedule
--help` say the same. Nothing here queries Slurm or the inventory once
per job: a pass with nothing due costs one squeue and two queries per
500 running jobs
(benchmarks/schedule.py).
"""
from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Callable

from . import progress
from .clock import aware, utcnow
from .config import Config
from .errors import Busy, SnapError
from .inventory.schedule import DrillCandidate, PeriodicRun
from .restore.live import LiveDrills

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Due:
    job_id: int
    every: int
    due_at: dt.datetime
    consistency: str


def plan(runs: list[PeriodicRun], now: dt.datetime) -> tuple[list[Due], list[int]]:
    """The runs due now, most overdue first, and the job ids skipped because
    a set of theirs is in flight."""
    due, busy = [], []
    for r in runs:
        if r.in_flight:
            busy.append(r.job_id)
            continue
        base = aware(r.last_requested_at or r.created_at)
        at = base + dt.timedelta(seconds=r.every)
        if at <= now:
            due.append(Due(job_id=r.job_id, every=r.every, due_at=at, consistency=r.consistency))
    due.sort(key=lambda d: (d.due_at, d.job_id))
    return due, sorted(busy)


@dataclass
class Taken:
    job_id: int
    set_id: int | None = None
    state: str = ""
    consistency: str = ""
    late_seconds: float = 0.0      # how long after it was due the set was requested
    error: str = ""


@dataclass
class Drilled:
    set_id: int
    job_id: int
    passed: bool | None = None
    reason: str = ""
    time_to_first_step: float | None = None
    error: str = ""


@dataclass
class PassReport:
    started_at: dt.datetime
    running: int = 0
    periodic: int = 0
    in_flight: list[int] = field(default_factory=list)
    due: list[Due] = field(default_factory=list)
    taken: list[Taken] = field(default_factory=list)
    drills: list[Drilled] = field(default_factory=list)
    # Partner copies made this pass ([restore] partner_copies): one line each.
    partners: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["started_at"] = self.started_at.isoformat()
        d["due"] = [{"job_id": x.job_id, "every": x.every, "due_at": x.due_at.isoformat()} for x in self.due]
        return d


class Runner:
    """One pass. Slurm, the coordinator and the drill are injected for tests."""

    def __init__(self, cfg: Config, inventory, *, running: Callable[[], dict[int, int]] | None = None,
                 snapshot: Callable[[int, str], tuple[int, str, str]] | None = None,
                 drill: Callable[[DrillCandidate], Drilled] | None = None,
                 clock: Callable[[], dt.datetime] = utcnow, sleep: Callable[[float], None] = time.sleep):
        self.cfg = cfg
        self.inv = inventory
        self.running = running or self._squeue
        self.snapshot = snapshot or self._snapshot
        self.drill = drill or self._drill
        self.clock = clock
        self.sleep = sleep
        # One for every drill of this process: they run in threads, and none
        # may sweep another as dead (restore/live.py).
        self.live = LiveDrills()

    # -- the real side effects ---------------------------------------------------
    def _squeue(self) -> dict[int, int]:
        from .slurm.api import interface

        return interface().running_jobs(timeout=self.cfg.timeouts.slurm_command)

    def _snapshot(self, job_id: int, consistency: str) -> tuple[int, str, str]:
        from .protocol.coordinator import Coordinator

        out = Coordinator(self.cfg, self.inv).snapshot(job_id, consistency=consistency, trigger="periodic")
        return out.set_id, out.state, out.consistency

    def _drill(self, c: DrillCandidate) -> Drilled:
        from .restore.drill import Drill

        if self.cfg.restore.partner_copies:
            from .restore.placement import Placement
            from .restore.submit import SlurmSubmitter

            out = Drill(self.cfg, self.inv, submitter=SlurmSubmitter(self.cfg), live=self.live).run(
                f"set:{c.set_id}", placement=Placement(prefer_copies=True, only_node_local=True))
        else:
            out = Drill(self.cfg, self.inv, live=self.live).run(f"set:{c.set_id}")
        return Drilled(set_id=c.set_id, job_id=c.job_id, passed=out.passed, reason=out.reason,
                       time_to_first_step=out.time_to_first_step)

    # -- the pass -------------------------------------------------------------------
    def pass_once(self, *, dry_run: bool = False) -> PassReport:
        t0 = time.monotonic()
        report = PassReport(started_at=self.clock())
        progress.phase("ask Slurm and the inventory")
        running = self.running()
        report.running = len(running)
        drills_on = bool(self.cfg.restore.verify_within) and self.cfg.schedule.drills > 0
        with self.inv.session() as repo:
            runs = repo.periodic_runs(running) if running else []
            candidates = repo.drill_candidates(limit=self.cfg.schedule.drills) if drills_on else []
        report.periodic = len(runs)
        report.due, report.in_flight = plan(runs, report.started_at)
        if dry_run:
            report.drills = [Drilled(set_id=c.set_id, job_id=c.job_id) for c in candidates]
            report.seconds = time.monotonic() - t0
            return report
        due_jobs = {d.job_id for d in report.due}
        # A job about to be signalled is not drilled in the same pass: its
        # newest set is the one to prove, next pass.
        candidates = [c for c in candidates if c.job_id not in due_jobs]
        partners = None
        progress.phase("sets and drills" + (", partner copies" if self.cfg.restore.partner_copies else ""),
                       total=len(report.due) + len(candidates))
        with progress.hold(), ThreadPoolExecutor(max_workers=self.cfg.schedule.concurrency, thread_name_prefix="snap") as snaps, \
                ThreadPoolExecutor(max_workers=max(1, self.cfg.schedule.drills), thread_name_prefix="drill") as drills, \
                ThreadPoolExecutor(max_workers=1, thread_name_prefix="partner") as partner_pool:
            if self.cfg.restore.partner_copies:
                # Copies first, drills after them: a drill then brings a part
                # from its partner copy and so proves that copy restores.
                partners = partner_pool.submit(self._partners)

            def drill_after_partners(c: DrillCandidate) -> Drilled:
                if partners is not None:
                    # Done either way; its outcome is reported with the pass, not per drill.
                    wait([partners])
                try:
                    return self._one_drill(c)
                finally:
                    progress.count()

            drill_futures = [drills.submit(drill_after_partners, c) for c in candidates]
            snap_futures = []
            gate = threading.Semaphore(self.cfg.schedule.concurrency)
            for i, d in enumerate(report.due):
                if i:
                    self.sleep(self.cfg.schedule.signal_gap)
                # Wait for a free worker before the gap counts: the gap
                # separates signals, not queue entries.
                gate.acquire()
                snap_futures.append(snaps.submit(self._one_snapshot, d, gate))
            report.taken = [f.result() for f in snap_futures]
            report.drills = [f.result() for f in drill_futures]
            if partners is not None:
                report.partners = partners.result()
        report.seconds = time.monotonic() - t0
        return report

    def _partners(self) -> list[str]:
        from .protocol import nodelocal, partner

        try:
            return [nodelocal.describe(c) for c in partner.make_copies(self.cfg, self.inv)]
        except SnapError as exc:
            return [f"partner copies not made: {exc}"]

    def _one_snapshot(self, d: Due, gate: threading.Semaphore) -> Taken:
        try:
            taken = Taken(job_id=d.job_id, late_seconds=max(0.0, (self.clock() - d.due_at).total_seconds()))
            try:
                taken.set_id, taken.state, taken.consistency = self.snapshot(d.job_id, d.consistency)
            except Busy as exc:
                taken.error = f"busy: {exc}"
            except SnapError as exc:
                taken.error = str(exc)
            except Exception as exc:  # one job's bug must not end the pass for the others
                log.exception("periodic snapshot of job %s", d.job_id)
                taken.error = f"internal error: {exc.__class__.__name__}: {exc}"
            return taken
        finally:
            progress.count()
            gate.release()

    def _one_drill(self, c: DrillCandidate) -> Drilled:
        try:
            return self.drill(c)
        except SnapError as exc:
            return Drilled(set_id=c.set_id, job_id=c.job_id, error=str(exc))
        except Exception as exc:
            log.exception("scheduled drill of set %s", c.set_id)
            return Drilled(set_id=c.set_id, job_id=c.job_id, error=f"internal error: {exc.__class__.__name__}: {exc}")

