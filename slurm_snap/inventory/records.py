"""Plain records passed to the repository: no SQLAlchemy here, so the hooks'
hot path can describe volumes without importing the ORM."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
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
    node: str
    rank: int
    local_rank: int
    local_size: int
    step: int
    written_at: dt.datetime
    manifest: list = field(default_factory=list)


@dataclass(frozen=True)
class SnapshotRecord:
    volume_id: int
    backend: str
    name: str
    ref: str
    path: str
    node: str
    cut_started_at: dt.datetime
    cut_at: dt.datetime
    site: str = ""
    region: str = ""
    shared_key: str = ""
    manifest_ok: bool | None = None


@dataclass
class SetFilter:
    """report's filters, sacct-like. Empty means no restriction."""

    job_ids: Sequence[int] = ()
    job_runs: Sequence[tuple[int, int]] = ()
    users: Sequence[str] = ()
    states: Sequence[str] = ()
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    limit: int | None = None
