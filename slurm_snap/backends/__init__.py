"""Snapshot backends: the contract (base), the registry, transports, one module per filesystem."""
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef
from slurm_snap.backends.registry import get_backend
from slurm_snap.backends.transport import LocalTransport, Result, Transport

__all__ = ["Backend", "Capabilities", "SnapshotRef", "get_backend", "LocalTransport", "Result", "Transport"]
