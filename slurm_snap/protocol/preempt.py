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
                   (and the shared ones on the head node: once), keep what it
                   did in the node's spool and deliver it; the delivery that
                   records the last expected part finalizes, under the set's
                   row lock. When the service or the database does not
                   answer, the node still cuts, from job.json and the acks
                   (both on the shared filesystem), under names it computes
                   alone (cutter.part_name), and its node agent delivers the
                   spool entry when the inventory answers again.
  Prolog of the requeued run
                   prepare_resume: resume.json names the newest
                   app-consistent set's step and where each rank's checkpoint
                   is inside the snapshot, after the controller brought
                   node-local parts to the nodes the ranks now run on
                   (protocol.resume, protocol.nodelocal).

A job that asked for --snapshot-before-timelimit and stopped before its
time limit takes the same path; its set's trigger is "timelimit"
(hooks.jobhooks says which), carried to the inventory by every record of
the cut: the set's opening, the spool entry and the cut record.

Preemption sets have no owner process (many hooks on many hosts take turns):
their deadline is what tells serve's sweeper (and repair) they are
abandoned. What a hook records goes through protocol/recorder.py (in this
process, or through the service on a node without the database).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
import typing

from ..clock import utcnow
from ..errors import INVENTORY, BadValueError, SnapError, SpoolError
from ..jobdir import JobDir
from ..jobrecords import (CutPart, CutRecord, JobRecord, ReleaseRecord, ResumeRecord, VolumeRecord,
                          preempt_epoch, preempt_restart)
from ..spool.outbox import Outbox
from ..spool.records import SpoolEntry
from .. import states as S
from .barrier import AckCollector
from .cutter import CutResult, assign_manifests, cut_all, preempt_names
from .delivery import cut_part
from .preemptset import as_time, open_set
from .recorder import LocalRecorder, recorder_for

log = logging.getLogger(__name__)


class Marked(typing.NamedTuple):
    set_id: int
    created: bool    # False: a node Epilog had opened it already
    state: str


def epilogslurmctld_mark(cfg, inventory, job, preempt_time, *, clock=utcnow, trigger: str = "preempt") -> Marked:
    """Open the preemption (or time-limit) set (QUIESCING, requested at the
    request's lower bound); idempotent."""
    t = as_time(preempt_time) or clock()
    with inventory.session() as repo:
        run, st, created = open_set(repo, cfg, job.job_id, job.restart_count, preempt_time=t, now=clock(),
                                    trigger=trigger)
        if st.state == S.PENDING:
            repo.transition(st.id, S.QUIESCING, at=t)
        # Under load the node Epilogs may have opened (even finalized) it first.
        # t is a lower bound (PreemptTime less GraceTime and a slack): say so;
        # the ranks' acknowledgements replace it with when the signal came.
        at = "preemption" if trigger == "preempt" else "its time limit"
        repo.event("preempt", f"set {st.id} ({st.epoch}) opened at {at}, requested no earlier than "
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


def away(exc: BaseException) -> bool:
    """The inventory did not answer (the service is unreachable, or it or
    this host's database reported the database away): what a node keeps in
    its spool and retries, as opposed to a refusal of what it sent."""
    return isinstance(exc, SnapError) and exc.exit_code == INVENTORY


@dataclasses.dataclass(frozen=True)
class _Share:
    """What this node's Epilog cuts and for which set, from the inventory
    when it answers, else from job.json alone."""

    set_id: int | None
    restart_count: int
    uid: int
    nodes: tuple[str, ...]
    volumes: tuple[VolumeRecord, ...]

    @property
    def epoch(self) -> str:
        return preempt_epoch(self.restart_count)


def _from_inventory(opened) -> _Share:
    return _Share(set_id=opened.set_id, restart_count=preempt_restart(opened.epoch), uid=opened.uid,
                  nodes=tuple(opened.nodes), volumes=tuple(opened.volumes))


def _from_job_file(cfg, job, known: JobRecord, refusal) -> _Share:
    """job.json's volumes, each given a stand-in id for the cut (the rows'
    ids are the inventory's) and re-checked as the Prolog checked them: no
    refused path reaches a backend, inventory or not."""
    nodes = tuple(known.nodes or job.nodes or (job.node,))
    volumes = []
    for i, v in enumerate(known.volumes):
        vc = cfg.volume_class(v.volume_class)
        v = dataclasses.replace(v, id=-(i + 1), backend=vc.backend if vc else "", site=vc.site if vc else "",
                                region=vc.region if vc else "")
        mine = (v.scope == "node-local" and v.node == job.node) or (v.scope == "shared" and job.node == nodes[0])
        if mine and refusal is not None:
            why = refusal(v)
            if why:
                v = dataclasses.replace(v, refused=why)
        volumes.append(v)
    return _Share(set_id=None, restart_count=known.restart_count, uid=job.uid, nodes=nodes, volumes=tuple(volumes))


def _cut_part(r: CutResult) -> CutPart:
    return cut_part(r.volume, r.record())


def epilog_cut(cfg, inventory, job, *, preempt_time=None, killed_at=None, clock=utcnow, backend_for=None,
               hook=None, remaining: float | None = None, refusal=None, trigger: str = "preempt") -> str:
    """One node's share of the preemption set. Returns a one-line summary.

    `preempt_time` is the request's lower bound (PreemptTime less GraceTime
    and a slack, hooks.jobhooks), None when Slurm could not be asked;
    `killed_at` Slurm's PreemptTime itself, which the Epilogs see as the
    kill: the release time when rank 0 did not requeue the job (defaults to
    `preempt_time`).

    `remaining` is what is left of the hook's budget (hooks.policy.remaining();
    the whole hook_budget when None): the cut gets that less what recording
    needs, so a slow backend becomes a MISSING part recorded here.

    Without the inventory (the service or the database does not answer) the
    node cuts what job.json says is its share, each volume checked again by
    `refusal(volume) -> why` (the Prolog's check), and keeps the entry in
    its spool for the node agent.

    `trigger` is the set's: "preempt", or "timelimit" when the job stopped
    before its time limit (--snapshot-before-timelimit; then `killed_at` is
    when it stopped). It travels in the spool entry and the cut record, so
    a time-limit set is one however late its parts are delivered."""
    deadline = time.monotonic() + (cfg.timeouts.hook_budget if remaining is None else remaining)
    hook = hook or (lambda phase: None)
    rec = recorder_for(cfg, inventory)
    if isinstance(rec, LocalRecorder):
        rec.clock = clock
    elif hasattr(rec, "reply_timeout"):
        # A service that accepts and then does not answer must not hold the
        # cut: each exchange gets a quarter of what the hook has left.
        rec.reply_timeout = max(2.0, (deadline - time.monotonic()) / 4)
    node = job.node
    t_pre = as_time(preempt_time)
    t_kill = as_time(killed_at) or t_pre
    jobdir = JobDir(cfg.paths.barrier_dir, job.job_id)
    # The preempted run's job.json: what this node cuts when the inventory does
    # not answer, and, in its cut record, what the requeued run is judged by.
    known = _job_file(jobdir)
    offline = ""
    try:
        opened = rec.open(job_id=job.job_id, restart_count=job.restart_count, node=node,
                          nodes=list(job.nodes or []), preempt_time=t_pre.timestamp() if t_pre else None,
                          # Named only when it is not the default, which a
                          # service older than this option still answers.
                          **({} if trigger == "preempt" else {"trigger": trigger}))
    except SnapError as exc:
        if not away(exc):
            raise
        opened, offline = None, str(exc)
    if opened is not None:
        if opened.state not in (S.PENDING, S.QUIESCING, S.CUTTING):
            return f"set {opened.set_id} ({opened.epoch}) is already {opened.state}; nothing to cut on {node}"
        share = _from_inventory(opened)
    else:
        if known is None:
            raise SnapError(f"cannot record ({offline}) and the job's job.json is missing or unreadable, so "
                            "there is nothing this node knows to cut")
        share = _from_job_file(cfg, job, known, refusal)
    set_id, epoch, nodes, volumes = share.set_id, share.epoch, list(share.nodes), list(share.volumes)
    head = nodes[0]
    mine = [v for v in volumes if (v.scope == "node-local" and v.node == node)
            or (v.scope == "shared" and node == head)]
    dirs = None
    try:
        dirs = jobdir.ensure(share.uid)
        with AckCollector(dirs.ack, job_id=job.job_id, epoch=epoch, nodes=nodes, owner_uid=share.uid,
                          node_filter=None if node == head else node, clock=clock) as collector:
            collector.rescan()
        acks = collector.state.records()
        unrecorded = acks
        if set_id is not None:
            try:
                became = rec.cutting(set_id=set_id, acks=acks)
                unrecorded = []
                if became:
                    return f"set {set_id} became {became}; nothing to cut on {node}"
            except SnapError as exc:
                if not away(exc):
                    raise
                offline = str(exc)
        hook("cutting")
        entries, _outside = assign_manifests(volumes, [(a.node, a.manifest) for a in acks])
        if backend_for is None:
            from ..backends.factory import backend_for_volume

            # Node-local volumes are on this very host: no SSH to ourselves.
            backend_for = lambda v: backend_for_volume(cfg, v, local=v.scope == "node-local")  # noqa: E731
        budget = cut_budget(deadline - time.monotonic())
        results = cut_all(mine, job_id=job.job_id, set_id=set_id or 0, backend_for=backend_for, entries=entries,
                          clock=clock, budget=budget, name_for=preempt_names(job.job_id, share.restart_count))
        hook("cut")
        parts = tuple(_cut_part(r) for r in results)
        _write_cut_record(dirs, CutRecord(epoch=epoch, node=node, parts=parts, set_id=set_id,
                                          preempt_time=t_pre.timestamp() if t_pre else None,
                                          job=known if known is not None and known.restart_count == share.restart_count
                                          else None, trigger=trigger))
        entry = SpoolEntry(job_id=job.job_id, restart_count=share.restart_count, node=node, nodes=tuple(nodes),
                           uid=share.uid, written_at=clock(), parts=parts,
                           acks=tuple(unrecorded), set_id=set_id,
                           preempt_time=t_pre.timestamp() if t_pre else None,
                           killed_at=t_kill.timestamp() if t_kill else None,
                           early=_early_decision(dirs, epoch, share.uid) if node == head else None, offline=offline,
                           job=known if known is not None and known.restart_count == share.restart_count else None,
                           partition=getattr(job, "partition", "") or "",
                           options=job.options() if hasattr(job, "options") else {}, trigger=trigger)
        out = _keep_and_deliver(cfg, rec, entry)
        hook("record")
        return out
    finally:
        if dirs is not None:
            try:
                dirs.write_release(ReleaseRecord(epoch=epoch, set_id=set_id))
            except OSError as exc:
                log.error("job %s: cannot write release/%s: %s", job.job_id, epoch, exc)


def _write_cut_record(dirs: JobDir, record: CutRecord) -> None:
    """Beside the acknowledgements, for the requeued run's head node when the
    service cannot be asked; a failure here costs only that fallback."""
    try:
        dirs.write_cut(record)
    except (OSError, SnapError) as exc:
        log.error("job %s: cut record of %s not written: %s", dirs.job_id, record.node, exc)


def _keep_and_deliver(cfg, rec, entry: SpoolEntry) -> str:
    """Keep the entry in this node's spool, then deliver it now unless the
    inventory is away. Older entries (a backlog from while it was away) are
    the node agent's, delivered oldest first; every hook's exit starts it
    when the spool holds something. Entries are independent (one per node,
    job and epoch), so this one need not wait behind them."""
    cut = sum(p.ok for p in entry.parts)
    did = f"{entry.node} cut {cut}/{len(entry.parts)} volumes of job {entry.job_id}'s {entry.epoch}"
    outbox = Outbox.of(cfg)
    try:
        name = outbox.put(entry)
    except (SpoolError, OSError) as exc:
        if entry.offline:
            # Cut, but nowhere to keep its record: say so loudly (the policy
            # records the failure; the snapshots are on disk under names
            # repair recognises).
            raise SpoolError(directory=cfg.spool.directory,
                             why=f"{did} without the inventory ({entry.offline}) and could not keep the record: "
                                 f"{exc}") from None
        log.error("job %s: %s", entry.job_id, exc)
        name = None
    if entry.offline:
        return f"{did} without the inventory ({entry.offline}); kept in its spool for the node agent"
    try:
        delivered = rec.deliver(entry=entry)
    except SnapError as exc:
        if name is None:
            raise
        return f"{did}; not recorded now ({exc}); kept in its spool for the node agent"
    if name is not None:
        outbox.remove(name)
    return delivered.summary


def ranks_saw_preemption(cfg, job) -> str:
    """What this node's ranks say when Slurm cannot be asked (slurmctld
    restarting, or this node cut off from the controller): every local rank
    acknowledged this run's preemption epoch (job.json's restart count). A
    rank checkpoints for that epoch only when its job saw the signal with no
    request and Slurm showed rank 0 a PreemptTime, or the job asked for
    --snapshot-before-timelimit and its time limit was near (client/reason.py:
    a stray signal is no checkpoint), so the files are the stop's trace on
    the shared filesystem (hooks.jobhooks tells which of the two). Returns a
    sentence saying so, or "" when they do not."""
    jobdir = JobDir(cfg.paths.barrier_dir, job.job_id)
    known = _job_file(jobdir)
    if known is None or not os.path.isdir(jobdir.ack):
        return ""
    epoch = preempt_epoch(known.restart_count)
    with AckCollector(jobdir.ack, job_id=job.job_id, epoch=epoch, nodes=list(known.nodes or [job.node]),
                      owner_uid=job.uid, node_filter=job.node) as collector:
        collector.rescan()
    if job.node not in collector.state.complete:
        return ""
    return f"every local rank of {job.node} acknowledged {epoch}"


def _job_file(jobdir: JobDir) -> JobRecord | None:
    """job.json as the Prolog wrote it, or None (logged) when it cannot be read."""
    try:
        return jobdir.read_job()
    except (OSError, BadValueError) as exc:
        log.error("job %s: job.json not read: %s", jobdir.job_id, exc)
        return None


def prepare_resume(cfg, inventory, job, *, budget: float | None = None) -> ResumeRecord | None:
    """Write resume.json for a requeued run from the newest app-consistent
    set, after its node-local parts were brought to where the ranks now run
    (protocol.resume; within `budget` seconds and restore.move_budget).
    When the service or the database does not answer, from the files the
    preempted run's Epilogs left on the shared filesystem
    (protocol.resume.resume_from_files)."""
    from .resume import resume_from_files

    jobdir = JobDir(cfg.paths.barrier_dir, job.job_id)
    try:
        found = recorder_for(cfg, inventory).resume_point(job_id=job.job_id, nodes=list(job.nodes or [job.node]),
                                                          restart_count=job.restart_count, budget=budget)
    except SnapError as exc:
        if not away(exc) or job.restart_count < 1:
            raise
        resume = resume_from_files(cfg, jobdir, job.restart_count - 1, nodes=list(job.nodes or [job.node]),
                                   wanted=job.options().get("consistency") or S.WANT_APP, uid=job.uid)
        if resume is None:
            raise
        log.warning("job %s: resume point from the shared files (%s)", job.job_id, exc)
        jobdir.ensure(job.uid).write_resume(resume)
        return resume
    if found is None:
        return None
    jobdir.ensure(found.uid).write_resume(found.resume)
    return found.resume


def _early_decision(dirs: JobDir, epoch: str, owner_uid: int):
    """Rank 0's early-release decision, if it wrote one the Epilog can read
    (the job's user writes ack/: a malformed one is logged, never fatal)."""
    try:
        return dirs.read_early(epoch, owner_uid)
    except (OSError, BadValueError) as exc:
        log.warning("job %s: early-release decision for %s not read: %s", dirs.job_id, epoch, exc)
        return None
