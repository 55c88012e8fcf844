"""The hooks' gateway to the inventory: everything a node's hook records
(a preemption set's opening, the ranks' acknowledgements, this node's parts
and the release, a requeued run's resume point, refused volumes, a hook's
failure), in this process (LocalRecorder: the controller, or any host whose
config names the database) or through the controller's slurm-snap service
(RemoteRecorder: a node without the database or its credentials).

A node's parts arrive as one spool entry (spool.records.SpoolEntry), the
same whether its Epilog delivers it at once or its node agent delivers it
later from the spool: `deliver` is idempotent (a part or an acknowledgement
already recorded is kept as it is) and joins a late part to a set the
sweeper already finalized (states.LATE_JOIN: the verdict judges the set again
with the part in it).

Both take and give typed records (slurm_snap.jobrecords, inventory.records
and the few below); the service's operation table, OPS, runs the
LocalRecorder's methods for the nodes, and service.records converts their
arguments and results to JSON at the socket by the methods' type hints.
protocol/preempt.py drives the preemption through whichever recorder
recorder_for() gives; this module never imports it.
"""
from __future__ import annotations

import dataclasses
import datetime as dt

from .. import states as S
from ..clock import aware, utcnow
from ..errors import BadValueError, NotFound
from ..inventory.records import Refusal, SnapshotRecord
from ..jobrecords import Ack, CutPart, EarlyDecision, VolumeRecord, preempt_epoch
from ..spool.records import SpoolEntry
from .resume import ResumePoint, resume_point

# Not host:pid: no single process owns a preemption set.
PREEMPT_OWNER = "slurm:preempt"


@dataclasses.dataclass(frozen=True)
class OpenedSet:
    """The preemption set a node's Epilog works on, and what it needs of its run."""

    set_id: int
    epoch: str
    state: str
    nodes: tuple[str, ...]
    volumes: tuple[VolumeRecord, ...]
    uid: int


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """What the recorder needs of a hook's JobEnv (it crosses the service)."""

    job_id: int
    restart_count: int
    user: str
    uid: int
    partition: str
    nodes: tuple[str, ...]
    volumes: tuple[str, ...]
    options: dict

    @classmethod
    def of(cls, job) -> "JobFacts":
        return cls(job_id=job.job_id, restart_count=job.restart_count, user=job.user, uid=job.uid,
                   partition=job.partition, nodes=tuple(job.nodes or [job.node]), volumes=tuple(job.volumes),
                   options=job.options())


def as_time(t) -> dt.datetime | None:
    """Unix seconds (0: unknown) or a datetime, as an aware time."""
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


def _preempted_run(repo, job_id: int, restart_count: int, preempt_time: dt.datetime | None):
    """The run that was preempted. Its hooks see SLURM_JOB_RESTART_COUNT
    already incremented, and a late Epilog may even run after the requeued
    run's Prolog recorded the next run: a run whose preemption set is still
    open wins, then a run that existed before the preemption."""
    run = repo.open_preempt_run(job_id, restart_count)
    if run is not None:
        return run
    run = repo.preempted_run(job_id, restart_count)
    if run is None:
        raise NotFound(what="job", value=f"{job_id}.{restart_count}")
    if preempt_time is not None and run.created_at > preempt_time and run.restart_count > 0:
        earlier = repo.preempted_run(job_id, run.restart_count - 1)
        if earlier is not None:
            return earlier
    return run


def open_set(repo, cfg, job_id: int, restart_count: int, *, preempt_time: dt.datetime | None, now: dt.datetime,
             run=None):
    """(run, set, created): the preemption set of the preempted run (`run`,
    or the one the hook's restart count points at), opened if no hook has yet."""
    run = run or _preempted_run(repo, job_id, restart_count, preempt_time)
    # Unknown preemption time: the run's start is the honest lower bound for
    # "acknowledged after the request".
    requested = preempt_time or run.created_at
    st, created = repo.create_set(run, epoch=preempt_epoch(run.restart_count), trigger="preempt",
                                  wanted=_wanted(run), deadline=_deadline(cfg, now), owner=PREEMPT_OWNER,
                                  requested_at=requested)
    if not created and preempt_time is not None and st.state in S.ACTIVE \
            and repo.ack_span(st.id)[0] is None:
        # Slurm's PreemptTime is a guess at the request; once a rank said when
        # its signal came (LocalRecorder.cutting), the observation stands.
        fields = {}
        if st.requested_at > preempt_time:
            fields["requested_at"] = preempt_time
        if st.signalled_at is None:
            fields["signalled_at"] = preempt_time
        if fields:
            repo.update_set(st.id, **fields)
    return run, st, created


def early_text(early: EarlyDecision, requested_at: dt.datetime | None) -> str:
    """One line for the set's events: what rank 0 decided about giving the
    nodes back, and how long after the first rank's signal."""
    def after(at: float | None) -> str:
        if at is None or requested_at is None:
            return ""
        return f" {at - requested_at.timestamp():.1f} s after the first signal"
    why = early.why[:300]
    if early.released:
        return (f"released early: every rank acknowledged{after(early.all_acknowledged_at)}, rank 0 requeued the job"
                f"{after(early.at)} ({why})")
    return f"not released early ({early.decision}): {why}"


def release_of(early: EarlyDecision | None, preempt_time: dt.datetime | None) -> tuple[dt.datetime, str] | None:
    """When and how the preempted job gave its nodes back: rank 0's requeue
    (jobrecords.EARLY_RELEASED), else Slurm's PreemptTime, which the Epilogs
    see as the kill at the end of GraceTime."""
    if early is not None and early.released:
        return as_time(early.at), "early"
    if preempt_time is not None:
        return preempt_time, "grace"
    return None


@dataclasses.dataclass(frozen=True)
class Delivered:
    """What the inventory made of one spool entry."""

    set_id: int
    state: str
    summary: str
    late: bool = False      # the set was already finalized: a late part (states.LATE_JOIN)


def _snapshot_record(volume_id: int, p: CutPart) -> SnapshotRecord:
    return SnapshotRecord(volume_id=volume_id, backend=p.backend, name=p.name, ref=p.ref, path=p.snapshot_path,
                          node=p.node, cut_started_at=p.cut_started_at, cut_at=p.cut_at, state=p.state,
                          error=p.error, site=p.site, region=p.region, shared_key=p.shared_key,
                          manifest_ok=p.manifest_ok)


def _observed_times(repo, st) -> dict:
    """The set's request and barrier times as its recorded acknowledgements
    say (LocalRecorder.cutting, deliver)."""
    observed, last = repo.ack_span(st.id)
    fields = {}
    if observed is not None:
        # The request time of a preemption is when the first rank got the
        # signal, as the ranks observed it, not PreemptTime less GraceTime
        # less a slack (Slurm shows the kill's time there).
        fields.update(requested_at=observed, signalled_at=observed)
    if last is not None:
        # Its barrier time is the last acknowledgement as written (each node's
        # Epilog adds its own); with the request time it is the checkpoint
        # time GraceTime must hold.
        fields.update(barrier_at=last)
    return {k: v for k, v in fields.items() if getattr(st, k) != v}


class LocalRecorder:
    """The inventory side of a node's hooks, in this process. The service
    runs the same methods for nodes that reach the inventory through it
    (OPS below); their type hints are the wire's schema (service.records)."""

    def __init__(self, cfg, inventory, clock=utcnow):
        self.cfg, self.inv, self.clock = cfg, inventory, clock

    def open(self, *, job_id: int, restart_count: int, node: str, nodes: list[str],
             preempt_time: float | None) -> OpenedSet:
        with self.inv.session() as repo:
            run, st, _ = open_set(repo, self.cfg, job_id, restart_count, preempt_time=as_time(preempt_time),
                                  now=self.clock())
            return OpenedSet(set_id=st.id, epoch=st.epoch, state=st.state, nodes=tuple(run.nodes or nodes or [node]),
                             volumes=tuple(VolumeRecord.of(v) for v in repo.volumes(run)), uid=run.uid)

    def cutting(self, *, set_id: int, acks: list[Ack]) -> str:
        """Record the acknowledgements and move the set to CUTTING; returns
        the set's state ("" when this node may cut)."""
        with self.inv.session() as repo:
            st = repo.get_set(set_id, lock=True)
            repo.record_acks(set_id, acks)
            changed = _observed_times(repo, st)
            if changed and st.state in S.ACTIVE:
                repo.update_set(set_id, **changed)
            if st.state in (S.PENDING, S.QUIESCING):
                repo.transition(set_id, S.CUTTING, at=self.clock())
            elif st.state != S.CUTTING:
                return st.state
        return ""

    def deliver(self, *, entry: SpoolEntry) -> Delivered:
        """Record one node's spool entry: its acknowledgements, its parts and
        rank 0's early-release decision; the delivery that brings the last
        expected part finalizes, under the set's row lock. Idempotent. A set
        the sweeper (or repair) finalized already takes the part late and is
        judged again (states.LATE_JOIN); a pruned set goes back to DELETING
        so prune removes the part."""
        from . import finalize

        t_pre, t_kill = as_time(entry.preempt_time), as_time(entry.killed_at)
        with self.inv.session() as repo:
            if entry.set_id is not None:
                st = repo.get_set(entry.set_id, lock=True)
                if st.job_id != entry.job_id or st.epoch != entry.epoch:
                    raise BadValueError(what="spool entry field 'set_id'", value=entry.set_id,
                                        why=f"set {st.id} is job {st.job_id}'s {st.epoch}, not job "
                                            f"{entry.job_id}'s {entry.epoch}")
            else:
                run = repo.find_job_run(entry.job_id, entry.restart_count)
                if run is None:
                    raise NotFound(what="job run", value=f"{entry.job_id}.{entry.restart_count}")
                _run, opened, _created = open_set(repo, self.cfg, entry.job_id, entry.restart_count,
                                                  preempt_time=t_pre, now=self.clock(), run=run)
                st = repo.get_set(opened.id, lock=True)
            set_id, was = st.id, st.state
            rows = {(v.node or "", v.path): v.id for v in repo.volumes(st.job_run)}
            parts, unknown = [], []
            for p in entry.parts:
                vid = rows.get((p.node if p.scope == "node-local" else "", p.path))
                if vid is None:
                    unknown.append(f"{p.volume_class}:{p.path}@{p.node or 'shared'}")
                else:
                    parts.append(_snapshot_record(vid, p))
            if entry.acks:
                repo.record_acks(set_id, list(entry.acks))
                changed = _observed_times(repo, st)
                if changed and st.state in S.ACTIVE:
                    repo.update_set(set_id, **changed)
            if st.state in (S.PENDING, S.QUIESCING):
                repo.transition(set_id, S.CUTTING, at=min((p.cut_started_at for p in parts if p.cut_started_at),
                                                          default=None) or self.clock())
            new = repo.record_parts(set_id, parts)
            node = entry.node
            if entry.offline:
                repo.event("preempt", f"set {set_id}: {node} cut {len(entry.parts)} part(s) at "
                           f"{entry.written_at:%Y-%m-%dT%H:%M:%SZ} without the inventory ({entry.offline[:300]}); "
                           f"delivered from its spool", job_id=entry.job_id, set_id=set_id, node=node)
            if unknown:
                repo.event("preempt", f"set {set_id}: {node} delivered parts of volumes the job run does not "
                           f"declare, not recorded: {', '.join(unknown[:8])}", job_id=entry.job_id, set_id=set_id,
                           node=node, level="error")
            if entry.early is not None:
                repo.event("preempt", early_text(entry.early, st.requested_at), job_id=entry.job_id, set_id=set_id,
                           node=node)
            released = release_of(entry.early, t_kill or t_pre)
            # Rank 0's requeue, when it happened, is the release; Slurm's kill
            # at the end of GraceTime only when nothing earlier was recorded
            # (the head node, which reads rank 0's decision, may record last).
            if released is not None and (st.release != "early" or released[1] == "early") \
                    and (st.released_at, st.release) != released:
                repo.update_set(set_id, released_at=released[0], release=released[1])
            if st.state == S.CUTTING:
                have = repo.count_parts(set_id)
                if have < st.expected_parts:
                    ok = sum(p.ok for p in parts)
                    return Delivered(set_id, st.state, f"set {set_id}: {node} cut {ok}/{len(parts)} volumes; "
                                                       f"{have}/{st.expected_parts} parts in")
                extra = [] if t_pre is not None or st.signalled_at else \
                    ["preemption time unknown: acknowledgements checked against the run's start"]
                v = finalize.verdict_for(repo, st, allow_crash=self.cfg.protocol.allow_crash_consistent,
                                         extra_reasons=extra)
                finalize.apply(repo, st, v, at=self.clock())
                repo.event("preempt", f"set {set_id} finalized by {node}: {v.state} {v.consistency}"
                           + (f" ({v.reason})" if v.reason else ""), job_id=entry.job_id, set_id=set_id, node=node)
                return Delivered(set_id, v.state, f"set {set_id} {v.state} {v.consistency}")
            return Delivered(set_id, *self._late(repo, st, entry, new))

    def _late(self, repo, st, entry: SpoolEntry, new: int) -> tuple[str, str, bool]:
        """(state, summary, late) for parts delivered to a set no longer
        being cut: judged again when they are new to a PARTIAL or FAILED set
        (states.LATE_JOIN), handed to prune when the set was pruned."""
        from . import finalize

        node, set_id, was = entry.node, st.id, st.state
        if not new:
            return was, f"set {set_id} is {was}; {node}'s parts were recorded already", False
        if was in (S.PARTIAL, S.FAILED):
            v = finalize.verdict_for(repo, st, allow_crash=self.cfg.protocol.allow_crash_consistent,
                                     extra_reasons=[f"{node}'s part(s) delivered late from its spool"])
            if v.state != was and (was, v.state) in S.LATE_JOIN:
                finalize.apply(repo, st, v, at=self.clock())
            else:
                repo.update_set(set_id, reason=v.reason[:8000], failed_nodes=list(v.failed_nodes),
                                skew_seconds=v.skew_seconds, checkpoint_step=v.checkpoint_step,
                                manifest_ok=v.manifest_ok)
            now = repo.get_set(set_id).state
            repo.event("preempt", f"set {set_id}: {new} part(s) of {node} delivered late; {was} -> {now} "
                       f"{v.consistency}" + (f" ({v.reason[:500]})" if v.reason else ""),
                       job_id=entry.job_id, set_id=set_id, node=node, level="warning")
            return now, f"set {set_id} {was} -> {now} {v.consistency} (late part of {node})", True
        if was == S.DELETED:
            repo.transition(set_id, S.DELETING, at=self.clock())
        if was in (S.DELETED, S.DELETING):
            repo.event("preempt", f"set {set_id}: {new} part(s) of {node} delivered after the set was pruned: "
                       "the next prune removes them", job_id=entry.job_id, set_id=set_id, node=node,
                       level="warning")
            return S.DELETING, f"set {set_id} was {was}: {node}'s late part(s) are left to prune", True
        repo.event("preempt", f"set {set_id} is {was}: {new} late part(s) of {node} recorded",
                   job_id=entry.job_id, set_id=set_id, node=node)
        return was, f"set {set_id} is {was}: {node}'s parts recorded", True

    def resume_point(self, *, job_id: int, nodes: list[str] | None = None, restart_count: int | None = None,
                     budget: float | None = None) -> ResumePoint | None:
        return resume_point(self.cfg, self.inv, job_id, nodes=nodes, restart_count=restart_count, budget=budget)

    def hook_failed(self, *, hook: str, detail: str, job_id: int, node: str) -> None:
        with self.inv.session() as repo:
            repo.event("hook-failed", f"{hook}: {detail}", job_id=job_id, node=node, level="error")

    def refused(self, *, job: JobFacts, node: str, refused: list[Refusal], specs: list[VolumeRecord]) -> int:
        """A node Prolog refused declared volumes: mark them (creating the run's
        rows, `specs`, if PrologSlurmctld has not recorded them yet) and say so
        in the job's events."""
        from sqlalchemy.exc import IntegrityError

        from ..inventory import refusals

        for attempt in (1, 2):
            try:
                with self.inv.session() as repo:
                    n = refusals.record(repo, job_id=job.job_id, restart_count=job.restart_count,
                                        user_name=job.user, uid=job.uid, partition=job.partition,
                                        nodes=list(job.nodes), options=job.options, specs=specs, refused=refused)
                    for r in refused:
                        repo.event("refused", f"prolog on {node} refused {r.path}: {r.why}; the job runs "
                                   "without its protection", job_id=job.job_id, node=node, level="error")
                    return n
            except IntegrityError:
                # PrologSlurmctld inserted the run between our look and our
                # insert: the second attempt finds it.
                if attempt == 2:
                    raise
        return 0


class RemoteRecorder:
    """The same operations through the controller's slurm-snap service.
    `reply_timeout` bounds each answer once connected (a hook sets what its
    budget allows; None: [service] timeout)."""

    def __init__(self, cfg, reply_timeout: float | None = None):
        self.cfg = cfg
        self.reply_timeout = reply_timeout

    def _call(self, op: str, **args):
        from ..service.client import call
        from ..service.records import decode_result, encode

        method = getattr(LocalRecorder, OPS_METHODS[op])
        return decode_result(method, call(self.cfg, op, reply_timeout=self.reply_timeout,
                                          **{k: encode(v) for k, v in args.items()}),
                             f"the service's {op} result")

    def open(self, **kw) -> OpenedSet:
        return self._call("preempt-open", **kw)

    def cutting(self, **kw) -> str:
        return self._call("preempt-cutting", **kw)

    def deliver(self, **kw) -> Delivered:
        return self._call("preempt-deliver", **kw)

    def resume_point(self, **kw) -> ResumePoint | None:
        return self._call("resume-point", **kw)

    def hook_failed(self, **kw) -> None:
        self._call("hook-failed", **kw)

    def refused(self, **kw) -> int:
        return self._call("volume-refused", **kw)


def recorder_for(cfg, inventory):
    """The recorder of this host: the service when the config names it."""
    if isinstance(inventory, (LocalRecorder, RemoteRecorder)):
        return inventory
    return RemoteRecorder(cfg) if cfg.via_service else LocalRecorder(cfg, inventory)


# What the service runs for nodes (root only): the LocalRecorder's methods.
OPS_METHODS = {"preempt-open": "open", "preempt-cutting": "cutting", "preempt-deliver": "deliver",
               "resume-point": "resume_point", "hook-failed": "hook_failed", "volume-refused": "refused"}


def _op(op: str):
    def run(cfg, **args):
        from ..inventory.repository import Inventory
        from ..service.records import decode_call, encode

        method = getattr(LocalRecorder(cfg, Inventory.from_config(cfg)), OPS_METHODS[op])
        return encode(method(**decode_call(method, args, op)))
    return run


OPS = {op: _op(op) for op in OPS_METHODS}
