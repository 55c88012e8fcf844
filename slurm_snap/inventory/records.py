"""Plain records passed to the repository: no SQLAlchemy here, so the hooks'
hot path can describe parts and refusals without importing the ORM. The
per-job files' records (the acknowledgement, the volume) are
slurm_snap.jobrecords', which the repository takes as they are."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Sequence

from .. import states as S


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
    state: str = S.PART_CUT
    error: str = ""
    site: str = ""
    region: str = ""
    shared_key: str = ""
    manifest_ok: bool | None = None

    @property
    def ok(self) -> bool:
        return self.state == S.PART_CUT

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
    state: str = S.COPY_OK
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.state == S.COPY_OK
