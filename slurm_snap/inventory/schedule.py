"""What the schedule runner reads in one pass: the periodic runs of the jobs
Slurm says are running, with each run's newest set and whether one is in
flight, and the sets a scheduled drill should prove next. A query per pass
(and per chunk of job ids), never one per job: a pass with nothing due must
stay cheap at ten thousand running jobs (benchmarks/schedule.py)."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from .. import states as S
from .models import JobRun, RestoreTest, SnapshotSet

# Bound parameters per IN list: far under every supported database's limit.
CHUNK = 500
# A drill that was abandoned (our setup, the network: restore/drill.py's
# "drill aborted: "/"interrupted: " reasons) says nothing of the set, so the
# set is drilled again, up to this many attempts in all.
DRILL_ATTEMPTS = 3
_ABANDONED = ("drill aborted: %", "interrupted: %")


def _abandoned():
    return and_(RestoreTest.result == "FAILED", or_(*(RestoreTest.reason.like(p) for p in _ABANDONED)))


def _has_verdict():
    """A drill of the set gave it a verdict, or runs now (anything but abandoned)."""
    return select(RestoreTest.id).where(RestoreTest.set_id == SnapshotSet.id, ~_abandoned()).exists()


def _undrilled():
    """No drill gave the set a verdict (or runs now), and fewer than
    DRILL_ATTEMPTS were abandoned."""
    attempts = (select(func.count(RestoreTest.id)).where(RestoreTest.set_id == SnapshotSet.id)
                .scalar_subquery())
    return and_(~_has_verdict(), attempts < DRILL_ATTEMPTS)


@dataclass(frozen=True)
class PeriodicRun:
    run_id: int
    job_id: int
    restart_count: int
    user_name: str
    every: int                          # seconds
    created_at: dt.datetime             # when PrologSlurmctld recorded the run
    last_requested_at: dt.datetime | None   # the run's newest set of any trigger
    in_flight: bool                     # a set of the run is PENDING..CUT
    consistency: str                    # what the job asked for (--snapshot-consistency)


@dataclass(frozen=True)
class DrillCandidate:
    set_id: int
    job_id: int
    user_name: str
    cut_at: dt.datetime                 # the set's cut_done_at
    resume_cmd: str


class ScheduleQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def periodic_runs(self, running: dict[int, int]) -> list[PeriodicRun]:
        """The periodic runs among `running` (job id -> restart count, what
        squeue says runs now), each with its newest set and whether one is
        in flight."""
        active = tuple(S.ACTIVE)
        out: list[PeriodicRun] = []
        ids = sorted(running)
        for i in range(0, len(ids), CHUNK):
            chunk = ids[i:i + CHUNK]
            # Two flat indexed queries per chunk, merged here: joined to an
            # aggregated subquery, SQLite scanned the subquery once per run
            # (0.4 s a pass at 1,000 jobs); and a JSON column (options) cannot
            # sit in a GROUP BY on PostgreSQL.
            runs = self.s.execute(
                select(JobRun.id, JobRun.job_id, JobRun.restart_count, JobRun.user_name, JobRun.snapshot_every,
                       JobRun.created_at, JobRun.options)
                .where(JobRun.snapshot_every.is_not(None), JobRun.job_id.in_(chunk))).all()
            mine = [r for r in runs if running.get(r.job_id) == r.restart_count]
            if not mine:
                continue   # none periodic (or only earlier runs of requeued jobs): no second query
            sets = {run_id: (last, busy) for run_id, last, busy in self.s.execute(
                select(SnapshotSet.job_run_id, func.max(SnapshotSet.requested_at),
                       func.sum(case((SnapshotSet.state.in_(active), 1), else_=0)))
                .where(SnapshotSet.job_id.in_([r.job_id for r in mine]))
                .group_by(SnapshotSet.job_run_id))}
            for r in mine:
                last, busy = sets.get(r.id, (None, 0))
                out.append(PeriodicRun(run_id=r.id, job_id=r.job_id, restart_count=r.restart_count,
                                       user_name=r.user_name, every=int(r.snapshot_every), created_at=r.created_at,
                                       last_requested_at=last, in_flight=bool(busy),
                                       consistency=(r.options or {}).get("consistency") or S.WANT_APP))
        return out

    def drill_candidates(self, *, limit: int, exclude_jobs: Iterable[int] = ()) -> list[DrillCandidate]:
        """COMPLETE sets no drill gave a verdict (none running either; an
        abandoned drill is retried, DRILL_ATTEMPTS in all), of runs that
        recorded a resume command, one per job: newest first, at most `limit`."""
        q = (select(SnapshotSet.id, SnapshotSet.job_id, JobRun.user_name, SnapshotSet.cut_done_at, JobRun.options)
             .join(JobRun, SnapshotSet.job_run_id == JobRun.id)
             .where(and_(SnapshotSet.state == S.COMPLETE, SnapshotSet.consistency.in_(sorted(S.DRILLABLE)),
                         SnapshotSet.cut_done_at.is_not(None), _undrilled()))
             .order_by(SnapshotSet.cut_done_at.desc(), SnapshotSet.id.desc()))
        skip = set(exclude_jobs)
        out: list[DrillCandidate] = []
        # The resume command sits in the run's JSON options: filtered here, in
        # pages, so a site with many jobs without one still gets `limit` drills.
        offset, page = 0, max(limit * 4, 50)
        while len(out) < limit:
            rows = self.s.execute(q.offset(offset).limit(page)).all()
            for set_id, job_id, user, cut_at, options in rows:
                cmd = (options or {}).get("resume_cmd") or ""
                if cmd and job_id not in skip and len(out) < limit:
                    out.append(DrillCandidate(set_id=set_id, job_id=job_id, user_name=user, cut_at=cut_at,
                                              resume_cmd=cmd))
                    skip.add(job_id)   # one drill per job at a time: the newest set speaks for it
            if len(rows) < page:
                break
            offset += page
        return out

    def overdue_drills(self, *, before: dt.datetime) -> int:
        """Drills the runner owes past the site's verify_within (the metrics
        say how many): jobs whose newest COMPLETE set that no drill gave a
        verdict was cut before `before`, among jobs whose run recorded a
        resume command. Not counted: a job's older undrilled sets (its newest
        speaks for it, as the runner drills only that one) and jobs without a
        resume command, which the runner cannot drill and nobody is at fault
        for (an alert on them fired for every such job)."""
        wanted = and_(SnapshotSet.state == S.COMPLETE, SnapshotSet.consistency.in_(sorted(S.DRILLABLE)),
                      SnapshotSet.cut_done_at.is_not(None), ~_has_verdict())
        newest = (select(SnapshotSet.job_id, func.max(SnapshotSet.cut_done_at).label("cut"))
                  .where(wanted).group_by(SnapshotSet.job_id).subquery())
        rows = self.s.execute(
            select(SnapshotSet.job_id, JobRun.options)
            .join(JobRun, SnapshotSet.job_run_id == JobRun.id)
            .join(newest, and_(SnapshotSet.job_id == newest.c.job_id, SnapshotSet.cut_done_at == newest.c.cut))
            .where(wanted, newest.c.cut < before)).all()
        return len({job_id for job_id, options in rows if (options or {}).get("resume_cmd")})
