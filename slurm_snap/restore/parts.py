"""From inventory rows to backend objects, for drills and prune.

A snapshot row names its backend and its volume's class; the backend is built
the way the rest of slurm-snap builds it (backends.factory: the class's
options and transport, cached per class and host).
"""
from __future__ import annotations

from typing import Callable

from ..backends.base import Backend
from ..backends.factory import backend_for_volume, ref_from_row
from ..errors import ConfigError

__all__ = ["BackendFor", "backend_resolver", "ref_from_row"]

BackendFor = Callable[[object], Backend]


def backend_resolver(cfg) -> BackendFor:
    """A function Snapshot row -> Backend for that snapshot's volume class and node."""

    def resolve(row) -> Backend:
        backend = backend_for_volume(cfg, row.volume)
        if backend.name != row.backend:
            # The class now uses another filesystem: its backend cannot read this snapshot.
            raise ConfigError(path=cfg.path, key=f"volume_class {row.volume.volume_class}.backend",
                              why=f"is {backend.name!r} but snapshot {row.ref} was cut by {row.backend!r}")
        return backend

    return resolve
