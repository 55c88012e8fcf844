"""Job runs and their volumes: what PrologSlurmctld records and every later
step (the coordinator, the preemption hooks, repair) reads back."""
from __future__ import annotations

from typing import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..clock import utcnow
from ..errors import NotFound
from .. import states as S
from .models import JobRun, SnapshotSet, Volume
from ..jobrecords import VolumeRecord, preempt_epoch


class RunQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def record_job_run(self, *, job_id: int, restart_count: int, user_name: str, uid: int,
                       partition: str = "", nodes: Sequence[str] = (), options: dict | None = None,
                       snapshot_every: int | None = None, sluid: str | None = None) -> JobRun:
        """Idempotent: Slurm may run a hook twice; the second call updates in place."""
        run = self.s.scalar(select(JobRun).where(JobRun.job_id == job_id, JobRun.restart_count == restart_count))
        if run is None:
            run = JobRun(job_id=job_id, restart_count=restart_count, user_name=user_name, uid=uid,
                         partition=partition, nodes=list(nodes), options=dict(options or {}), created_at=utcnow(),
                         snapshot_every=snapshot_every, sluid=sluid or None)
            self.s.add(run)
        else:
            run.nodes = sorted(set(run.nodes) | set(nodes)) if nodes else run.nodes
            if options:
                run.options = {**run.options, **options}
            if partition:
                run.partition = partition
            if snapshot_every is not None:
                run.snapshot_every = snapshot_every
            if sluid:
                run.sluid = sluid
        self.s.flush()
        return run

    def runs_for_sluids(self, sluids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """SLUID -> (job id, restart count), for the SLUIDs the inventory knows."""
        if not sluids:
            return {}
        rows = self.s.execute(select(JobRun.sluid, JobRun.job_id, JobRun.restart_count)
                              .where(JobRun.sluid.in_(list(sluids))))
        return {s: (j, rc) for s, j, rc in rows}

    def add_volumes(self, run: JobRun, specs: Iterable[VolumeRecord], *, prepared: bool = False) -> list[Volume]:
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

    def volume_rows(self, run_id: int, *, scope: str | None = None) -> list:
        """A run's volumes as plain rows (id, path, scope, node, volume_class,
        backend, site, region, refusal): no ORM objects for a 1,000-node job."""
        q = select(Volume.id, Volume.path, Volume.scope, Volume.node, Volume.volume_class, Volume.backend,
                   Volume.site, Volume.region, Volume.refusal).where(Volume.job_run_id == run_id)
        if scope is not None:
            q = q.where(Volume.scope == scope)
        return list(self.s.execute(q.order_by(Volume.id)))

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
        or time-limit set, `preempt-<its restart count>`, is still in flight."""
        rows = self.s.execute(select(JobRun, SnapshotSet.epoch).join(SnapshotSet, SnapshotSet.job_run_id == JobRun.id)
                              .where(JobRun.job_id == job_id, JobRun.restart_count <= max_restart_count,
                                     SnapshotSet.trigger.in_(S.HOOK_TRIGGERS), SnapshotSet.state.in_(S.ACTIVE))
                              .order_by(JobRun.restart_count.desc()))
        for run, epoch in rows:
            if epoch == preempt_epoch(run.restart_count):
                return run
        return None
