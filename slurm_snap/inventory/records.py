"""Plain records passed to the repository: no SQLAlchemy here, so the hooks'
hot path can describe volumes without importing the ORM."""
from __future__ import annotations

import datetime as dt
import dataclasses
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class VolumeSpec:
    path: str
    scope: str
    volume_class: str
    backend: str
    node: str = ""
    site: str = ""
    region: str = ""


@dataclass(frozen=True)
class AckRecord:
    """One rank's acknowledgement as the set knows it: what the coordinator or
    a hook read from ack/, what the inventory stores, what the verdict judges.

    `seen_at` is when the reader first saw it (its own clock: an upper bound
    of when the barrier was reached); None when it is being recorded now.
    `world_size` is the launcher's number of ranks (None from clients that
    do not say). `independent` is the job's declaration that its ranks
    checkpoint independently, so mixed steps are one consistent point.
    `agreement` says how the rank chose its step: "" without a process
    group, "collective" when its peers agreed, "failed: WHY" when the
    collective failed. `signalled_at` is when the rank's own checkpoint
    signal reached it (None: never, or an older client).
    """

    node: str
    rank: int
    local_rank: int
    local_size: int
    step: int
    written_at: dt.datetime
    seen_at: dt.datetime | None = None
    manifest: tuple = ()
    world_size: int | None = None
    independent: bool = False
    agreement: str = ""
    signalled_at: dt.datetime | None = None

    @property
    def agreement_failed(self) -> bool:
        return self.agreement.startswith("failed")


@dataclass(frozen=True)
class SnapshotRecord:
    """One part of a set: a volume's snapshot (state CUT) or the record that
    it could not be cut (state MISSING, with the error). For a CUT part,
    `error` holds why its manifest check failed, if it did."""

    volume_id: int
    backend: str
    name: str
    ref: str
    path: str
    node: str
    cut_started_at: dt.datetime | None
    cut_at: dt.datetime | None
    state: str = "CUT"
    error: str = ""
    site: str = ""
    region: str = ""
    shared_key: str = ""
    manifest_ok: bool | None = None

    @property
    def ok(self) -> bool:
        return self.state == "CUT"

    @property
    def manifest_why(self) -> str:
        return self.error if self.ok else ""

    @property
    def failure(self) -> str:
        return "" if self.ok else self.error

    @classmethod
    def of(cls, row) -> "SnapshotRecord":
        """From an inventory Snapshot row."""
        return cls(volume_id=row.volume_id, backend=row.backend, name=row.name, ref=row.ref, path=row.path or "",
                   node=row.node or "", cut_started_at=row.cut_started_at, cut_at=row.cut_at, state=row.state,
                   error=row.error or "", site=row.site or "", region=row.region or "",
                   shared_key=row.shared_key or "", manifest_ok=row.manifest_ok)


@dataclass(frozen=True)
class Refusal:
    """A declared volume the node Prolog refused, and why (the hooks' hot path
    builds these, so they live here, away from the ORM)."""

    node: str          # "" for a shared volume (refused on the head node)
    path: str
    why: str


@dataclass
class SetFilter:
    """report's filters, sacct-like. Empty means no restriction."""

    job_ids: Sequence[int] = ()
    job_runs: Sequence[tuple[int, int]] = ()
    users: Sequence[str] = ()
    states: Sequence[str] = ()
    partitions: Sequence[str] = ()
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    limit: int | None = None


# ---- records on the wire (the slurm-snap service) ------------------------------
def to_json(rec) -> dict:
    """A record as JSON: times as ISO 8601 with their offset."""
    out = {}
    for f in dataclasses.fields(rec):
        v = getattr(rec, f.name)
        out[f.name] = v.isoformat() if isinstance(v, dt.datetime) else (list(v) if isinstance(v, tuple) else v)
    return out


_TIMES = {"written_at", "seen_at", "cut_started_at", "cut_at", "signalled_at"}


def from_json(cls, data: dict):
    """The inverse of to_json, refusing unknown fields by name."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        from ..errors import BadValueError

        raise BadValueError(what=f"{cls.__name__} field", value=unknown[0], why="unknown")
    kw = {}
    for k, v in data.items():
        if k in _TIMES and v is not None:
            v = dt.datetime.fromisoformat(v)
        elif k == "manifest":
            v = tuple(v)
        kw[k] = v
    return cls(**kw)


@dataclass(frozen=True)
class CopyRecord:
    """A node-local part put on another node (or the attempt that failed):
    one row of part_copy. `purpose` is "restore" (brought to where a requeued
    run's ranks now are), "partner" (a second copy against a node's loss) or
    "drill" (brought to where a drill placed on other nodes runs the rank;
    deleted, and marked DELETED, when the drill ends)."""

    snapshot_id: int
    node: str
    ref: str
    path: str
    purpose: str
    source_node: str
    ranks: tuple[int, ...] = ()
    for_restart: int | None = None
    method: str = ""
    bytes: int | None = None
    seconds: float | None = None
    state: str = "OK"
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "OK"
