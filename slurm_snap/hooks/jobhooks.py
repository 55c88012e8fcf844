"""What each Slurm hook does for an opted-in job.

  PrologSlurmctld  (controller, root)  record the job run and every volume on every node
  Prolog           (each node, root)   prepare this node's volumes and the barrier directory;
                                       a requeued run gets resume.json. It does not touch the
                                       inventory otherwise: importing the ORM alone costs more
                                       than the 100 ms an opted-in job's start may pay.
  EpilogSlurmctld  (controller, root)  at preemption or the time limit, open the set (requested at
                                       PreemptTime); requeue a job that reached its time limit
  Epilog           (each node, root)   at preemption or the time limit, cut this node's volumes,
                                       record, finalize

A restore drill's own Slurm job (--snapshot-drill) is no job to protect: its
hooks are drillhooks.py's.

Each is idempotent (Slurm may run a hook twice) and runs under hooks.policy.
"""
from __future__ import annotations

import os
import time

from .. import paths
from ..config import Config
from ..errors import PathError, SnapError, Unsupported, VolumesRefused
from ..jobrecords import BY_EPILOG, SIGNAL_SLACK, JobRecord, TimeLimitRecord, VolumeRecord, preempt_epoch
from ..lazylog import getLogger
from ..record import record
from ..slurm import hooknames
from ..slurm.jobenv import JobEnv
from ..jobdir import JobDir
from .policy import OverBudget, remaining
from .volumes import check_snapshottable, parse_declaration, specs_for_job

log = getLogger(__name__)

# Seconds between the preemption and the kill beyond GraceTime (SLURM-LAB.md).
PREEMPT_SLACK = 12


def record_job(cfg: Config, inv, job: JobEnv) -> str:
    """PrologSlurmctld's work: record the job run and every volume (idempotent).

    Two names: `prolog-slurmctld` is what the entry point runs before the
    launch (RECORD=foreground: policy closed, the job must not start
    unrecorded); `prolog-slurmctld-record` is what it starts with `setsid -f`
    after handing the launch back (RECORD=background, the default), so the
    launch waits for no Python (prolog/slurm-snap-prolog-slurmctld)."""
    declared = parse_declaration(cfg, job.volumes)
    specs = specs_for_job(cfg, declared, job.nodes or [job.node], job.job_id)
    every, why = cfg.snapshot_every(job.partition, job.every)
    options = job.options()
    if job.resume_cmd:
        # Its restore drills run with the GPUs/GRES it had (restore/submit.py).
        from ..slurm.commands import job_gres

        try:
            options.update(job_gres(job.job_id, timeout=cfg.timeouts.slurm_command))
        except SnapError as exc:
            log.warning("job %s: its GRES not recorded (its drills will ask for none): %s", job.job_id, exc)
    with inv.session() as repo:
        run = repo.record_job_run(job_id=job.job_id, restart_count=job.restart_count, user_name=job.user,
                                  uid=job.uid, partition=job.partition, nodes=job.nodes, options=options,
                                  snapshot_every=every, sluid=job.sluid)
        repo.add_volumes(run, specs)
        repo.event("hook", f"recorded {len(specs)} volumes on {len(job.nodes)} nodes", job_id=job.job_id)
        if every is not None:
            asked = f" (asked {job.every} s; {why})" if why and job.every is not None else (f" ({why})" if why else "")
            repo.event("hook", f"periodic snapshots every {every} s{asked}", job_id=job.job_id)
    return f"recorded {len(specs)} volumes" + (f", a snapshot every {every} s" if every is not None else "")


def prolog(cfg: Config, inv, job: JobEnv) -> str:
    if job.restart_count > 0:
        # A requeued run: this node may still hold the preempted run's spool
        # entry, and the head node's resume point waits for it. Deliver now,
        # not after the agent's backoff (one scandir when the spool is empty).
        from ..nodeagent.agent import kick

        kick(cfg, reached_service=True)
    declared = parse_declaration(cfg, job.volumes)
    specs = specs_for_job(cfg, declared, job.nodes or [job.node], job.job_id)
    mine = [s for s in specs if s.node == job.node or (s.scope == "shared" and job.node == job.head_node)]
    per_job = {(d.vc.name) for d in declared if d.rel is None}
    refused = []
    for spec in mine:
        try:
            _prepare_volume(cfg, spec, job, create=spec.volume_class in per_job and _is_class_path(cfg, spec, job))
        except PathError as exc:
            # The declaration is at fault, not the node: prepare the others,
            # then make sure the user hears of it (below).
            from ..inventory.records import Refusal

            refused.append(Refusal(node=spec.node, path=spec.path, why=exc.kwargs.get("why") or str(exc)))
    if refused and cfg.hooks.failure_policy == "closed":
        # The job will not run: no notice to print, but report/show say why.
        raise VolumesRefused(job.node, refused, recorded=_record_refusals(cfg, inv, job, specs, refused))
    jobdir = JobDir(cfg.paths.barrier_dir, job.job_id).prepare(job.uid, job.gid)
    resuming = job.restart_count > 0 and job.node == job.head_node
    told: list[str] = []
    try:
        jobdir.write_job(JobRecord(job_id=job.job_id, restart_count=job.restart_count, user=job.user,
                                   nodes=tuple(job.nodes), signal=cfg.protocol.checkpoint_signal,
                                   volumes=tuple(specs)))
        if refused:
            # Told three ways: the job's own output (the SPANK plugin prints
            # this node's Prolog file in every step), the inventory
            # (report/show), and the hook log.
            told = [f"prolog on {job.node} refused --snapshot-volumes {r.path}: {r.why}; the job runs without "
                    f"snapshots of it (slurm-snap show {job.job_id})" for r in refused]
            raise VolumesRefused(job.node, refused, recorded=_record_refusals(cfg, inv, job, specs, refused))
        resumed = ""
        if resuming:
            from ..protocol import preempt

            left = remaining()
            # What is left of the hook's budget, less the time to write
            # resume.json and this node's file once the moves are done.
            info = preempt.prepare_resume(cfg, inv, job, budget=None if left is None else max(0.0, left - 5.0))
            resumed = f"; resume point: {info.to_json()}" if info else "; no app-consistent set to resume from"
            if info and info.missing:
                # The job's output says which parts its ranks start without
                # (the SPANK plugin prints this node's file in every step).
                told = [f"resuming from set {info.set_id} without {m} (slurm-snap show {job.job_id})"
                        for m in info.missing]
        return f"prepared {len(mine)} volumes on {job.node}{resumed}"
    except VolumesRefused:
        raise
    except BaseException as exc:
        # Whatever ended this Prolog (the policy records it), the job's steps
        # wait for this node's file: say so there too, rather than leave
        # them waiting out their bound in silence.
        why = "its time budget ran out" if isinstance(exc, OverBudget) else f"{exc.__class__.__name__}: {exc}"
        told = [f"prolog on {job.node} failed ({why}); the job may run without snapshots "
                f"(slurm-snap show {job.job_id})"]
        raise
    finally:
        try:
            jobdir.write_prolog_done(job.node, job.restart_count, told)
        except (OSError, SnapError) as exc:
            log.error("job %s: prolog file for %s not written: %s", job.job_id, job.node, exc)


def _record_refusals(cfg: Config, inv, job: JobEnv, specs: list, refused: list) -> bool:
    """Into the inventory (through the service on a node); False if that
    failed, which is logged and left to the policy's own failure record: the
    refusal itself is what the hook reports either way."""
    from ..protocol.recorder import JobFacts, recorder_for

    try:
        recorder_for(cfg, inv).refused(job=JobFacts.of(job), node=job.node, specs=list(specs), refused=list(refused))
        return True
    except SnapError as exc:
        log.error("job %s: refusal not recorded in the inventory: %s", job.job_id, exc)
        return False


def _is_class_path(cfg: Config, spec: VolumeRecord, job: JobEnv) -> bool:
    vc = cfg.volume_class(spec.volume_class)
    return vc is not None and spec.path == vc.job_path(spec.node or None, job.job_id)


def _prepare_volume(cfg: Config, spec: VolumeRecord, job: JobEnv, *, create: bool) -> None:
    """Per-job volumes are created owned by the user; declared paths must already
    be theirs. Either way nothing below an allowed root is reached through a link."""
    vc = cfg.volume_class(spec.volume_class)
    roots = tuple(cfg.paths.allowed_roots) or (vc.prefix_for(spec.node or None),)
    if create:
        # <prefix>/jobs is root's; each job's volume inside it is the user's.
        parent = os.path.dirname(spec.path)
        paths.resolve(vc.prefix_for(spec.node or None), roots, must_exist=True)
        if not paths.resolve(parent, roots, must_exist=False).exists:
            os.makedirs(parent, mode=0o755, exist_ok=True)
    r = paths.resolve(spec.path, roots, must_exist=not create)
    if r.exists:
        if r.uid != job.uid:
            raise PathError(spec.path, f"owned by uid {r.uid}, not by the job's user {job.user} (uid {job.uid})")
        if not create:
            # What the submit host could not see for a node-local path.
            check_snapshottable(vc, spec.path, r.ino)
        return
    from ..backends.factory import backend_for_class

    backend = backend_for_class(cfg, vc, spec.node or None, local=True)
    try:
        backend.create_volume(spec.path)
    except (Unsupported, AttributeError):
        os.mkdir(spec.path, 0o750)
    os.chown(spec.path, job.uid, job.gid, follow_symlinks=False)
    os.chmod(spec.path, 0o750)


@record
class Stop:
    """Why the epilogs of an opted-in job cut a set, from squeue and the
    time-limit record: `trigger` is "preempt" or "timelimit" ("" for
    nothing to do, and `why` says why); `requested` the request's lower bound
    and `ended` when Slurm ended the run (its PreemptTime, which the epilogs
    see as the kill, or the time limit's moment), epoch seconds. `at_limit`:
    the job reached its time limit and nobody has requeued it yet."""

    trigger: str
    why: str = ""
    requested: int = 0
    ended: int = 0
    at_limit: bool = False


def _why_stopped(cfg: Config, job: JobEnv) -> Stop:
    """Nothing in the hooks' environment says "preempted" or "time limit"
    (docs/design.md, "What the epilogs see at a preemption"); squeue does:
    the job is COMPLETING with a PreemptTime in both EpilogSlurmctld and the
    node Epilog, and PreemptTime is 0 after a normal end, scancel or scontrol
    requeue. By the time the epilogs run, PreemptTime is the end of the
    grace period (the kill), not the moment the signal went out. The ranks'
    acknowledgements are written inside the grace period, so the request
    time is PreemptTime - GraceTime, less the lag of slurmctld's periodic
    grace check (measured up to ~10 s) and the one-second resolution.

    A job that asked for --snapshot-before-timelimit stopped for its limit
    when squeue says Reason=TimeLimit (it reached it; nobody requeued it
    yet), or, once requeued, when the time-limit record of its run exists
    (written by whoever requeued it, before the requeue: squeue first, the
    record after, so one of them always tells).

    A squeue that fails is an error, never "not preempted": that answer once
    hid an EpilogSlurmctld that could not reach slurmctld at all.
    """
    if not (job.on_preempt or job.timelimit):
        return Stop("", "neither --snapshot-on-preempt nor --snapshot-before-timelimit")
    from ..slurm.api import for_hook

    info = for_hook().job(job.job_id, timeout=cfg.timeouts.slurm_command)
    if info.preempt_time:
        if not job.on_preempt:
            return Stop("", "preempted, but not --snapshot-on-preempt")
        t = info.preempt_time
        return Stop("preempt", requested=max(1, t - _grace_seconds(cfg, job) - PREEMPT_SLACK), ended=t)
    if job.timelimit:
        if info.state_reason == TIME_LIMIT_REASON:
            # squeue's end_time is the kill until a requeue makes it the next
            # run's (measured, 22.05: Reason stays TimeLimit while COMPLETING).
            now = int(time.time())
            end = min(info.end_time or now, now)
            return Stop("timelimit", requested=max(1, end - job.timelimit - SIGNAL_SLACK), ended=end, at_limit=True)
        record = _timelimit_record(cfg, job)
        if record is not None:
            return _stop_at(record)
        return Stop("", "neither preempted nor stopped for its time limit")
    return Stop("", "not preempted")


def _stop_at(record: TimeLimitRecord) -> Stop:
    """The time-limit stop its record tells: the request came at most the
    margin and SIGNAL_SLACK before the decision, which ended the run."""
    return Stop("timelimit", requested=max(1, int(record.at - record.margin - SIGNAL_SLACK)), ended=int(record.at))


# What squeue says of a job that reached its time limit (state_reason FAIL_TIMEOUT).
TIME_LIMIT_REASON = "TimeLimit"


def _run_epoch(cfg: Config, job: JobEnv) -> str:
    """The epoch of the run these hooks end: its restart count as its Prolog
    recorded it (job.json), since after a requeue the hooks' own is the next run's."""
    recorded = JobDir(cfg.paths.barrier_dir, job.job_id).read_job()
    return preempt_epoch(recorded.restart_count if recorded is not None else job.restart_count)


def _timelimit_record(cfg: Config, job: JobEnv):
    try:
        return JobDir(cfg.paths.barrier_dir, job.job_id).read_timelimit(_run_epoch(cfg, job), job.uid)
    except (OSError, SnapError) as exc:
        log.warning("job %s: time-limit record not read: %s", job.job_id, exc)
        return None


def _grace_seconds(cfg: Config, job: JobEnv) -> int:
    if cfg.protocol.grace:
        return cfg.protocol.grace
    from ..slurm import commands
    from ..slurm.duration import slurm_seconds

    try:
        for p in commands.show_partitions(timeout=cfg.timeouts.slurm_command):
            if p.get("PartitionName") == job.partition:
                return slurm_seconds(p.get("GraceTime", "0")) or 0
    except Exception as exc:
        log.warning("scontrol show partition failed: %s", exc)
    return 0


def _requeue_at_limit(cfg: Config, job: JobEnv) -> str:
    """EpilogSlurmctld of a job that reached its time limit without rank 0
    requeueing it (no scontrol in its container, or rank 0 could not): when
    every rank acknowledged the run's checkpoint, record the time-limit stop
    (for the node Epilogs), then requeue. A run whose ranks did not all
    checkpoint is not requeued: it would come back to the same point."""
    from ..client.early import all_acknowledged
    from ..slurm import commands

    jd = JobDir(cfg.paths.barrier_dir, job.job_id)
    epoch = _run_epoch(cfg, job)
    world = _world_size(jd, epoch)
    if world is None or not all_acknowledged(jd, epoch, world):
        return "not requeued: not every rank acknowledged a checkpoint of this run"
    jd.write_timelimit(TimeLimitRecord(epoch=epoch, at=time.time(), by=BY_EPILOG, margin=job.timelimit,
                                       why="the job reached its time limit; requeued by EpilogSlurmctld"))
    commands.requeue_job(job.job_id, timeout=cfg.timeouts.slurm_command)
    return "requeued"


def _world_size(jd: JobDir, epoch: str) -> int | None:
    """The world the ranks' acknowledgements of `epoch` name."""
    from ..client.early import acknowledgements

    return next((a.world_size for a in acknowledgements(jd, epoch) if a.world_size), None)


def epilog_slurmctld(cfg: Config, inv, job: JobEnv) -> str:
    stop = _why_stopped(cfg, job)
    if not stop.trigger:
        return stop.why
    from ..protocol import preempt

    m = preempt.epilogslurmctld_mark(cfg, inv, job, stop.requested, trigger=stop.trigger)
    out = f"{_said(stop)}: set {m.set_id} " + ("opened" if m.created else f"already {m.state}")
    if stop.at_limit:
        out += "; " + _requeue_at_limit(cfg, job)
    return out


def _said(stop: Stop) -> str:
    return f"preempted at {stop.requested}" if stop.trigger == "preempt" else \
        f"stopped for its time limit at {stop.ended}"


def epilog(cfg: Config, inv, job: JobEnv) -> str:
    from ..protocol import preempt

    try:
        stop = _why_stopped(cfg, job)
        if not stop.trigger:
            return stop.why
        when = _said(stop)
    except SnapError as exc:
        # slurmctld did not answer (restarting, or this node is cut off from
        # the controller): the ranks' acknowledgements on the shared
        # filesystem still say whether the run stopped for a snapshot.
        seen = preempt.ranks_saw_preemption(cfg, job)
        if not seen:
            raise
        stop = _stopped_offline(cfg, job)
        when = f"squeue failed ({exc}), but {seen}: " + (
            "preempted" if stop.trigger == "preempt" else "stopped for its time limit")
    result = preempt.epilog_cut(cfg, inv, job, preempt_time=stop.requested or None, killed_at=stop.ended or None,
                                remaining=remaining(), refusal=lambda v: _refusal(cfg, v, job), trigger=stop.trigger)
    return f"{when}: {result}"


def _stopped_offline(cfg: Config, job: JobEnv) -> Stop:
    """Why the ranks checkpointed the run, when squeue cannot say: the
    time-limit record when whoever requeued it wrote one (its times with
    it); else a preemption for a --snapshot-on-preempt job (times unknown);
    else its time limit, the only other reason its ranks checkpoint
    without a request (client/reason.py)."""
    record = _timelimit_record(cfg, job) if job.timelimit else None
    if record is not None:
        return _stop_at(record)
    return Stop("preempt" if job.on_preempt else "timelimit")


def _refusal(cfg: Config, spec: VolumeRecord, job: JobEnv) -> str:
    """Why this node must not cut `spec` (the Prolog's own check of a path
    that already exists, run again at the cut), "" when it may."""
    if cfg.volume_class(spec.volume_class) is None:
        return f"its class {spec.volume_class!r} is no longer configured"
    try:
        _prepare_volume(cfg, spec, job, create=False)
    except PathError as exc:
        return exc.kwargs.get("why") or str(exc)
    except (OSError, SnapError) as exc:
        return f"cannot be checked: {exc}"
    return ""


HOOKS = {
    hooknames.PROLOG: prolog,
    hooknames.EPILOG: epilog,
    hooknames.PROLOG_SLURMCTLD: record_job,
    hooknames.PROLOG_SLURMCTLD_RECORD: record_job,
    hooknames.EPILOG_SLURMCTLD: epilog_slurmctld,
}

