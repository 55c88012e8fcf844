"""Restore drills: their records, the set a drill may use, and the live
volumes a drill's target must stay clear of."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..clock import utcnow
from ..errors import Conflict, NotFound
from .. import states as S
from .models import JobRun, RestoreNode, RestoreTest, SnapshotSet, Volume


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
                            slurm_job_id: int | None = None, queued_seconds: float | None = None,
                            ran_on: str = "") -> RestoreTest:
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
        if queued_seconds is not None:
            rt.queued_seconds = queued_seconds
        if ran_on:
            rt.ran_on = ran_on[:64]
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

    def set_restore_test_job(self, test_id: int, slurm_job_id: int, *, submitted_at=None) -> None:
        """The drill's Slurm job, as sbatch answered. A drill job's Prolog may
        have bound the test already (bind_restore_job): to another job, it is
        a job that claimed this drill, and the drill's own job is refused."""
        rt = self._locked_test(test_id)
        if rt.slurm_job_id is not None and rt.slurm_job_id != slurm_job_id:
            raise Conflict(f"restore test {test_id} was claimed by Slurm job {rt.slurm_job_id}, "
                           f"not by its own job {slurm_job_id}")
        rt.slurm_job_id = slurm_job_id
        if submitted_at is not None:
            rt.submitted_at = submitted_at
        self.s.flush()

    def _locked_test(self, test_id: int) -> RestoreTest:
        rt = self.s.scalar(select(RestoreTest).where(RestoreTest.id == test_id).with_for_update())
        if rt is None:
            raise NotFound(what="restore test", value=str(test_id))
        return rt

    def bind_restore_job(self, test_id: int, slurm_job_id: int) -> bool:
        """A drill job's Prolog: the test belongs to this Slurm job (the first
        to ask, if sbatch's answer has not been recorded yet). False: another
        job has it."""
        rt = self._locked_test(test_id)
        if rt.slurm_job_id is None:
            rt.slurm_job_id = slurm_job_id
            self.s.flush()
        return rt.slurm_job_id == slurm_job_id

    def plan_restore_nodes(self, test_id: int, nodes: list[tuple[str, list[int]]]) -> None:
        """One PLANNED row per node of a drill job, in position order, with
        the node-local parts (snapshot ids) its Prolog clones."""
        now = utcnow()
        for position, (node, snapshot_ids) in enumerate(nodes):
            self.s.add(RestoreNode(test_id=test_id, node=node, position=position, snapshot_ids=list(snapshot_ids),
                                   state=S.NODE_PLANNED, error="", updated_at=now))
        self.s.flush()

    def restore_nodes(self, test_id: int) -> list[RestoreNode]:
        return list(self.s.scalars(select(RestoreNode).where(RestoreNode.test_id == test_id)
                                   .order_by(RestoreNode.position)))

    def restore_node(self, test_id: int, node: str) -> RestoreNode | None:
        return self.s.scalar(select(RestoreNode).where(RestoreNode.test_id == test_id, RestoreNode.node == node))

    def report_restore_node(self, test_id: int, node: str, *, state: str = "", cleanup: str = "",
                            error: str = "", blames_set: bool = False, seconds: float | None = None) -> RestoreNode:
        """What a drill job's Prolog (state READY or FAILED) or Epilog (cleanup
        CLEANED or LEFT) did on its node."""
        if (state and state not in S.NODE_STATES) or (cleanup and cleanup not in S.NODE_CLEANUPS) \
                or bool(state) == bool(cleanup):
            raise ValueError(f"restore node report state={state!r} cleanup={cleanup!r}")
        row = self.restore_node(test_id, node)
        if row is None:
            raise NotFound(what="drill node", value=f"{node} of restore test {test_id}")
        row.updated_at = utcnow()
        if state:
            row.state, row.error, row.blames_set = state, error[:4000], bool(blames_set)
            if seconds is not None:
                row.seconds = seconds
        else:
            row.cleanup, row.cleanup_error = cleanup, error[:4000]
        self.s.flush()
        return row

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
