"""What each Slurm hook does for an opted-in job.

  PrologSlurmctld  (controller, root)  record the job run and every volume on every node
  Prolog           (each node, root)   prepare this node's volumes and the barrier directory;
                                       a requeued run gets resume.json. It does not touch the
                                       inventory otherwise: importing the ORM alone costs more
                                       than the 100 ms an opted-in job's start may pay.
  EpilogSlurmctld  (controller, root)  at preemption, open the set (requested at PreemptTime)
  Epilog           (each node, root)   at preemption, cut this node's volumes, record, finalize

Each is idempotent (Slurm may run a hook twice) and runs under hooks.policy.
"""
from __future__ import annotations

import os

from .. import paths
from ..config import Config
from ..errors import PathError, SnapError, Unsupported, VolumesRefused
from ..jobrecords import JobRecord, VolumeRecord
from ..lazylog import getLogger
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
    with inv.session() as repo:
        run = repo.record_job_run(job_id=job.job_id, restart_count=job.restart_count, user_name=job.user,
                                  uid=job.uid, partition=job.partition, nodes=job.nodes, options=job.options(),
                                  snapshot_every=every)
        repo.add_volumes(run, specs)
        repo.event("hook", f"recorded {len(specs)} volumes on {len(job.nodes)} nodes", job_id=job.job_id)
        if every is not None:
            asked = f" (asked {job.every} s; {why})" if why and job.every is not None else (f" ({why})" if why else "")
            repo.event("hook", f"periodic snapshots every {every} s{asked}", job_id=job.job_id)
    return f"recorded {len(specs)} volumes" + (f", a snapshot every {every} s" if every is not None else "")


def prolog(cfg: Config, inv, job: JobEnv) -> str:
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
        if job.restart_count > 0 and job.node == job.head_node:
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


def _preempt_time(cfg: Config, job: JobEnv) -> tuple[int, int]:
    """(When the preemption began, Slurm's PreemptTime as these epilogs see
    it), epoch seconds; (0, 0) if the job was not preempted.

    Nothing in the hooks' environment says "preempted" (docs/design.md,
    "What the epilogs see at a preemption"); squeue does: the job is
    COMPLETING with a PreemptTime in both EpilogSlurmctld and the node
    Epilog, and PreemptTime is 0 after a normal end, scancel or scontrol
    requeue. By the time the epilogs run, PreemptTime is the end of the
    grace period (the kill), not the moment the signal went out. The ranks'
    acknowledgements are written inside the grace period, so the request
    time is PreemptTime - GraceTime, less the lag of slurmctld's periodic
    grace check (measured up to ~10 s) and the one-second resolution.

    A squeue that fails is an error, never "not preempted": that answer once
    hid an EpilogSlurmctld that could not reach slurmctld at all.
    """
    from ..slurm import commands

    t = commands.squeue_job(job.job_id, timeout=cfg.timeouts.slurm_command).preempt_time
    if not t:
        return 0, 0
    return max(1, t - _grace_seconds(cfg, job) - PREEMPT_SLACK), t


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


def _not_preempted(cfg: Config, job: JobEnv) -> tuple[str, int, int]:
    """(why the epilogs have nothing to do, "" when preempted; the request's
    lower bound; Slurm's PreemptTime)."""
    if not job.on_preempt:
        return "not --snapshot-on-preempt", 0, 0
    t, slurm = _preempt_time(cfg, job)
    return ("" if t else "not preempted"), t, slurm


def epilog_slurmctld(cfg: Config, inv, job: JobEnv) -> str:
    why, t, _slurm = _not_preempted(cfg, job)
    if why:
        return why
    from ..protocol import preempt

    m = preempt.epilogslurmctld_mark(cfg, inv, job, t)
    return f"preempted at {t}: set {m.set_id} " + ("opened" if m.created else f"already {m.state}")


def epilog(cfg: Config, inv, job: JobEnv) -> str:
    why, t, slurm = _not_preempted(cfg, job)
    if why:
        return why
    from ..protocol import preempt

    from .policy import remaining

    result = preempt.epilog_cut(cfg, inv, job, preempt_time=t, killed_at=slurm, remaining=remaining())
    return f"preempted at {t}: {result}"


HOOKS = {
    hooknames.PROLOG: prolog,
    hooknames.EPILOG: epilog,
    hooknames.PROLOG_SLURMCTLD: record_job,
    hooknames.PROLOG_SLURMCTLD_RECORD: record_job,
    hooknames.EPILOG_SLURMCTLD: epilog_slurmctld,
}
