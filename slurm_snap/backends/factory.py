"""From a volume class in the configuration to a ready backend on the right
host. The only place that decides which transport a class's tools run over,
so the protocol, hooks and restore drills cannot disagree about it."""
from __future__ import annotations

import _thread

from ..config import Config, VolumeClass
from ..errors import ConfigError
from ..record import replace
from .base import Backend, SnapshotRef
from .registry import get_backend
from .transport import LocalTransport, Transport

_cache: dict[tuple, Backend] = {}
_lock = _thread.allocate_lock()   # threading's import costs the hooks' start; the lock is the same


def transport_for(cfg: Config, vc: VolumeClass, node: str | None, *, local: bool = False) -> Transport:
    """`local=True` for code already running on the volume's host (node hooks)."""
    if local or vc.transport == "local":
        return LocalTransport()
    from .ssh import SshTransport  # paramiko only where SSH is used

    if vc.scope == "node-local":
        if not node:
            raise ConfigError(path=cfg.path, key=f"volume_class {vc.name}",
                              why="node-local class over ssh needs a node name")
        host = ssh_host(cfg, node)
    else:
        host = vc.host or cfg.ssh.host_template.replace("{node}", node or "")
        if not host:
            raise ConfigError(path=cfg.path, key=f"volume_class {vc.name}.host",
                              why="a shared class with transport = \"ssh\" needs a host")
    return SshTransport(host, known_hosts=cfg.ssh.known_hosts, key_file=cfg.ssh.key, user=cfg.ssh.user,
                        port=cfg.ssh.port, connect_timeout=cfg.ssh.connect_timeout)


def ssh_host(cfg: Config, node: str) -> str:
    """Where a node's sshd listens: its [ssh.addresses] entry, else host_template."""
    return cfg.ssh.addresses.get(node) or cfg.ssh.host_template.replace("{node}", node)


def backend_for_class(cfg: Config, vc: VolumeClass, node: str | None, *, local: bool = False) -> Backend:
    """A backend for `vc` as seen from `node`; cached per (class, host) so one
    SSH connection serves every volume of that node in a set."""
    options = dict(vc.options)
    options.setdefault("timeout", cfg.timeouts.backend_call)
    key = (cfg.path, vc.name, None if (local or vc.transport == "local" or vc.scope == "shared") else node, local)
    with _lock:
        backend = _cache.get(key)
    if backend is None:
        backend = get_backend(vc.backend, options, transport_for(cfg, vc, node, local=local))
        with _lock:
            _cache.setdefault(key, backend)
            backend = _cache[key]
    return backend


def backend_on_node(cfg: Config, class_name: str, node: str) -> Backend:
    """A node-local class's backend on `node`, seen from the controller (over
    SSH whatever the class's transport: moving a part between two nodes runs
    on neither of them)."""
    vc = cfg.volume_class(class_name)
    if vc is None:
        raise ConfigError(path=cfg.path, key="volume_class", why=f"class {class_name!r} is no longer configured")
    if vc.transport != "ssh":
        vc = replace(vc, transport="ssh")
    return backend_for_class(cfg, vc, node)


def backend_for_volume(cfg: Config, volume, *, local: bool = False) -> Backend:
    """For an inventory Volume row (volume_class, node)."""
    vc = cfg.volume_class(volume.volume_class)
    if vc is None:
        raise ConfigError(path=cfg.path, key="volume_class",
                          why=f"class {volume.volume_class!r} of volume {volume.path!r} is no longer configured")
    return backend_for_class(cfg, vc, volume.node or None, local=local)


def ref_from_row(snapshot) -> SnapshotRef:
    """Rebuild the backend's handle from an inventory Snapshot row."""
    return SnapshotRef(backend=snapshot.backend, volume=snapshot.volume.path, name=snapshot.name,
                       ref=snapshot.ref, path=snapshot.path or None, created_at=snapshot.cut_at)


def reset_cache() -> None:
    with _lock:
        for b in _cache.values():
            try:
                b.transport.close()
            except Exception:
                pass
        _cache.clear()
