"""Queries about volumes the node Prolog refused (migration 0004).

A refused volume keeps its row (the job declared it) with when and why it
was refused: the job runs without that protection, report and show say so,
and no cut acts on the path. Functions over the Repository of one
`Inventory.session()`, beside the other query modules of this package.
"""
from __future__ import annotations

from typing import Sequence

from sqlalchemy import and_, exists, func, select, update

from ..clock import utcnow
from .models import JobRun, SnapshotSet, Volume
from ..jobrecords import VolumeRecord
from .records import Refusal, SetFilter  # noqa: F401 (Refusal re-exported)
from .reports import filter_conds


def record(repo, *, job_id: int, restart_count: int, user_name: str, uid: int, partition: str,
           nodes: Sequence[str], options: dict, specs: Sequence[VolumeRecord], refused: Sequence[Refusal]) -> int:
    """Mark the refused volumes of a run, creating the run and its volume rows
    first if PrologSlurmctld (which records them in the background, about
    0.3 s after the launch) has not yet: the refusal must not wait for it.
    Idempotent (a rerun of the Prolog keeps the first refusal's time)."""
    run = repo.record_job_run(job_id=job_id, restart_count=restart_count, user_name=user_name, uid=uid,
                              partition=partition, nodes=nodes, options=options)
    repo.add_volumes(run, specs)
    now = utcnow()
    n = 0
    for r in refused:
        n += repo.s.execute(update(Volume).where(Volume.job_run_id == run.id, Volume.path == r.path,
                                                 Volume.node == r.node, Volume.refused_at.is_(None))
                            .values(refused_at=now, refusal=r.why[:2000])).rowcount or 0
    return n


def of_runs(repo, run_ids: Sequence[int]) -> dict[int, list[Refusal]]:
    """Refused volumes per run id."""
    if not run_ids:
        return {}
    rows = repo.s.execute(select(Volume.job_run_id, Volume.node, Volume.path, Volume.refusal)
                          .where(Volume.job_run_id.in_(list(run_ids)), Volume.refused_at.is_not(None))
                          .order_by(Volume.job_run_id, Volume.id))
    out: dict[int, list[Refusal]] = {}
    for run_id, node, path, why in rows:
        out.setdefault(run_id, []).append(Refusal(node or "", path, why or ""))
    return out


def unprotected_runs(repo, f: SetFilter) -> list:
    """Runs matching report's filter (created within its window) that have a
    refused volume and no snapshot set: what report must not leave out.
    Plain rows: run_id, job_id, restart_count, user_name, partition, nodes,
    created_at, declared (volumes of the run)."""
    declared = (select(func.count()).select_from(Volume).where(Volume.job_run_id == JobRun.id)
                .correlate(JobRun).scalar_subquery())
    q = (select(JobRun.id.label("run_id"), JobRun.job_id, JobRun.restart_count, JobRun.user_name,
                JobRun.partition, JobRun.nodes, JobRun.snapshot_every, JobRun.sluid, JobRun.created_at, declared.label("declared"))
         .where(exists().where(and_(Volume.job_run_id == JobRun.id, Volume.refused_at.is_not(None))),
                ~exists().where(SnapshotSet.job_run_id == JobRun.id)))
    conds = filter_conds(f, job_id=JobRun.job_id, user=JobRun.user_name, at=JobRun.created_at, state=None)
    return list(repo.s.execute(q.where(*conds).order_by(JobRun.created_at, JobRun.id)).mappings())
