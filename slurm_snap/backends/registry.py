"""The one place that maps backend names to classes.

Built-in backends and third-party ones register through the same path: an
entry point in the `slurm_snap.backends` group ("name = module:Class"). The
built-ins are also listed in BUILTINS (the same strings pyproject.toml
declares) so a source checkout that is not pip-installed still has them; an
entry point that repeats a built-in with the same target is the same
registration, one with a different target is a duplicate and is rejected.

Entry points are read when a name that is not built in is asked for, or the
list of names is (config check, doctor, --helpformat-like listings): a Prolog
building the btrfs backend must not pay ~20 ms to import importlib.metadata
and scan every installed distribution on each job's start path.
"""
from __future__ import annotations

import sys

from slurm_snap import errors
from slurm_snap.backends.base import Backend
from slurm_snap.backends.transport import LocalTransport, Transport

TYPE_CHECKING = False   # typing's import would cost every opted-in Prolog ~10 ms
if TYPE_CHECKING:
    from typing import Any, Mapping

GROUP = "slurm_snap.backends"

BUILTINS: dict[str, str] = {
    "btrfs": "slurm_snap.backends.btrfs:BtrfsBackend",
    "xfs-reflink": "slurm_snap.backends.xfs_reflink:ReflinkBackend",
    "zfs": "slurm_snap.backends.zfs:ZfsBackend",
    "lvm": "slurm_snap.backends.lvm:LvmThinBackend",
    "lustre": "slurm_snap.backends.lustre:LustreBackend",
    "gpfs": "slurm_snap.backends.gpfs:GpfsBackend",
    "cephfs": "slurm_snap.backends.cephfs:CephfsBackend",
}


def __getattr__(name):  # `registry.metadata`, imported only when used
    if name == "metadata":
        from importlib import metadata

        return metadata
    raise AttributeError(name)


class Registry:
    def __init__(self) -> None:
        self._targets: dict[str, str] = {}
        self._classes: dict[str, type[Backend]] = {}
        self._plugins_loaded = True  # a bare Registry has no entry points to read

    def load_plugins(self) -> None:
        """Register the entry points of GROUP once (duplicates rejected)."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib import metadata

        for ep in metadata.entry_points(group=GROUP):
            self.register(ep.name, ep.value.replace(" ", ""))

    def register(self, name: str, target: str | type[Backend]) -> None:
        """Register `name` -> "module:Class" (loaded lazily) or a class.

        A name registered twice with a different target is rejected: two
        plugins fighting over `zfs` must be an error, not a coin toss.
        """
        key = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        if name in self._targets:
            if self._targets[name] == key:
                return
            raise errors.Conflict(f"backend {name!r} registered twice: {self._targets[name]} and {key}")
        self._targets[name] = key
        if not isinstance(target, str):
            self._classes[name] = target

    def names(self) -> list[str]:
        self.load_plugins()
        return sorted(self._targets)

    def backend_class(self, name: str) -> type[Backend]:
        if name not in self._targets:
            self.load_plugins()
        if name not in self._targets:
            raise errors.BadValueError(what="backend", value=name,
                                       why=f"unknown (known: {', '.join(self.names())})")
        if name not in self._classes:
            module, _, attr = self._targets[name].partition(":")
            # __import__, not importlib.import_module: the `importlib` package
            # (and the warnings module it loads) is ~1 ms of the Prolog.
            __import__(module)
            cls = getattr(sys.modules[module], attr)
            if not (isinstance(cls, type) and issubclass(cls, Backend)):
                raise errors.ConfigError(path=f"entry point {GROUP}", key=name,
                                         why=f"{self._targets[name]} is not a Backend subclass")
            self._classes[name] = cls
        return self._classes[name]


def _load_default(*, plugins: bool = True) -> Registry:
    reg = Registry()
    for name, target in BUILTINS.items():
        reg.register(name, target)
    reg._plugins_loaded = False
    if plugins:
        reg.load_plugins()
    return reg


_default: Registry | None = None


def default_registry() -> Registry:
    global _default
    if _default is None:
        _default = _load_default(plugins=False)
    return _default


def get_backend(name: str, options: Mapping[str, Any] | None = None,
                transport: Transport | None = None) -> Backend:
    """Build backend `name` with its options on `transport` (local by default).

    Unknown name -> errors.BadValueError naming it; unknown option ->
    errors.ConfigError naming it; missing tool -> errors.ToolMissing.
    """
    cls = default_registry().backend_class(name)
    return cls(dict(options or {}), transport or LocalTransport())
