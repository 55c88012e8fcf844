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
and the few below); the preemption set's opening and times are
protocol/preemptset.py's, a spool entry's delivery protocol/delivery.py's.
The service's operation table, OPS, runs the
LocalRecorder's methods for the nodes, and service.records converts their
arguments and results to JSON at the socket by the methods' type hints.
protocol/preempt.py drives the preemption through whichever recorder
recorder_for() gives; this module never imports it.
"""
from __future__ import annotations

import dataclasses

from .. import states as S
from ..clock import utcnow
from ..errors import BadValueError
from ..inventory.records import Refusal, SnapshotRecord
from ..jobrecords import Ack, EarlyDecision, VolumeRecord, preempt_restart
from ..spool.records import SpoolEntry
from .delivery import Delivered, cut_part, deliver
from .preemptset import as_time, observed_times, open_set
from .resume import ResumePoint, resume_point


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
            changed = observed_times(repo, st)
            if changed and st.state in S.ACTIVE:
                repo.update_set(set_id, **changed)
            if st.state in (S.PENDING, S.QUIESCING):
                repo.transition(set_id, S.CUTTING, at=self.clock())
            elif st.state != S.CUTTING:
                return st.state
        return ""

    def deliver(self, *, entry: SpoolEntry) -> Delivered:
        """Record one node's spool entry (protocol.delivery.deliver)."""
        from sqlalchemy.exc import IntegrityError

        for attempt in (1, 2):
            try:
                return deliver(self.cfg, self.inv, entry, clock=self.clock)
            except IntegrityError:
                # Another node's delivery recorded the same missing run (or
                # opened the same set) between our look and our insert: the
                # second attempt finds it.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def record(self, *, set_id: int, job_id: int, node: str, parts: list[SnapshotRecord], preempt_known: bool,
               early: EarlyDecision | None = None, preempt_time: float | None = None) -> str:
        """A node still on the version before the spool (docs/upgrade.md:
        nodes may lag the controller by a version) records its parts of an
        open set this way: the same delivery as a spool entry's, its parts
        named by the volume rows the set's run holds."""
        with self.inv.session() as repo:
            st = repo.get_set(set_id)
            run = st.job_run
            by_id = {v.id: v for v in repo.volumes(run)}
            cut = []
            for p in parts:
                v = by_id.get(p.volume_id)
                if v is None:
                    raise BadValueError(what="part field 'volume_id'", value=p.volume_id,
                                        why=f"not a volume of set {set_id}'s job run")
                cut.append(cut_part(v, p))
            restart = preempt_restart(st.epoch)
            entry = SpoolEntry(job_id=job_id, restart_count=run.restart_count if restart is None else restart, node=node,
                               nodes=tuple(run.nodes or [node]), uid=run.uid, written_at=self.clock(),
                               parts=tuple(cut), set_id=set_id, killed_at=preempt_time, early=early)
        return self.deliver(entry=entry).summary

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
# "preempt-record": nodes on the version before the spool (LocalRecorder.record).
OPS_METHODS = {"preempt-open": "open", "preempt-cutting": "cutting", "preempt-deliver": "deliver",
               "preempt-record": "record",
               "resume-point": "resume_point", "hook-failed": "hook_failed", "volume-refused": "refused"}


def _op(op: str):
    def run(cfg, **args):
        from ..inventory.repository import Inventory
        from ..service.records import decode_call, encode

        method = getattr(LocalRecorder(cfg, Inventory.from_config(cfg)), OPS_METHODS[op])
        return encode(method(**decode_call(method, args, op)))
    return run


OPS = {op: _op(op) for op in OPS_METHODS}
