"""cut/<epoch>/<node>.json (CutRecord, one CutPart per volume): what one
node's Epilog cut for a preemption, written beside the acknowledgements on
the shared filesystem. The same parts go to the node's spool
(spool.records.SpoolEntry) for the inventory; this copy is for the requeued
run's head node, whose Prolog judges the preempted run's set from the files
alone (protocol.resume.resume_from_files) when the service cannot be asked.
A job stopped before its time limit (--snapshot-before-timelimit) is cut the
same way; its records say so (`trigger`)."""
from __future__ import annotations

from ..record import record
from .fields import Fields, check_name, iso
from .job import JobRecord

TYPE_CHECKING = False   # annotations only: datetime's import costs every opted-in Epilog ~2 ms
if TYPE_CHECKING:
    from datetime import datetime

PART_STATES = ("CUT", "MISSING")   # states.PART_CUT, states.PART_MISSING (stdlib only here)
HOOK_TRIGGERS = ("preempt", "timelimit")   # states.HOOK_TRIGGERS: what the Epilogs cut for
_PART_FIELDS = ("volume_class", "scope", "node", "path", "backend", "name", "ref", "snapshot_path",
                "cut_started_at", "cut_at", "state", "error", "shared_key", "manifest_ok", "site", "region")


def _opt_time(f: Fields, field: str, value) -> datetime | None:
    return None if value is None else f.aware(field, value)


@record
class CutPart:
    """One volume a node cut (state CUT) or could not (MISSING, with the
    error), with the volume named by class, scope, node ("" when shared)
    and live path: what the node knows without the inventory's row ids."""

    volume_class: str
    scope: str
    node: str
    path: str
    backend: str
    name: str
    ref: str = ""
    snapshot_path: str = ""
    cut_started_at: datetime | None = None
    cut_at: datetime | None = None
    state: str = "CUT"
    error: str = ""
    shared_key: str = ""
    manifest_ok: bool | None = None
    site: str = ""
    region: str = ""

    LABEL = "cut part"

    @property
    def ok(self) -> bool:
        return self.state == "CUT"

    def to_json(self) -> dict:
        return {"volume_class": self.volume_class, "scope": self.scope, "node": self.node, "path": self.path,
                "backend": self.backend, "name": self.name, "ref": self.ref, "snapshot_path": self.snapshot_path,
                "cut_started_at": iso(self.cut_started_at), "cut_at": iso(self.cut_at), "state": self.state,
                "error": self.error, "shared_key": self.shared_key, "manifest_ok": self.manifest_ok,
                "site": self.site, "region": self.region}

    @classmethod
    def parse(cls, data, source: str = "") -> "CutPart":
        f = Fields(cls.LABEL, data, source)
        f.only(_PART_FIELDS)
        state = f.get("state")
        if state not in PART_STATES:
            raise f.bad("state", state, f"expected one of {', '.join(PART_STATES)}")
        scope = f.get("scope")
        if scope not in ("node-local", "shared"):
            raise f.bad("scope", scope, "expected node-local or shared")
        node = f.string("node", f.get("node"))
        if node:
            f.name("node", node, "node name")
        manifest_ok = f.get("manifest_ok", None)
        if manifest_ok is not None and not isinstance(manifest_ok, bool):
            raise f.bad("manifest_ok", manifest_ok, "expected true, false or null")
        return cls(volume_class=f.string("volume_class", f.get("volume_class")), scope=scope, node=node,
                   path=f.abs_path("path", f.get("path"), null=False), backend=f.string("backend", f.get("backend")),
                   name=f.string("name", f.get("name")), ref=f.string("ref", f.get("ref", "")),
                   snapshot_path=f.string("snapshot_path", f.get("snapshot_path", "")),
                   cut_started_at=_opt_time(f, "cut_started_at", f.get("cut_started_at", None)),
                   cut_at=_opt_time(f, "cut_at", f.get("cut_at", None)), state=state,
                   error=f.string("error", f.get("error", "")), shared_key=f.string("shared_key", f.get("shared_key", "")),
                   manifest_ok=manifest_ok, site=f.string("site", f.get("site", "")),
                   region=f.string("region", f.get("region", "")))


@record
class CutRecord:
    """cut/<epoch>/<node>.json: the parts `node` cut for `epoch`, the set's
    id when the node could open it (None: cut without the inventory), the
    request's lower bound it knew (Unix seconds, None: unknown), and the
    preempted run's job.json as the Epilog read it (`job`): the requeued
    run's Prologs write their own job.json, each node's at its own moment,
    so the run that was preempted is described here, where nothing replaces it.
    `trigger` is the set's (HOOK_TRIGGERS): "timelimit" when the run stopped
    before its time limit."""

    epoch: str
    node: str
    parts: tuple[CutPart, ...] = ()
    set_id: int | None = None
    preempt_time: float | None = None
    job: JobRecord | None = None
    trigger: str = "preempt"

    FILE = "cut"

    def to_json(self) -> dict:
        return {"epoch": check_name("epoch", self.epoch), "node": check_name("node name", self.node),
                "parts": [p.to_json() for p in self.parts], "set_id": self.set_id,
                "preempt_time": self.preempt_time, "job": None if self.job is None else self.job.to_json(),
                # Named only when not the default, which an older reader
                # (a node not yet upgraded) still parses.
                **({} if self.trigger == "preempt" else {"trigger": self.trigger})}

    @classmethod
    def parse(cls, data, source: str = "") -> "CutRecord":
        f = Fields("cut record", data, source)
        f.only(("epoch", "node", "parts", "set_id", "preempt_time", "job", "trigger"))
        parts = f.get("parts")
        if not isinstance(parts, list):
            raise f.bad("parts", parts, "expected a list")
        trigger = f.get("trigger", "preempt")
        if trigger not in HOOK_TRIGGERS:
            raise f.bad("trigger", trigger, f"expected one of {', '.join(HOOK_TRIGGERS)}")
        set_id, at, job = f.get("set_id", None), f.get("preempt_time", None), f.get("job", None)
        return cls(epoch=f.name("epoch", f.get("epoch"), "epoch"), node=f.name("node", f.get("node"), "node name"),
                   parts=tuple(CutPart.parse(p, f"{source} parts[{i}]") for i, p in enumerate(parts)),
                   set_id=None if set_id is None else f.integer("set_id", set_id),
                   preempt_time=None if at is None else f.number("preempt_time", at),
                   job=None if job is None else JobRecord.parse(job, source), trigger=trigger)
