"""report's columns, and sacct's -o syntax for choosing them.

-o NAME[%WIDTH],...: names are case-insensitive and, as in sacct, a unique
prefix is enough. %N prints N characters right-justified, %-N left-justified;
a longer value is cut and ends in '+', as sacct does.

In --snapshots mode one line is one part (one volume's snapshot): the part's
own columns (Node, Volume, Class, Backend, SnapName, SnapState) fill in, and
Cut, Site, Region and Manifest describe the part instead of the whole set.
"""
from __future__ import annotations

from ..errors import BadValueError
from ..record import record
from ..slurm.hostlist import compress
from ..slurm.slurmtime import format_elapsed, format_time

# Annotations only: `report --helpformat` reads the table below without
# importing typing or the rows (issue 36: at most x5 of a bare Python start).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    from .rows import Env, SetRow

    Getter = Callable[[SetRow, object, Env], str]

LEFT, RIGHT = "left", "right"


@record
class Column:
    name: str
    width: int
    align: str
    get: Getter
    help: str
    needs_snaps: bool = False
    needs_drills: bool = False
    # The set columns `get` reads of r.m (report then loads only the chosen
    # columns' ones, issue 36); None: not declared, load every column. The
    # helpers below (_t, _str, _phase...) declare theirs.
    reads: tuple[str, ...] | None = None

    @property
    def keys(self) -> tuple[str, ...] | None:
        return self.reads if self.reads is not None else getattr(self.get, "reads", None)


@record
class Field:
    """A chosen column with the width and alignment it prints with."""

    column: Column
    width: int
    align: str


def _reads(*keys: str):
    def mark(get):
        get.reads = keys
        return get
    return mark


def _t(key: str) -> Getter:
    return _reads(key)(lambda r, s, e: format_time(r.m[key], e.tz))


def _phase(start: str, end: str) -> Getter:
    return _reads(start, end)(lambda r, s, e: format_elapsed(r.phase(start, end)))


def _str(key: str) -> Getter:
    @_reads(key)
    def get(r, s, e) -> str:
        v = r.m[key]
        return "" if v is None else str(v)
    return get


def _snap(key: str) -> Getter:
    return _reads()(lambda r, s, e: "" if s is None or s[key] is None else str(s[key]))


def _ok(value) -> str:
    return "" if value is None else ("ok" if value else "BAD")


@_reads("cut_done_at")
def _cut(r: SetRow, s, e: Env) -> str:
    return format_time(s["cut_at"] if s is not None else r.m["cut_done_at"], e.tz)


def _where(key: str) -> Getter:
    @_reads()
    def get(r: SetRow, s, e: Env) -> str:
        if s is not None:
            return s[key]
        return ",".join(r.sites() if key == "site" else r.regions())
    return get


@_reads()
def _survives(r: SetRow, s, e: Env) -> str:
    if s is not None:
        if s["scope"] != "node-local":
            return ""
        return "yes" if (s.get("copies_elsewhere") or 0) > 0 else "no"
    return {None: "", True: "yes", False: "no"}[r.survives_node_loss()]


@_reads("parts", "expected_parts")
def _volumes(r: SetRow, s, e: Env) -> str:
    parts = r.m.get("parts")
    return f"{'?' if parts is None else parts}/{r.m['expected_parts']}"


@_reads()
def _rpo(r: SetRow, s, e: Env) -> str:
    rpo = r.rpo(e.now)
    return "none" if rpo is None else format_elapsed(rpo)


@_reads("skew_seconds")
def _skew(r: SetRow, s, e: Env) -> str:
    v = r.m["skew_seconds"]
    return "" if v is None else f"{v:.3f}"


def _drill_secs(key: str) -> Getter:
    def get(r, s, e) -> str:
        v = (r.drill or {}).get(key)
        return "" if v is None else f"{v:.2f}"
    return get


_COLUMNS = (
    Column("JobID", 12, LEFT, lambda r, s, e: r.job_label, "job id, with .RESTART for a requeued run",
           reads=("job_id", "restart_count")),
    Column("SetID", 8, RIGHT, _str("set_id"), "snapshot set id (show set:ID); empty for an UNPROTECTED run"),
    Column("User", 9, RIGHT, _str("user_name"), "job owner"),
    Column("Partition", 10, RIGHT, _str("partition"), "partition of the run"),
    Column("Restart", 7, RIGHT, _str("restart_count"), "requeue count of the run"),
    Column("SLUID", 14, RIGHT, _str("sluid"), "Slurm's SLUID of the run (25.11+; a requeued run has its own); empty before"),
    Column("Epoch", 16, RIGHT, _str("epoch"), "snapshot epoch (preempt-N or the request's epoch)"),
    Column("Trigger", 9, RIGHT, _str("trigger"), "preempt, timelimit, manual, periodic or epilog"),
    Column("Wanted", 6, RIGHT, _str("wanted"), "consistency asked for: app or crash"),
    Column("Consistency", 16, RIGHT, _str("consistency"), "the set's label as a point to restore from: "
           "app-consistent, crash-consistent, or none (always none for PARTIAL, FAILED, ROLLED_BACK)"),
    Column("Resumable", 9, RIGHT, lambda r, s, e: "yes" if r.resumable else "no",
           "yes when a requeued run resumes from this set (restorable and app-consistent)"),
    Column("PartsConsistency", 16, RIGHT, _str("parts_consistency"), "what the parts that were cut earned: a "
           "PARTIAL set's may be app-consistent, salvageable by hand, but it is no point to restore from"),
    Column("State", 14, RIGHT, _str("state"), "set state (COMPLETE, VERIFIED, PARTIAL, FAILED, ...); UNPROTECTED: "
           "a run without a set whose declared volumes the Prolog refused"),
    Column("Reason", 24, LEFT, _str("reason"), "why the set is not fully good"),
    Column("Volumes", 7, RIGHT, _volumes, "parts cut / parts expected (MISSING parts not counted)"),
    Column("Nodes", 5, RIGHT, lambda r, s, e: str(len(r.m["nodes"] or ())), "number of nodes of the run",
           reads=("nodes",)),
    Column("NodeList", 16, LEFT, lambda r, s, e: compress(r.m["nodes"] or ()),
           "nodes of the run, as Slurm writes them (n[1-3])", reads=("nodes",)),
    Column("FailedNodes", 16, LEFT, lambda r, s, e: compress(r.m["failed_nodes"] or ()),
           "nodes whose barrier or cut failed (n[1-3])", reads=("failed_nodes",)),
    Column("Requested", 19, RIGHT, _t("requested_at"), "time the snapshot was requested"),
    Column("Signalled", 19, RIGHT, _t("signalled_at"), "time the ranks were signalled"),
    Column("Barrier", 19, RIGHT, _t("barrier_at"), "time the last barrier acknowledgement arrived"),
    Column("Released", 19, RIGHT, _t("released_at"), "preemption: time the job gave its nodes back"),
    Column("Release", 7, RIGHT, _str("release"), "preemption: early (requeued once every rank "
           "acknowledged) or grace (killed at the end of GraceTime)"),
    Column("CutStart", 19, RIGHT, _t("cut_started_at"), "time the first volume cut started"),
    Column("Cut", 19, RIGHT, _cut, "point-in-time of the set (cut done); per part with --snapshots"),
    Column("Finished", 19, RIGHT, _t("finished_at"), "time the set was finalized"),
    Column("Verified", 19, RIGHT, _t("verified_at"), "time a restore drill first passed"),
    Column("Duration", 11, RIGHT, _phase("requested_at", "finished_at"), "requested -> finished"),
    Column("Quiesce", 11, RIGHT, _phase("signalled_at", "barrier_at"), "signalled -> barrier complete"),
    Column("ToRelease", 11, RIGHT, _phase("requested_at", "released_at"), "preemption: signalled -> nodes given back"),
    Column("CutTime", 11, RIGHT, _phase("cut_started_at", "cut_done_at"), "cut started -> cut done"),
    Column("Skew", 8, RIGHT, _skew, "seconds between the first and the last volume cut"),
    Column("Step", 10, RIGHT, _str("checkpoint_step"), "training step of the checkpoint in the set"),
    Column("Manifest", 8, RIGHT, lambda r, s, e: _ok(s["manifest_ok"] if s is not None else r.m["manifest_ok"]),
           "manifest check: ok, BAD or empty (not checked)", reads=("manifest_ok",)),
    Column("Age", 11, RIGHT, lambda r, s, e: format_elapsed(r.age(e.now)), "now - Cut of this set",
           reads=("cut_done_at",)),
    Column("RPO", 11, RIGHT, _rpo, "now - Cut of the job's newest VERIFIED set; none if it has none"),
    Column("Objective", 11, RIGHT, lambda r, s, e: "" if r.objective is None else format_elapsed(r.objective),
           "the run's RPO objective: its --snapshot-every interval (or the partition's default); empty if none",
           reads=("snapshot_every",)),
    Column("RPOMet", 6, RIGHT, lambda r, s, e: {None: "", True: "no", False: "yes"}[r.rpo_missed(e.now)],
           "yes when RPO is within Objective; no when past it or nothing is VERIFIED; empty without an objective",
           reads=("snapshot_every",)),
    Column("DrillNode", 10, RIGHT, lambda r, s, e: (r.drill or {}).get("ran_on") or "",
           "newest drill: the compute node its program started on", needs_drills=True, reads=()),
    Column("DrillQueue", 10, RIGHT, _drill_secs("queued_seconds"),
           "newest drill: its submission -> the program's start (the queue and the nodes' Prologs)",
           needs_drills=True, reads=()),
    Column("FirstStep", 10, RIGHT, _drill_secs("time_to_first_step"),
           "newest drill: the program's start -> its first step, on the node", needs_drills=True, reads=()),
    Column("Survives", 8, RIGHT, _survives, "yes when every node-local part has a copy on another node (the "
           "set survives the loss of any one node), no when one has not; empty without node-local parts; "
           "per part with --snapshots", needs_snaps=True),
    Column("Site", 10, RIGHT, _where("site"), "site of the snapshots", needs_snaps=True),
    Column("Region", 10, RIGHT, _where("region"), "region of the snapshots", needs_snaps=True),
    Column("Node", 10, RIGHT, _snap("node"), "--snapshots: node of the part (empty for shared volumes)"),
    Column("Volume", 24, LEFT, _snap("volume_path"), "--snapshots: live volume path"),
    Column("Class", 10, RIGHT, _snap("volume_class"), "--snapshots: volume class"),
    Column("Backend", 10, RIGHT, _snap("backend"), "--snapshots: snapshot backend"),
    Column("SnapName", 24, LEFT, _snap("name"), "--snapshots: backend's snapshot name"),
    Column("SnapState", 9, RIGHT, _snap("state"), "--snapshots: CUT, DELETING, DELETED or MISSING"),
)
COLUMNS = {c.name.lower(): c for c in _COLUMNS}

DEFAULT_FORMAT = "JobID,User,State,Consistency,Resumable,Cut,Age,Verified,RPO"
DEFAULT_SNAPSHOT_FORMAT = "JobID,SetID,State,Node,Volume,Backend,Cut,Site,Region"
# -l/--long: what an admin reads when a set is not what it should be (sacct's
# -l is its resource-usage columns, which sets do not have).
LONG_FORMAT = ("JobID,SetID,User,Partition,Trigger,State,Consistency,Resumable,PartsConsistency,Reason,Volumes,"
               "NodeList,FailedNodes,"
               "Requested,Cut,Verified,Duration,Quiesce,CutTime,Skew,Step,Manifest,Age,RPO")
LONG_SNAPSHOT_FORMAT = "JobID,SetID,State,Node,Volume,Class,Backend,SnapName,SnapState,Cut,Manifest,Site,Region"

_ITEM = None   # NAME[%WIDTH], compiled on first use: --helpformat needs no `re`


def lookup(name: str, registry: dict[str, Column] = COLUMNS) -> Column:
    key = name.lower()
    if key in registry:
        return registry[key]
    hits = [c for k, c in registry.items() if k.startswith(key)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise BadValueError(what="column", value=name,
                            why=f"ambiguous: {', '.join(c.name for c in hits)}")
    raise BadValueError(what="column", value=name, why="unknown column; --helpformat lists them")


def parse_format(spec: str, registry: dict[str, Column] = COLUMNS) -> list[Field]:
    global _ITEM
    if _ITEM is None:
        import re

        _ITEM = re.compile(r"([A-Za-z][A-Za-z0-9_]*)(?:%(-?\d+))?")
    fields = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise BadValueError(what="format", value=spec, why="empty column name")
        m = _ITEM.fullmatch(item)
        if not m:
            raise BadValueError(what="column", value=item, why="expected NAME or NAME%WIDTH")
        col = lookup(m.group(1), registry)
        width, align = col.width, col.align
        if m.group(2) is not None:
            n = int(m.group(2))
            if n == 0:
                raise BadValueError(what="column width", value=item, why="must not be 0")
            width, align = abs(n), (LEFT if n < 0 else RIGHT)
        fields.append(Field(col, width, align))
    return fields


def helpformat(registry: dict[str, Column] = COLUMNS) -> str:
    """sacct --helpformat lists names in columns; the help text is added because
    names like RPO or Skew need their definition next to them."""
    width = max(len(c.name) for c in registry.values())
    return "\n".join(f"{c.name:<{width}}  {c.help}" for c in registry.values())
