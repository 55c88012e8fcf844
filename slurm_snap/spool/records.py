"""What a node's spool holds: one SpoolEntry per preemption share a node's
Epilog cut (its parts, the acknowledgements it read, rank 0's early-release
decision), and the delivery agent's backoff (AgentState). One frozen
dataclass each, ONE parser naming what is wrong (jobrecords.fields.Fields),
ONE writer (`to_json`).

Why not jobrecords/: those are the files of one job's directory on the
shared filesystem, which every node and the ranks read. The spool is a
node's own directory on its own disk, holding entries of many jobs, read by
nobody but that node's agent; its records are the node's word to the
inventory. They reuse the per-job records they carry (Ack, EarlyDecision).

A part (jobrecords.CutPart, the same record the node writes beside the
acknowledgements) is named by what the node knows of its volume (class,
scope, node, path): the inventory's row ids are not known to a node that
could not reach it. The controller finds the row when the entry is
delivered.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from ..jobrecords import HOOK_TRIGGERS, Ack, CutPart, EarlyDecision, JobRecord, preempt_epoch
from ..jobrecords.fields import Fields, iso

SPOOL_VERSION = 1
_ENTRY_FIELDS = ("version", "job_id", "restart_count", "node", "nodes", "uid", "written_at", "parts", "acks",
                 "set_id", "preempt_time", "killed_at", "early", "offline", "job", "partition", "options",
                 "trigger")


def _opt_time(f: Fields, field: str, value) -> datetime | None:
    return None if value is None else f.aware(field, value)


def _opt_number(f: Fields, field: str, value) -> float | None:
    return None if value is None else f.number(field, value)


@dataclass(frozen=True)
class SpoolEntry:
    """What one node's Epilog did for one preemption: the parts it cut (or
    could not), the acknowledgements it read that the inventory has not
    recorded yet (each with when this node first saw it), rank 0's
    early-release decision (head node), and what it knew of the preemption's
    times. `restart_count` is the preempted run's (job.json's), so the epoch
    is preempt-<restart_count>; `set_id` is the set's when the Epilog could
    open it, None when it cut without the inventory (the controller finds or
    opens the set by job and epoch). `offline` says why it was not recorded
    at once ("" when it was written only to be delivered in order).
    `trigger` is the set's: "preempt", or "timelimit" when the job stopped
    before its time limit (--snapshot-before-timelimit), so the set the
    delivery opens is a time-limit set however late it comes."""

    job_id: int
    restart_count: int
    node: str
    nodes: tuple[str, ...]
    uid: int
    written_at: datetime
    parts: tuple[CutPart, ...] = ()
    acks: tuple[Ack, ...] = ()
    set_id: int | None = None
    preempt_time: float | None = None    # the request's lower bound (Unix seconds), None: unknown
    killed_at: float | None = None       # Slurm's PreemptTime as the Epilog saw it (the kill)
    early: EarlyDecision | None = None
    offline: str = ""
    job: JobRecord | None = None
    partition: str = ""
    options: dict = field(default_factory=dict)
    trigger: str = "preempt"

    LABEL = "spool entry"

    @property
    def epoch(self) -> str:
        return preempt_epoch(self.restart_count)

    def to_json(self) -> dict:
        return {"version": SPOOL_VERSION, "job_id": self.job_id, "restart_count": self.restart_count,
                "node": self.node, "nodes": list(self.nodes), "uid": self.uid, "written_at": iso(self.written_at),
                "parts": [p.to_json() for p in self.parts],
                "acks": [{"ack": a.to_json(), "seen_at": iso(a.seen_at)} for a in self.acks],
                "set_id": self.set_id, "preempt_time": self.preempt_time, "killed_at": self.killed_at,
                "early": None if self.early is None else self.early.to_json(), "offline": self.offline,
                "job": None if self.job is None else self.job.to_json(), "partition": self.partition,
                "options": dict(self.options),
                # Named only when not the default, which a service older
                # than --snapshot-before-timelimit still reads.
                **({} if self.trigger == "preempt" else {"trigger": self.trigger})}

    @classmethod
    def parse(cls, data, source: str = "") -> "SpoolEntry":
        f = Fields(cls.LABEL, data, source)
        f.only(_ENTRY_FIELDS)
        version = f.get("version")
        if version != SPOOL_VERSION or isinstance(version, bool):
            raise f.bad("version", version, f"this slurm-snap writes and reads version {SPOOL_VERSION}")
        job_id = f.integer("job_id", f.get("job_id"))
        nodes = f.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise f.bad("nodes", nodes, "expected a non-empty list of node names")
        nodes = tuple(f.name("nodes", n, "node name") for n in nodes)
        parts = f.get("parts")
        if not isinstance(parts, list):
            raise f.bad("parts", parts, "expected a list")
        acks = f.get("acks", [])
        if not isinstance(acks, list):
            raise f.bad("acks", acks, "expected a list")
        got_acks = []
        for i, item in enumerate(acks):
            if not isinstance(item, dict) or set(item) != {"ack", "seen_at"}:
                raise f.bad(f"acks[{i}]", item, 'expected {"ack": ..., "seen_at": ...}')
            ack = Ack.parse(item["ack"], f"{source} acks[{i}]", job_id=job_id)
            got_acks.append(ack.seen(_opt_time(f, f"acks[{i}].seen_at", item["seen_at"])))
        set_id = f.get("set_id", None)
        early = f.get("early", None)
        job = f.get("job", None)
        options = f.get("options", {})
        if not isinstance(options, dict):
            raise f.bad("options", options, "expected an object")
        trigger = f.get("trigger", "preempt")
        if trigger not in HOOK_TRIGGERS:
            raise f.bad("trigger", trigger, f"expected one of {', '.join(HOOK_TRIGGERS)}")
        return cls(job_id=job_id, restart_count=f.integer("restart_count", f.get("restart_count")),
                   node=f.name("node", f.get("node"), "node name"), nodes=nodes,
                   uid=f.integer("uid", f.get("uid")), written_at=f.aware("written_at", f.get("written_at")),
                   parts=tuple(CutPart.parse(p, f"{source} parts[{i}]") for i, p in enumerate(parts)),
                   acks=tuple(got_acks), set_id=None if set_id is None else f.integer("set_id", set_id),
                   preempt_time=_opt_number(f, "preempt_time", f.get("preempt_time", None)),
                   killed_at=_opt_number(f, "killed_at", f.get("killed_at", None)),
                   early=None if early is None else EarlyDecision.parse(early, f"{source} early"),
                   offline=f.string("offline", f.get("offline", "")),
                   job=None if job is None else JobRecord.parse(job, source),
                   partition=f.string("partition", f.get("partition", "")), options=dict(options),
                   trigger=trigger)


@dataclass(frozen=True)
class AgentState:
    """The delivery agent's backoff, in the spool (agent.json): how many
    passes in a row found the service away, when the next may try (Unix
    seconds), and the last error, for `node-agent --status` and doctor."""

    failures: int = 0
    next_try: float = 0.0
    last_error: str = ""
    last_delivered: float | None = None

    FILE = "agent.json"

    def to_json(self) -> dict:
        return {"failures": self.failures, "next_try": self.next_try, "last_error": self.last_error,
                "last_delivered": self.last_delivered}

    @classmethod
    def parse(cls, data, source: str = "") -> "AgentState":
        f = Fields("agent state", data, source)
        f.only(("failures", "next_try", "last_error", "last_delivered"))
        return cls(failures=f.integer("failures", f.get("failures", 0)),
                   next_try=f.number("next_try", f.get("next_try", 0.0)),
                   last_error=f.string("last_error", f.get("last_error", "")),
                   last_delivered=_opt_number(f, "last_delivered", f.get("last_delivered", None)))
