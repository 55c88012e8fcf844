"""Restore drills: their records, the set a drill may use, and the live
volumes a drill's target must stay clear of."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..clock import utcnow
from ..errors import NotFound
from .. import states as S
from .models import JobRun, RestoreTest, SnapshotSet, Volume


class DrillQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

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

    def drillable_set(self, job_id: int) -> SnapshotSet | None:
        """Newest set of the job a restore drill may use: restorable and app- or crash-consistent."""
        q = select(SnapshotSet).where(SnapshotSet.job_id == job_id,
                                      SnapshotSet.state.in_(tuple(S.RESTORABLE)),
                                      SnapshotSet.consistency.in_(sorted(S.DRILLABLE)))
        return self.s.scalar(q.order_by(SnapshotSet.requested_at.desc(), SnapshotSet.id.desc()).limit(1))

    def live_volume_paths(self) -> list[tuple[str, int]]:
        """(path, job_id) of every volume any job declared: restore targets must stay clear of them."""
        rows = self.s.execute(select(Volume.path, JobRun.job_id).join(JobRun, Volume.job_run_id == JobRun.id)
                              .distinct().order_by(Volume.path))
        return [(p, j) for p, j in rows]
