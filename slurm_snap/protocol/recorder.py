"""The hooks' gateway to the inventory: everything a node's hook records
(a preemption set's opening, the ranks' acknowledgements, this node's parts
and the release, a requeued run's resume point, refused volumes, a hook's
failure), in this process (LocalRecorder: the controller, or any host whose
config names the database) or through the controller's slurm-snap service
(RemoteRecorder: a node without the database or its credentials).

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
from ..jobrecords import Ack, EarlyDecision, VolumeRecord, preempt_epoch
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
             trigger: str = "preempt"):
    """(run, set, created): the preemption (or time-limit: `trigger`) set of
    the run that ended, opened if no hook has yet."""
    if trigger not in S.HOOK_TRIGGERS:
        raise BadValueError(what="trigger", value=trigger, why=f"the hooks open {' or '.join(S.HOOK_TRIGGERS)} sets")
    run = _preempted_run(repo, job_id, restart_count, preempt_time)
    # Unknown preemption time: the run's start is the honest lower bound for
    # "acknowledged after the request".
    requested = preempt_time or run.created_at
    st, created = repo.create_set(run, epoch=preempt_epoch(run.restart_count), trigger=trigger,
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


def release_of(early: EarlyDecision | None, preempt_time: dt.datetime | None,
               trigger: str = "preempt") -> tuple[dt.datetime, str] | None:
    """When and how the preempted job gave its nodes back: rank 0's requeue
    (jobrecords.EARLY_RELEASED), else Slurm's PreemptTime, which the Epilogs
    see as the kill at the end of GraceTime; for a time-limit set, the time
    limit ("limit": Slurm ended the job there)."""
    if early is not None and early.released:
        return as_time(early.at), "early"
    if preempt_time is not None:
        return preempt_time, ("limit" if trigger == "timelimit" else "grace")
    return None


class LocalRecorder:
    """The inventory side of a node's hooks, in this process. The service
    runs the same methods for nodes that reach the inventory through it
    (OPS below); their type hints are the wire's schema (service.records)."""

    def __init__(self, cfg, inventory, clock=utcnow):
        self.cfg, self.inv, self.clock = cfg, inventory, clock

    def open(self, *, job_id: int, restart_count: int, node: str, nodes: list[str],
             preempt_time: float | None, trigger: str = "preempt") -> OpenedSet:
        with self.inv.session() as repo:
            run, st, _ = open_set(repo, self.cfg, job_id, restart_count, preempt_time=as_time(preempt_time),
                                  now=self.clock(), trigger=trigger)
            return OpenedSet(set_id=st.id, epoch=st.epoch, state=st.state, nodes=tuple(run.nodes or nodes or [node]),
                             volumes=tuple(VolumeRecord.of(v) for v in repo.volumes(run)), uid=run.uid)

    def cutting(self, *, set_id: int, acks: list[Ack]) -> str:
        """Record the acknowledgements and move the set to CUTTING; returns
        the set's state ("" when this node may cut)."""
        with self.inv.session() as repo:
            st = repo.get_set(set_id, lock=True)
            repo.record_acks(set_id, acks)
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

    def record(self, *, set_id: int, job_id: int, node: str, parts: list[SnapshotRecord], preempt_known: bool,
               early: EarlyDecision | None = None, preempt_time: float | None = None) -> str:
        """Record this node's parts; the Epilog that records the last expected
        part finalizes, under the set's row lock. `early` is rank 0's
        early-release decision, from the head node; `preempt_time` Slurm's
        PreemptTime as this Epilog saw it."""
        from . import finalize

        with self.inv.session() as repo:
            st = repo.get_set(set_id, lock=True)  # the finalizer's row lock
            repo.record_parts(set_id, parts)
            if early is not None:
                repo.event("preempt", early_text(early, st.requested_at), job_id=job_id, set_id=set_id, node=node)
            released = release_of(early, as_time(preempt_time), st.trigger)
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
    """The same operations through the controller's slurm-snap service."""

    def __init__(self, cfg):
        self.cfg = cfg

    def _call(self, op: str, **args):
        from ..service.client import call
        from ..service.records import decode_result, encode

        method = getattr(LocalRecorder, OPS_METHODS[op])
        return decode_result(method, call(self.cfg, op, **{k: encode(v) for k, v in args.items()}),
                             f"the service's {op} result")

    def open(self, **kw) -> OpenedSet:
        return self._call("preempt-open", **kw)

    def cutting(self, **kw) -> str:
        return self._call("preempt-cutting", **kw)

    def record(self, **kw) -> str:
        return self._call("preempt-record", **kw)

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
OPS_METHODS = {"preempt-open": "open", "preempt-cutting": "cutting", "preempt-record": "record",
               "resume-point": "resume_point", "hook-failed": "hook_failed", "volume-refused": "refused"}


def _op(op: str):
    def run(cfg, **args):
        from ..inventory.repository import Inventory
        from ..service.records import decode_call, encode

        method = getattr(LocalRecorder(cfg, Inventory.from_config(cfg)), OPS_METHODS[op])
        return encode(method(**decode_call(method, args, op)))
    return run


OPS = {op: _op(op) for op in OPS_METHODS}
