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
their deadline is what tells repair they are abandoned.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import typing

from ..client.early import read_decision as read_early_decision
from ..clock import aware, utcnow
from ..errors import NotFound
from ..jobdir import JobDir
from . import finalize
from .. import states as S
from .barrier import AckCollector
from .cutter import VolumeInfo, assign_manifests, cut_all
from ..inventory.records import AckRecord, SnapshotRecord, VolumeSpec, from_json, to_json

log = logging.getLogger(__name__)

PREEMPT_PREFIX = "preempt-"
# Not host:pid: no single process owns a preemption set.
PREEMPT_OWNER = "slurm:preempt"


def preempt_epoch(restart_count: int) -> str:
    return f"{PREEMPT_PREFIX}{int(restart_count)}"


def _as_time(t) -> dt.datetime | None:
    if t is None or t == 0:
        return None
    if isinstance(t, dt.datetime):
        return aware(t)
    return dt.datetime.fromtimestamp(float(t), dt.timezone.utc)


def _wanted(run) -> str:
    c = (run.options or {}).get("consistency", S.WANT_APP)
    return c if c in S.WANTED else S.WANT_APP


def _deadline(cfg, now: dt.datetime) -> dt.datetime:
    # Every node's Epilog should have run well within this.
    return now + dt.timedelta(seconds=cfg.timeouts.hook_budget + cfg.timeouts.barrier)


def _preempted_run(repo, job, preempt_time: dt.datetime | None):
    """The run that was preempted. Its hooks see SLURM_JOB_RESTART_COUNT
    already incremented, and a late Epilog may even run after the requeued
    run's Prolog recorded the next run: a run whose preemption set is still
    open wins, then a run that existed before the preemption."""
    run = repo.open_preempt_run(job.job_id, job.restart_count)
    if run is not None:
        return run
    run = repo.preempted_run(job.job_id, job.restart_count)
    if run is None:
        raise NotFound(what="job", value=f"{job.job_id}.{job.restart_count}")
    if preempt_time is not None and run.created_at > preempt_time and run.restart_count > 0:
        earlier = repo.preempted_run(job.job_id, run.restart_count - 1)
        if earlier is not None:
            return earlier
    return run


def _open_set(repo, cfg, job, *, preempt_time: dt.datetime | None, now: dt.datetime):
    run = _preempted_run(repo, job, preempt_time)
    # Unknown preemption time: the run's start is the honest lower bound for
    # "acknowledged after the request".
    requested = preempt_time or run.created_at
    st, created = repo.create_set(run, epoch=preempt_epoch(run.restart_count), trigger="preempt",
                                  wanted=_wanted(run), deadline=_deadline(cfg, now), owner=PREEMPT_OWNER,
                                  requested_at=requested)
    if not created and preempt_time is not None and st.state in S.ACTIVE \
            and repo.ack_span(st.id)[0] is None:
        # Slurm's PreemptTime is a guess at the request; once a rank said when
        # its signal came (cutting() below), the observation stands.
        fields = {}
        if st.requested_at > preempt_time:
            fields["requested_at"] = preempt_time
        if st.signalled_at is None:
            fields["signalled_at"] = preempt_time
        if fields:
            repo.update_set(st.id, **fields)
    return run, st, created


class Marked(typing.NamedTuple):
    set_id: int
    created: bool    # False: a node Epilog had opened it already
    state: str


def epilogslurmctld_mark(cfg, inventory, job, preempt_time, *, clock=utcnow) -> Marked:
    """Open the preemption set (QUIESCING, requested at PreemptTime); idempotent."""
    t = _as_time(preempt_time) or clock()
    with inventory.session() as repo:
        run, st, created = _open_set(repo, cfg, job, preempt_time=t, now=clock())
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


def early_text(doc: dict, requested_at: dt.datetime | None) -> str:
    """One line for the set's events: what rank 0 decided about giving the
    nodes back, and how long after the first rank's signal."""
    def after(key: str) -> str:
        at = doc.get(key)
        if not isinstance(at, (int, float)) or requested_at is None:
            return ""
        return f" {at - requested_at.timestamp():.1f} s after the first signal"
    decision = str(doc.get("decision", "?"))[:20]
    why = str(doc.get("why", ""))[:300]
    if decision in EARLY_DECISIONS:
        return (f"released early: every rank acknowledged{after('all_acknowledged_at')}, rank 0 requeued the job"
                f"{after('at')} ({why})")
    return f"not released early ({decision}): {why}"


# Rank 0's decisions that mean "the job was requeued by it" (client/early.py).
# "requeueing" is the intent it writes before calling scontrol requeue, which
# ends the job at once: left alone, rank 0 died inside the call (or scontrol,
# inside the job, died of the requeue's kill). Had slurmctld refused, scontrol
# would have exited non-zero and rank 0 written "failed"; the one other way to die
# there is Slurm's own kill at the end of GraceTime, and then the kill came
# within the call's time of `at` either way.
EARLY_DECISIONS = ("requeued", "requeueing")


def release_of(early: dict | None, preempt_time: dt.datetime | None) -> tuple[dt.datetime, str] | None:
    """When and how the preempted job gave its nodes back: rank 0's requeue
    (EARLY_DECISIONS), else Slurm's PreemptTime, which the Epilogs see as the
    kill at the end of GraceTime."""
    if early and early.get("decision") in EARLY_DECISIONS and isinstance(early.get("at"), (int, float)) \
            and not isinstance(early.get("at"), bool):
        return _as_time(early["at"]), "early"
    if preempt_time is not None:
        return preempt_time, "grace"
    return None


class LocalRecorder:
    """The inventory side of a node's Epilog, in this process (the controller,
    or any host whose config names the database). The service runs the same
    methods for nodes that reach the inventory through it (OPS below)."""

    def __init__(self, cfg, inventory, clock=utcnow):
        self.cfg, self.inv, self.clock = cfg, inventory, clock

    def open(self, *, job_id: int, restart_count: int, node: str, nodes: list, preempt_time) -> dict:
        job = _JobRef(job_id, restart_count, node, list(nodes))
        with self.inv.session() as repo:
            run, st, _ = _open_set(repo, self.cfg, job, preempt_time=_as_time(preempt_time), now=self.clock())
            return {"set_id": st.id, "epoch": st.epoch, "state": st.state,
                    "nodes": list(run.nodes or nodes or [node]),
                    "volumes": [dataclasses.asdict(VolumeInfo.of(v)) for v in repo.volumes(run)], "uid": run.uid}

    def cutting(self, *, set_id: int, acks: list) -> str:
        """Record the acknowledgements and move the set to CUTTING; returns
        the set's state ("" when this node may cut)."""
        with self.inv.session() as repo:
            st = repo.get_set(set_id, lock=True)
            repo.record_acks(set_id, [a if isinstance(a, AckRecord) else from_json(AckRecord, a) for a in acks])
            observed, last = repo.ack_span(set_id)
            fields = {}
            if observed is not None:
                # The request time of a preemption is when the first rank got
                # the signal, as the ranks observed it, not PreemptTime less
                # GraceTime less a slack (Slurm shows the kill's time there).
                fields.update(requested_at=observed, signalled_at=observed)
            if last is not None:
                # Its barrier time is the last acknowledgement as written (each
                # node's Epilog adds its own); with the request time it is the
                # checkpoint time GraceTime must hold.
                fields.update(barrier_at=last)
            changed = {k: v for k, v in fields.items() if getattr(st, k) != v}
            if changed and st.state in S.ACTIVE:
                repo.update_set(set_id, **changed)
            if st.state in (S.PENDING, S.QUIESCING):
                repo.transition(set_id, S.CUTTING, at=self.clock())
            elif st.state != S.CUTTING:
                return st.state
        return ""

    def record(self, *, set_id: int, job_id: int, node: str, parts: list, preempt_known: bool,
               early: dict | None = None, preempt_time: float | None = None) -> str:
        """Record this node's parts; the Epilog that records the last expected
        part finalizes, under the set's row lock. `early` is rank 0's
        early-release decision (client/early.py), from the head node;
        `preempt_time` Slurm's PreemptTime as this Epilog saw it."""
        parts = [p if isinstance(p, SnapshotRecord) else from_json(SnapshotRecord, p) for p in parts]
        with self.inv.session() as repo:
            st = repo.get_set(set_id, lock=True)  # the finalizer's row lock
            repo.record_parts(set_id, parts)
            if early:
                repo.event("preempt", early_text(early, st.requested_at), job_id=job_id, set_id=set_id, node=node)
            released = release_of(early, _as_time(preempt_time))
            # Rank 0's requeue, when it happened, is the release; Slurm's kill
            # at the end of GraceTime only when nothing earlier was recorded
            # (the head node, which reads rank 0's decision, may record last).
            if released is not None and (st.release != "early" or released[1] == "early") \
                    and (st.released_at, st.release) != released:
                repo.update_set(set_id, released_at=released[0], release=released[1])
            if st.state != S.CUTTING:
                return f"set {set_id} became {st.state} while {node} cut; parts recorded"
            have = repo.count_parts(set_id)
            if have < st.expected_parts:
                ok = sum(p.ok for p in parts)
                return f"set {set_id}: {node} cut {ok}/{len(parts)} volumes; {have}/{st.expected_parts} parts in"
            extra = [] if preempt_known or st.signalled_at else \
                ["preemption time unknown: acknowledgements checked against the run's start"]
            v = finalize.verdict_for(repo, st, allow_crash=self.cfg.protocol.allow_crash_consistent,
                                     extra_reasons=extra)
            finalize.apply(repo, st, v, at=self.clock())
            repo.event("preempt", f"set {set_id} finalized by {node}: {v.state} {v.consistency}"
                       + (f" ({v.reason})" if v.reason else ""), job_id=job_id, set_id=set_id, node=node)
            return f"set {set_id} {v.state} {v.consistency}"

    def resume_point(self, *, job_id: int, nodes: list | None = None, restart_count: int | None = None,
                     budget: float | None = None) -> dict | None:
        from .resume import resume_point

        return resume_point(self.cfg, self.inv, job_id, nodes=nodes, restart_count=restart_count, budget=budget)

    def hook_failed(self, *, hook: str, detail: str, job_id: int, node: str) -> None:
        with self.inv.session() as repo:
            repo.event("hook-failed", f"{hook}: {detail}", job_id=job_id, node=node, level="error")

    def refused(self, *, job: dict, node: str, refused: list, specs: list) -> int:
        """A node Prolog refused declared volumes: mark them (creating the run's
        rows, `specs`, if PrologSlurmctld has not recorded them yet) and say so
        in the job's events. `job` is the Prolog's JobEnv as JSON (job_fields)."""
        from sqlalchemy.exc import IntegrityError

        from ..inventory import refusals

        items = [refusals.Refusal(**r) for r in refused]
        specs = [s if isinstance(s, VolumeSpec) else from_json(VolumeSpec, s) for s in specs]
        for attempt in (1, 2):
            try:
                with self.inv.session() as repo:
                    n = refusals.record(repo, job_id=job["job_id"], restart_count=job["restart_count"],
                                        user_name=job["user"], uid=job["uid"], partition=job["partition"],
                                        nodes=job["nodes"], options=job["options"], specs=specs, refused=items)
                    for r in items:
                        repo.event("refused", f"prolog on {node} refused {r.path}: {r.why}; the job runs "
                                   "without its protection", job_id=job["job_id"], node=node, level="error")
                    return n
            except IntegrityError:
                # PrologSlurmctld inserted the run between our look and our
                # insert: the second attempt finds it.
                if attempt == 2:
                    raise
        return 0


def job_fields(job) -> dict:
    """What the recorder needs of a JobEnv, as JSON (it crosses the service)."""
    return {"job_id": job.job_id, "restart_count": job.restart_count, "user": job.user, "uid": job.uid,
            "partition": job.partition, "nodes": list(job.nodes or [job.node]), "volumes": list(job.volumes),
            "options": job.options()}


class RemoteRecorder:
    """The same operations through the controller's slurm-snap service (a
    node without the database or its credentials)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def _call(self, op: str, **args):
        from ..service.client import call

        return call(self.cfg, op, **args)

    def open(self, **kw) -> dict:
        return self._call("preempt-open", **kw)

    def cutting(self, *, set_id: int, acks: list) -> str:
        return self._call("preempt-cutting", set_id=set_id, acks=[to_json(a) for a in acks])

    def record(self, *, parts: list, **kw) -> str:
        return self._call("preempt-record", parts=[to_json(p) for p in parts], **kw)

    def resume_point(self, **kw) -> dict | None:
        return self._call("resume-point", **kw)

    def hook_failed(self, **kw) -> None:
        self._call("hook-failed", **kw)

    def refused(self, *, specs: list, **kw) -> int:
        return self._call("volume-refused", specs=[to_json(s) for s in specs], **kw)


def recorder_for(cfg, inventory):
    """The recorder of this host: the service when the config names it."""
    if isinstance(inventory, (LocalRecorder, RemoteRecorder)):
        return inventory
    return RemoteRecorder(cfg) if cfg.via_service else LocalRecorder(cfg, inventory)


def _op(method: str):
    def run(cfg, **args):
        from ..inventory.repository import Inventory

        return getattr(LocalRecorder(cfg, Inventory.from_config(cfg)), method)(**args)
    return run


# What the service runs for nodes (root only): the LocalRecorder's methods.
OPS = {"preempt-open": _op("open"), "preempt-cutting": _op("cutting"), "preempt-record": _op("record"),
       "resume-point": _op("resume_point"), "hook-failed": _op("hook_failed"), "volume-refused": _op("refused")}


@dataclasses.dataclass(frozen=True)
class _JobRef:
    job_id: int
    restart_count: int
    node: str
    nodes: list


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
    t_pre = _as_time(preempt_time)
    t_kill = _as_time(killed_at) or t_pre
    opened = rec.open(job_id=job.job_id, restart_count=job.restart_count, node=node,
                      nodes=list(job.nodes or []), preempt_time=t_pre.timestamp() if t_pre else None)
    set_id, epoch, state, uid = opened["set_id"], opened["epoch"], opened["state"], opened["uid"]
    nodes = opened["nodes"]
    volumes = [VolumeInfo(**v) for v in opened["volumes"]]
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
        decided = read_early_decision(dirs, epoch) if node == head else None
        out = rec.record(set_id=set_id, job_id=job.job_id, node=node, parts=[r.record() for r in results],
                         preempt_known=t_pre is not None, early=decided,
                         preempt_time=t_kill.timestamp() if t_kill else None)
        hook("record")
        return out
    finally:
        if dirs is not None:
            try:
                dirs.write_release(epoch=epoch, set_id=set_id, state="", consistency="")
            except OSError as exc:
                log.error("job %s: cannot write release/%s: %s", job.job_id, epoch, exc)


def prepare_resume(cfg, inventory, job, *, budget: float | None = None) -> dict | None:
    """Write resume.json for a requeued run from the newest app-consistent
    set, after its node-local parts were brought to where the ranks now run
    (protocol.resume; within `budget` seconds and restore.move_budget)."""
    found = recorder_for(cfg, inventory).resume_point(job_id=job.job_id, nodes=list(job.nodes or [job.node]),
                                                      restart_count=job.restart_count, budget=budget)
    if found is None:
        return None
    JobDir(cfg.paths.barrier_dir, job.job_id).ensure(found["uid"]).write_resume(found["data"])
    return found["data"]
