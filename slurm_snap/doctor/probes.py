"""Everything doctor reads, runs or connects to, gathered as facts (facts.py)
for the pure checks: the files Slurm will run, the inventory, each volume
class's backend (locally or over SSH, host key verified), the service's
socket, the SSH known_hosts file, each node's own doctor over SSH, and the
inventory's recent preemptions. A probe never decides: a failure is a fact.
"""
from __future__ import annotations

import datetime as dt
import glob
import os
import pwd
import stat
import sys

from ..config import Config
from ..errors import SnapError
from ..slurm import hooknames
from ..slurm.commands import DEFAULT_SLURM_CONF
from ..slurm.version import config_values
from .facts import (ClassTools, FileFacts, FsType, HookScript, InventoryReach, LocalFacts, NodeFacts, NodeReport,
                    PortFacts, SudoFacts, TopologyFacts)

# Enough of a hook script to find the entry point's name in a wrapper.
SCRIPT_BYTES = 64 * 1024


def read_text(path: str, limit: int | None = None) -> str | None:
    """A file Slurm reads (None when this host cannot read it: a finding says so)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit) if limit else fh.read()
    except OSError:
        return None


def hook_scripts(slurm: dict[str, str], key: str) -> tuple[HookScript, ...]:
    """What Slurm runs for `key`, as this host has it: each configured value
    (24.11: several), a glob expanded as slurmd expands it, a relative path
    taken from slurm.conf's directory, each file's start read."""
    base = os.path.dirname(slurm.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    out: list[HookScript] = []
    for value in config_values(slurm, key):
        value = value.strip()
        if not value or value == "(null)":
            continue
        pattern = value if value.startswith("/") else os.path.join(base, value)
        if any(c in value for c in "*?["):
            matches = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
            if not matches:
                out.append(HookScript(configured=value, path=""))
            out += [HookScript(configured=value, path=p, text=read_text(p, SCRIPT_BYTES)) for p in matches]
        else:
            out.append(HookScript(configured=value, path=pattern, text=read_text(pattern, SCRIPT_BYTES)))
    return tuple(out)


def all_hook_scripts(slurm: dict[str, str]) -> dict[str, tuple[HookScript, ...]]:
    return {key: hook_scripts(slurm, key) for key in hooknames.ENTRY_POINTS}


def inventory(cfg: Config) -> InventoryReach:
    """Open the inventory (or ask the service) once, read one row."""
    if cfg.via_service:
        from ..service.client import ping

        try:
            return InventoryReach(via_service=True, where=cfg.inventory.url, uid=ping(cfg))
        except SnapError as exc:
            return InventoryReach(via_service=True, where=cfg.inventory.url, error=str(exc))
    where = cfg.inventory.url.split("@")[-1]
    try:
        from ..inventory.repository import Inventory

        inv = Inventory.from_config(cfg)
        with inv.session() as repo:
            repo.events(kind="__doctor__")
        inv.dispose()
    except SnapError as exc:
        return InventoryReach(via_service=False, where=where, error=str(exc))
    except Exception as exc:  # the driver's own error (e.g. no schema): named, never a traceback
        return InventoryReach(via_service=False, where=where, driver_error=True,
                              error=f"{exc.__class__.__name__}: {str(exc).splitlines()[0]}")
    return InventoryReach(via_service=False, where=where)


def class_tools(cfg: Config, vc, *, node: str | None, local: bool, over_ssh: str = "", host: str = "",
                prefix: str | None = None) -> ClassTools:
    """Build the class's backend (which checks its tools: over SSH on its
    host), ask its tool's version, and `stat -f` its directory `prefix`
    (None: not checked)."""
    from ..backends.factory import backend_for_class

    try:
        backend = backend_for_class(cfg, vc, node, local=local)
    except SnapError as exc:
        return ClassTools(vc.name, vc.backend, over_ssh=over_ssh, host=host, error=str(exc))
    report, report_error = None, ""
    try:
        report = backend.tool_report()
    except SnapError as exc:
        report_error = str(exc)
    fs = fs_type(backend, prefix) if prefix is not None else None
    return ClassTools(vc.name, vc.backend, over_ssh=over_ssh, host=host, tool_report=report,
                      tool_error=report_error, fs=fs)


def fs_type(backend, prefix: str) -> FsType | None:
    want = tuple(getattr(backend, "FS_TYPES", ()))
    if not want:
        return None
    try:
        got = backend.transport.run(["/usr/bin/stat", "-f", "-c", "%T", prefix], backend.timeout).text.strip()
    except Exception as exc:
        return FsType(prefix, want, error=str(exc))
    return FsType(prefix, want, got=got)


def local(cfg: Config, *, node: str | None = None, node_local: bool = True, remote: bool = True) -> LocalFacts:
    """slurm-snap's own side on this host.

    `node` is the Slurm node name this host is (doctor run on a node by the
    controller's doctor); `node_local` False leaves node-local classes out,
    for a controller or login host: their scratch is a directory of the
    host's root disk there, not the node's btrfs, and the nodes are checked
    on their own. `remote` False (`doctor --local`) leaves out what another
    host answers: an inventory on a server or behind the service (None), and
    shared classes whose tools run on their host over SSH."""
    host = node or os.uname().nodename
    classes = []
    for vc in cfg.volume_classes:
        if vc.scope == "node-local" and not node_local:
            continue
        if vc.scope == "shared" and vc.transport == "ssh":
            # Its tools run on vc.host (a Lustre MGS, a GPFS manager), driven
            # from the controller: checking this host's PATH would say
            # nothing about them. A node's doctor leaves it to the controller's.
            if node is None and remote:
                classes.append(class_tools(cfg, vc, node=None, local=False, over_ssh="shared",
                                           host=vc.host or "its host", prefix=vc.prefix))
            continue
        prefix = vc.prefix_for(host if vc.scope == "node-local" else None)
        classes.append(class_tools(cfg, vc, node=None, local=True,
                                   prefix=prefix if os.path.isdir(prefix) else None))
    bd = cfg.paths.barrier_dir
    asked = remote or cfg.inventory.url.startswith("sqlite")
    return LocalFacts(inventory=inventory(cfg) if asked else None, classes=tuple(classes), barrier_dir=bd,
                      barrier_dir_exists=os.path.isdir(bd))


def service(cfg: Config) -> str | None:
    """None when this host serves nothing; "" when the service answers a
    MUNGE-authenticated ping (a port that merely accepts, such as
    slurmdbd's, is not the service); else why not."""
    if not cfg.service.listen:
        return None
    from ..service.address import parse_address
    from ..service.client import ping

    host, port = parse_address(cfg.service.listen)
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    try:
        ping(cfg, address=(host, port))
    except SnapError as exc:
        return str(exc)
    return ""


def known_hosts(path: str) -> set[str]:
    hosts: set[str] = set()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) >= 3 and not line.startswith("#"):
                    hosts.update(parts[0].split(","))
    except OSError:
        pass
    return hosts


def node_doctor(cfg: Config, node: str) -> NodeReport:
    """Doctor's local checks on a node, over SSH (host key verified): the same
    slurm-snap and config path as here, as every host has them (etc/README.md)."""
    from ..backends.factory import ssh_host
    from ..backends.ssh import SshTransport

    helper = os.path.join(os.path.dirname(sys.executable), "slurm-snap")
    try:
        t = SshTransport(ssh_host(cfg, node), known_hosts=cfg.ssh.known_hosts, key_file=cfg.ssh.key,
                         user=cfg.ssh.user, port=cfg.ssh.port, connect_timeout=cfg.ssh.connect_timeout)
        r = t.run([helper, "--config", cfg.path, "doctor", "--no-slurm", "--node", node, "--json"], 120)
    except SnapError as exc:
        return NodeReport(node=node, helper=helper, error=str(exc))
    return NodeReport(node=node, helper=helper, status=r.status, stdout=r.text,
                      stderr=r.stderr.decode(errors="replace"))


def topology(cfg: Config, nodes: list[str], *, local_host: str | None = None, node_doctor=None) -> TopologyFacts:
    """The cluster from the controller: the service, and for each node its
    SSH host key, then (only with a known key) its node-local classes over
    SSH and `node_doctor(cfg, node)`'s report (None: not asked)."""
    from ..backends.factory import ssh_host

    local_host = local_host or os.uname().nodename
    ssh_classes = [vc for vc in cfg.volume_classes if vc.scope == "node-local" and vc.transport != "local"]
    per_node: list[NodeFacts] = []
    if nodes and (ssh_classes or node_doctor):
        known = known_hosts(cfg.ssh.known_hosts)
        for node in nodes:
            addr = ssh_host(cfg, node)
            keyed = addr in known or f"[{addr}]:{cfg.ssh.port}" in known
            if not keyed:   # no SSH to a host whose key is unknown
                per_node.append(NodeFacts(node=node, address=addr, host_key_known=False))
                continue
            classes = tuple(class_tools(cfg, vc, node=node, local=False, over_ssh="node", host=node,
                                        prefix=vc.prefix_for(node)) for vc in ssh_classes)
            per_node.append(NodeFacts(node=node, address=addr, host_key_known=True, classes=classes,
                                      report=node_doctor(cfg, node) if node_doctor else None))
    return TopologyFacts(local_host=local_host, nodes=tuple(nodes), service_error=service(cfg),
                         node_facts=tuple(per_node))


def checkpoint_times(inventory_handle, days: int) -> dict[str, list[tuple[float, str]]] | None:
    """Each partition's preemptions in the last `days` days: (first signal ->
    last acknowledgement, label); None when the inventory cannot be read
    (the local probe reports that on its own line)."""
    from sqlalchemy.exc import SQLAlchemyError

    from .. import clock

    try:
        with inventory_handle.session(readonly=True) as repo:
            return repo.preempt_checkpoint_times(clock.utcnow() - dt.timedelta(days=days))
    except (SnapError, SQLAlchemyError):
        return None


MUNGE_KEY = "/etc/munge/munge.key"


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def file_facts(role: str, path: str) -> FileFacts:
    """Owner and mode of `path` (following a link, as its readers do) and of its directory."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return FileFacts(role, path, exists=False)
    except OSError as exc:
        return FileFacts(role, path, exists=False, error=exc.strerror or str(exc))
    try:
        dst = os.stat(os.path.dirname(os.path.realpath(path)) or "/")
        downer, dmode = _owner(dst.st_uid), stat.S_IMODE(dst.st_mode) | (dst.st_mode & stat.S_ISVTX)
    except OSError:
        downer, dmode = "", 0
    return FileFacts(role, path, exists=True, owner=_owner(st.st_uid), mode=stat.S_IMODE(st.st_mode),
                     dir_owner=downer, dir_mode=dmode)


def trusted_files(cfg: Config) -> tuple[FileFacts, ...]:
    """The files SECURITY.md says slurm-snap trusts, as this host has them."""
    from .security_checks import uses_ssh

    out = [file_facts("configuration", cfg.path)]
    url = cfg.inventory.url
    if url.startswith("sqlite:///"):
        db = url[len("sqlite:///"):]
        out += [file_facts("SQLite inventory", p) for p in (db, f"{db}-wal", f"{db}-shm")]
    if uses_ssh(cfg) and not cfg.via_service:
        out += [file_facts("SSH key", cfg.ssh.key), file_facts("SSH known_hosts", cfg.ssh.known_hosts)]
    if os.geteuid() == 0:   # /etc/munge is munge's alone: only root sees the key's mode
        out.append(file_facts("munge key", MUNGE_KEY))
    return tuple(out)


def port_facts(slurm: dict[str, str]) -> PortFacts:
    """Slurm's ports as the running slurmctld reports them, slurmdbd.conf
    beside slurm.conf (root may read it), the kernel's ephemeral range."""
    base = os.path.dirname(slurm.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        ephemeral: tuple[int, int] | None = (lo, hi)
    except (OSError, ValueError):
        ephemeral = None
    return PortFacts(slurm=dict(slurm), dbd_conf=read_text(os.path.join(base, "slurmdbd.conf")), ephemeral=ephemeral)


def sudo_rules(cfg: Config, hosts: list[str]) -> list[SudoFacts]:
    """`sudo -n -l` as the SSH account on each host (host key verified; the
    tool itself, not through sudo). For a non-root [ssh] user."""
    from ..backends.ssh import SshTransport

    out = []
    for host in hosts:
        try:
            t = SshTransport(host, known_hosts=cfg.ssh.known_hosts, key_file=cfg.ssh.key, user=cfg.ssh.user,
                             port=cfg.ssh.port, connect_timeout=cfg.ssh.connect_timeout)
            r = t._run(["sudo", "-n", "-l"], 30, sudo=False)
        except SnapError as exc:
            out.append(SudoFacts(host=host, error=str(exc)))
            continue
        out.append(SudoFacts(host=host, status=r.status, text=r.text))
    return out
