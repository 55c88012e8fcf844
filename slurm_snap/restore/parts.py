"""From inventory rows to backend objects, for drills and prune.

A snapshot row names its backend and its volume's class; the backend is built
the way the rest of slurm-snap builds it (backends.factory, with the class's
options and transport), once per (class, node) per run.
"""
from __future__ import annotations

from typing import Callable

from ..backends.base import Backend, SnapshotRef
from ..errors import ConfigError

BackendFor = Callable[[object], Backend]


def ref_from_row(row) -> SnapshotRef:
    """The SnapshotRef a backend understands, rebuilt from an inventory Snapshot row."""
    volume = row.volume.path if getattr(row, "volume", None) is not None else ""
    return SnapshotRef(backend=row.backend, volume=volume, name=row.name, ref=row.ref,
                       path=row.path or None, created_at=row.cut_at)


def backend_resolver(cfg) -> BackendFor:
    """A function Snapshot row -> Backend, caching one backend per (class, node, backend)."""
    cache: dict[tuple[str, str, str], Backend] = {}

    def resolve(row) -> Backend:
        vclass = row.volume.volume_class if getattr(row, "volume", None) is not None else ""
        key = (vclass, row.node or "", row.backend)
        if key not in cache:
            vc = cfg.volume_class(vclass)
            if vc is None:
                raise ConfigError(path=cfg.path, key=f"volume_class {vclass!r}",
                                  why=f"snapshot {row.id} ({row.ref}) needs this class; it is no longer configured")
            from ..backends.factory import backend_for_class

            cache[key] = backend_for_class(cfg, vc, row.node or None)
        return cache[key]

    return resolve
