"""The preemption path, driven by Slurm's hooks instead of a coordinator.

At preemption Slurm signals every rank itself (preempt_send_user_signal); the
ranks acknowledge epoch `preempt-<restart count of the running run>`. Then:

  EpilogSlurmctld  epilogslurmctld_mark: open the set in QUIESCING with
                   requested_at = PreemptTime, so a set whose node Epilogs
                   never run is still visible and repair can label it.
  Epilog (each node, after the job's processes are gone)
                   epilog_cut: get-or-create the same set, record this node's
                   acks (the head node records every node's, since it cuts
                   the shared volumes), cut this node's node-local volumes
                   (and the shared ones on the head node: once), record the
                   parts; the Epilog that records the last expected part
                   finalizes, under the set's row lock.
  Prolog of the requeued run
                   prepare_resume: resume.json names the newest
                   app-consistent set's step and where each rank's checkpoint
                   is inside the snapshot, after the controller brought
                   node-local parts to the nodes the ranks now run on
                   (protocol.resume, protocol.nodelocal).

Preemption sets have no owner process (many hooks on many hosts take turns):
their deadline is what tells repair they are abandoned. What a hook records
goes through protocol/recorder.py (in this process, or through the service
on a node without the database).
"""
from __future__ import annotations

import logging
import time
import typing

from ..clock import utcnow
from ..errors import BadValueError
from ..jobdir import JobDir
from ..jobrecords import ReleaseRecord, ResumeRecord
from .. import states as S
from .barrier import AckCollector
from .cutter import assign_manifests, cut_all
from .recorder import LocalRecorder, as_time, open_set, recorder_for

log = logging.getLogger(__name__)


class Marked(typing.NamedTuple):
    set_id: int
    created: bool    # False: a node Epilog had opened it already
    state: str


def epilogslurmctld_mark(cfg, inventory, job, preempt_time, *, clock=utcnow) -> Marked:
    """Open the preemption set (QUIESCING, requested at PreemptTime); idempotent."""
    t = as_time(preempt_time) or clock()
    with inventory.session() as repo:
        run, st, created = open_set(repo, cfg, job.job_id, job.restart_count, preempt_time=t, now=clock())
        if st.state == S.PENDING:
            repo.transition(st.id, S.QUIESCING, at=t)
        # Under load the node Epilogs may have opened (even finalized) it first.
        # t is a lower bound (PreemptTime less GraceTime and a slack): say so;
        # the ranks' acknowledgements replace it with when the signal came.
        repo.event("preempt", f"set {st.id} ({st.epoch}) opened at preemption, requested no earlier than "
                   f"{t:%Y-%m-%dT%H:%M:%SZ}"
                   + ("" if created else f" (already {st.state}: opened by a node Epilog)"),
                   job_id=job.job_id, set_id=st.id)
        return Marked(st.id, created, st.state)


# How much of an Epilog's budget recording the parts and the verdict needs
# (one or two transactions, or a round trip to the service): the cut gets
# the rest, so a slow backend ends as a MISSING part this Epilog records and
# finalizes, not as an Epilog killed by Slurm with nothing recorded.
RECORD_RESERVE = 3.0


def cut_budget(remaining: float) -> float:
    """Seconds the cut may take: what is left of the hook's budget less the
    reserve for recording (a quarter of what is left when that is short)."""
    return max(0.5, remaining - min(RECORD_RESERVE, remaining / 4))


def epilog_cut(cfg, inventory, job, *, preempt_time=None, killed_at=None, clock=utcnow, backend_for=None,
               hook=None, remaining: float | None = None) -> str:
    """One node's share of the preemption set. Returns a one-line summary.

    `preempt_time` is the request's lower bound (PreemptTime less GraceTime
    and a slack, hooks.jobhooks); `killed_at` Slurm's PreemptTime itself,
    which the Epilogs see as the kill: the release time when rank 0 did not
    requeue the job (defaults to `preempt_time`).

    `remaining` is what is left of the hook's budget (hooks.policy.remaining();
    the whole hook_budget when None): the cut gets that less what recording
    needs, so a slow backend becomes a MISSING part recorded here."""
    deadline = time.monotonic() + (cfg.timeouts.hook_budget if remaining is None else remaining)
    hook = hook or (lambda phase: None)
    rec = recorder_for(cfg, inventory)
    if isinstance(rec, LocalRecorder):
        rec.clock = clock
    node = job.node
    t_pre = as_time(preempt_time)
    t_kill = as_time(killed_at) or t_pre
    opened = rec.open(job_id=job.job_id, restart_count=job.restart_count, node=node,
                      nodes=list(job.nodes or []), preempt_time=t_pre.timestamp() if t_pre else None)
    set_id, epoch, state, uid = opened.set_id, opened.epoch, opened.state, opened.uid
    nodes = list(opened.nodes)
    volumes = list(opened.volumes)
    if state not in (S.PENDING, S.QUIESCING, S.CUTTING):
        return f"set {set_id} ({epoch}) is already {state}; nothing to cut on {node}"
    head = nodes[0]
    mine = [v for v in volumes if (v.scope == "node-local" and v.node == node)
            or (v.scope == "shared" and node == head)]
    dirs = None
    try:
        dirs = JobDir(cfg.paths.barrier_dir, job.job_id).ensure(uid)
        with AckCollector(dirs.ack, job_id=job.job_id, epoch=epoch, nodes=nodes, owner_uid=uid,
                          node_filter=None if node == head else node, clock=clock) as collector:
            collector.rescan()
        acks = collector.state.records()
        became = rec.cutting(set_id=set_id, acks=acks)
        if became:
            return f"set {set_id} became {became}; nothing to cut on {node}"
        hook("cutting")
        entries, _outside = assign_manifests(volumes, [(a.node, a.manifest) for a in acks])
        if backend_for is None:
            from ..backends.factory import backend_for_volume

            # Node-local volumes are on this very host: no SSH to ourselves.
            backend_for = lambda v: backend_for_volume(cfg, v, local=v.scope == "node-local")  # noqa: E731
        budget = cut_budget(deadline - time.monotonic())
        results = cut_all(mine, job_id=job.job_id, set_id=set_id, backend_for=backend_for, entries=entries,
                          clock=clock, budget=budget)
        hook("cut")
        decided = _early_decision(dirs, epoch, uid) if node == head else None
        out = rec.record(set_id=set_id, job_id=job.job_id, node=node, parts=[r.record() for r in results],
                         preempt_known=t_pre is not None, early=decided,
                         preempt_time=t_kill.timestamp() if t_kill else None)
        hook("record")
        return out
    finally:
        if dirs is not None:
            try:
                dirs.write_release(ReleaseRecord(epoch=epoch, set_id=set_id))
            except OSError as exc:
                log.error("job %s: cannot write release/%s: %s", job.job_id, epoch, exc)


def prepare_resume(cfg, inventory, job, *, budget: float | None = None) -> ResumeRecord | None:
    """Write resume.json for a requeued run from the newest app-consistent
    set, after its node-local parts were brought to where the ranks now run
    (protocol.resume; within `budget` seconds and restore.move_budget)."""
    found = recorder_for(cfg, inventory).resume_point(job_id=job.job_id, nodes=list(job.nodes or [job.node]),
                                                      restart_count=job.restart_count, budget=budget)
    if found is None:
        return None
    JobDir(cfg.paths.barrier_dir, job.job_id).ensure(found.uid).write_resume(found.resume)
    return found.resume


def _early_decision(dirs: JobDir, epoch: str, owner_uid: int):
    """Rank 0's early-release decision, if it wrote one the Epilog can read
    (the job's user writes ack/: a malformed one is logged, never fatal)."""
    try:
        return dirs.read_early(epoch, owner_uid)
    except (OSError, BadValueError) as exc:
        log.warning("job %s: early-release decision for %s not read: %s", dirs.job_id, epoch, exc)
        return None
