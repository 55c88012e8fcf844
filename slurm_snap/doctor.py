"""Installation checks: Slurm's running configuration against slurm-snap's.

Each check yields Finding(ok, what, fix). The checks are pure functions of
the two configurations (plus the filesystem for the plugstack file), so they
are testable with captured `scontrol show config` output.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .config import Config
from .slurm import clifilter, hooknames
from .slurm.commands import DEFAULT_SLURM_CONF
from .slurm.duration import slurm_seconds
from .slurm.version import OLDEST, SlurmVersion, config_values
from .errors import ConfigError
from . import states as S


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str
    fix: str = ""


def budget_seconds(cfg: Config) -> float:
    """What a preemption needs inside the grace window: the ranks' checkpoint
    and acknowledgement (timeouts.barrier). The cuts run in the node Epilog,
    after the job's processes are gone, under the hook budget instead."""
    return cfg.timeouts.barrier


def check_slurm(cfg: Config, slurm: dict[str, str], partitions: list[dict[str, str]],
                plugstack_text: str | None) -> list[Finding]:
    out: list[Finding] = []
    flags = slurm.get("PrologFlags", "")
    out.append(Finding("alloc" in flags.lower(), "PrologFlags includes Alloc (Prolog runs on every node at allocation)",
                       "add PrologFlags=Alloc to slurm.conf (without it the Prolog runs only where a step lands)"))
    for key in hooknames.ENTRY_POINTS:
        name = hooknames.entry_point_name(key)
        vals = config_values(slurm, key)
        out.append(Finding(any(name in v for v in vals), f"{key} runs {name}",
                           f"set {key}=/path/to/{name} in slurm.conf (etc/slurm.conf.slurm-snap)"))
    version = running_version(slurm)
    key, value = version.preempt_signal_setting
    out.append(Finding(value in _items(slurm.get(key, "")),
                       f"the user's signal is sent at preemption ({key}={value}, Slurm {version})",
                       f"add {key}={value} to slurm.conf (the spelling of Slurm {version.major}.{version.minor:02d}; "
                       "otherwise ranks get SIGTERM, not the checkpoint signal)"))
    cli = slurm.get("CliFilterPlugins", "").lower()
    js = slurm.get("JobSubmitPlugins", "").lower()
    out.append(Finding("lua" in cli or "slurm_snap" in js,
                       "--snapshot-on-preempt asks Slurm for the signal (cli_filter or job_submit)",
                       "CliFilterPlugins=lua with etc/cli_filter.lua beside slurm.conf"))
    if plugstack_text is None:
        out.append(Finding(False, "plugstack.conf readable", f"create {slurm.get('PlugStackConfig', 'plugstack.conf')}"))
    else:
        lines = [ln.strip() for ln in plugstack_text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        ours = [ln for ln in lines if "slurm_snap" in ln and ".so" in ln]
        out.append(Finding(bool(ours), "plugstack.conf loads slurm_snap.so",
                           "add the line from etc/plugstack.conf, then restart slurmd"))
        if ours:
            obsolete = [a for ln in ours for a in ln.split() if a.startswith(("signal=", "grace="))]
            out.append(Finding(not obsolete, "plugstack.conf's slurm_snap.so line carries only helper= and config=",
                               f"remove {' '.join(obsolete)}: the plugin no longer reads them; the signal and "
                               f"its time come from [protocol] in {cfg.path} (cli_filter.lua is written from it)"))
    conf = slurm.get("SLURM_CONF", "")
    hooks_read = cfg.slurm.conf or DEFAULT_SLURM_CONF
    if conf:
        out.append(Finding(conf == hooks_read,
                           f"the slurmctld hooks reach Slurm through {hooks_read} (slurmctld reads {conf})",
                           f"set [slurm] conf = \"{conf}\" in {cfg.path}: PrologSlurmctld and EpilogSlurmctld "
                           "run without SLURM_CONF, and EpilogSlurmctld cannot see a preemption without squeue"))
    need = budget_seconds(cfg)
    for p in partitions:
        mode = p.get("PreemptMode", "").upper()
        if mode not in ("REQUEUE", "CANCEL"):
            continue
        grace = slurm_seconds(p.get("GraceTime", "0")) or 0
        name = p.get("PartitionName", "?")
        out.append(Finding(grace >= need,
                           f"partition {name}: GraceTime {grace} s fits checkpoint + barrier ({need:g} s)",
                           f"raise GraceTime of {name} to at least {int(need) + 1} s, or lower "
                           f"timeouts.barrier in {cfg.path}"))
    for key in version.hook_timeout_keys:
        pet = slurm_seconds(slurm.get(key))
        if pet:
            out.append(Finding(cfg.timeouts.hook_budget < pet,
                               f"hook budget {cfg.timeouts.hook_budget:g} s is under {key} {pet} s",
                               f"lower timeouts.hook_budget in {cfg.path} below {pet} s"))
    return out


def running_version(slurm: dict[str, str]) -> SlurmVersion:
    """The version slurmctld reports (SLURM_VERSION in `scontrol show
    config`); without one, the oldest supported."""
    try:
        return SlurmVersion.parse(slurm["SLURM_VERSION"])
    except (KeyError, ConfigError):
        return OLDEST


def _items(value: str) -> list[str]:
    # "preempt_send_user_signal" must not satisfy a check for "send_user_signal".
    return [v.strip() for v in value.split(",")]


# GraceTime must hold the slowest checkpoint seen with room for the model to
# grow: less than half again is a problem (the next, slightly slower
# checkpoint ends crash-consistent); the suggestion adds a fixed margin for the
# signal's own delivery.
GRACE_HEADROOM, GRACE_MARGIN = 1.5, 10


def suggest_grace(slowest: float) -> int:
    return int(slowest * GRACE_HEADROOM + 0.999) + GRACE_MARGIN


def check_grace_observed(cfg: Config, partitions: list[dict[str, str]],
                         observed: dict[str, list[tuple[float, str]]], days: int) -> list[Finding]:
    """Each preempting partition's GraceTime against the checkpoint times its
    preemptions took (first signal -> last acknowledgement, from the
    inventory): a problem when it is under the slowest x 1.5, with the
    suggestion slowest x 1.5 + 10 s either way. Too short a GraceTime turns
    the slow checkpoints into crash-consistent sets; with
    protocol.early_release a longer one costs nothing for jobs that finish
    their checkpoint, since they give their nodes back at once."""
    out: list[Finding] = []
    for p in partitions:
        if p.get("PreemptMode", "").upper() not in ("REQUEUE", "CANCEL"):
            continue
        name = p.get("PartitionName", "?")
        grace = slurm_seconds(p.get("GraceTime", "0")) or 0
        times = observed.get(name, [])
        if not times:
            out.append(Finding(True, f"partition {name}: no preemption with acknowledgements in the last "
                                     f"{days} days; GraceTime {grace} s not yet checked against checkpoints"))
            continue
        slowest = max(t for t, _ in times)
        short = sum(1 for _, label in times if label != S.APP)
        want = suggest_grace(slowest)
        seen = (f"slowest checkpoint of {len(times)} preemption(s) in {days} days: {slowest:.1f} s"
                + (f", {short} not app-consistent" if short else ""))
        fix = f"raise GraceTime of {name} to {want} s (slowest {slowest:.1f} s x {GRACE_HEADROOM:g} + {GRACE_MARGIN} s)"
        if cfg.protocol.early_release:
            fix += "; with protocol.early_release the nodes still come back as soon as every rank has acknowledged"
        out.append(Finding(grace >= slowest * GRACE_HEADROOM,
                           f"partition {name}: GraceTime {grace} s holds the observed checkpoints "
                           f"({seen}; suggested at least {want} s)", fix))
    return out


def check_cli_filter(cfg: Config, path: str, text: str | None) -> list[Finding]:
    """cli_filter.lua asks Slurm for the signal and time the configuration names."""
    fix = f"slurm-snap config cli-filter etc/cli_filter.lua > {path}"
    if text is None:
        return [Finding(False, f"cli_filter.lua readable at {path}", fix)]
    sig, secs = clifilter.wanted(cfg)
    got = clifilter.settings(text)
    return [Finding(got == (sig, secs), f"cli_filter.lua asks for --signal={sig}@{secs} "
                                        f"(has {got[0] or '?'}@{got[1] if got[1] is not None else '?'})", fix)]


def check_entry_point(cfg: Config, path: str, text: str | None, defaults: str | None = None) -> list[Finding]:
    """The PrologSlurmctld entry point records in the background only if the
    configuration allows it (policy `closed` must record before the launch).
    `defaults` is the text of the file the entry point reads its site
    overrides from (its DEFAULTS=, /etc/default/slurm-snap for the package)."""
    if text is None:
        return [Finding(False, f"PrologSlurmctld entry point {path} readable", f"install {path} (etc/README.md)")]
    m = re.search(r"^RECORD=(\S+)", text, re.M)
    mode = m.group(1) if m else "foreground"
    where = path
    o = re.search(r"^RECORD=(\S+)", defaults or "", re.M)
    if o:
        mode = o.group(1)
        d = re.search(r"^DEFAULTS=(\S+)", text, re.M)
        where = d.group(1) if d else where
    want = "background" if cfg.hooks.records_in_background else "foreground"
    return [Finding(mode == want, f"PrologSlurmctld entry point records in the {want} (RECORD={mode})",
                    f"set RECORD={want} in {where} (failure_policy {cfg.hooks.failure_policy!r}, "
                    f"record_in_background {str(cfg.hooks.record_in_background).lower()})")]


def check_local(cfg: Config, *, node: str | None = None, node_local: bool = True,
                remote: bool = True) -> list[Finding]:
    """slurm-snap's own side: inventory, backends' tools.

    `node` is the Slurm node name this host is (doctor run on a node by the
    controller's doctor); `node_local` False leaves node-local classes out,
    for a controller or login host: their scratch is a directory of the
    host's root disk there, not the node's btrfs, and the nodes are checked
    on their own. `remote` False (`doctor --local`) leaves out what another
    host answers: an inventory on a server or behind the service, and
    shared classes whose tools run on their host over SSH."""
    out: list[Finding] = []
    from .errors import SnapError

    try:
        if not remote and not cfg.inventory.url.startswith("sqlite"):
            raise _Done
        if cfg.via_service:
            from .service.client import ping

            uid = ping(cfg)
            out.append(Finding(True, f"inventory reachable through the slurm-snap service "
                                     f"({cfg.inventory.url}, MUNGE uid {uid})"))
            raise _Done
        from .inventory.repository import Inventory

        inv = Inventory.from_config(cfg)
        with inv.session() as repo:
            repo.events(kind="__doctor__")
        inv.dispose()
        out.append(Finding(True, f"inventory reachable ({cfg.inventory.url.split('@')[-1]})"))
    except _Done:
        pass
    except SnapError as exc:
        fix = ("start `slurm-snap serve` on the controller and munged here (etc/README.md, \"The service\")"
               if cfg.via_service else "fix [inventory] url, run `slurm-snap db upgrade`")
        out.append(Finding(False, f"inventory: {exc}", fix))
    except Exception as exc:  # schema missing shows up as a driver error
        out.append(Finding(False, f"inventory: {exc.__class__.__name__}: {str(exc).splitlines()[0]}",
                           "run `slurm-snap db upgrade`"))
    from .backends.factory import backend_for_class

    host = node or os.uname().nodename
    for vc in cfg.volume_classes:
        if vc.scope == "node-local" and not node_local:
            continue
        if vc.scope == "shared" and vc.transport == "ssh":
            # Its tools run on vc.host (a Lustre MGS, a GPFS manager), driven
            # from the controller: checking this host's PATH would say
            # nothing about them. A node's doctor leaves it to the controller's.
            if node is None and remote:
                out.extend(check_shared_over_ssh(cfg, vc))
            continue
        try:
            backend = backend_for_class(cfg, vc, None, local=True)
            out.append(Finding(True, f"volume class {vc.name}: backend {vc.backend} tools present"))
        except SnapError as exc:
            out.append(Finding(False, f"volume class {vc.name}: {exc}",
                               f"install the tool on this host, or fix volume_class {vc.name!r}"))
            continue
        out.extend(check_tool_report(vc, backend, where="this host"))
        prefix = vc.prefix_for(host if vc.scope == "node-local" else None)
        if os.path.isdir(prefix):
            out.extend(check_fs_type(vc, backend, prefix, where="this host"))
    bd = cfg.paths.barrier_dir
    out.append(Finding(os.path.isdir(bd), f"barrier directory {bd} exists",
                       f"create {bd} on a filesystem every node mounts"))
    return out


def check_shared_over_ssh(cfg: Config, vc) -> list[Finding]:
    """A shared class whose tools run on another host: build its backend over
    SSH (host key verified), which runs the tool check there, then check the
    prefix's filesystem there."""
    from .backends.factory import backend_for_class
    from .errors import SnapError

    where = vc.host or "its host"
    try:
        backend = backend_for_class(cfg, vc, None)
    except SnapError as exc:
        return [Finding(False, f"volume class {vc.name} over SSH on {where}: {exc}",
                        f"check {where}'s sshd, its host key in {cfg.ssh.known_hosts} and the tool there, "
                        f"or fix volume_class {vc.name!r}")]
    return [Finding(True, f"volume class {vc.name} over SSH on {where}: backend {vc.backend} tools present")
            ] + check_tool_report(vc, backend, where=where) + check_fs_type(vc, backend, vc.prefix, where=where)


def slurm_unreachable(exc: Exception) -> Finding:
    """What doctor says instead of the Slurm checks when scontrol cannot ask
    slurmctld: the other checks still run and print."""
    return Finding(False, f"Slurm unreachable: {exc}",
                   "start slurmctld (and munged) on the controller, or point SLURM_CONF / [slurm] conf at its "
                   "slurm.conf; `slurm-snap doctor --no-slurm` checks slurm-snap's side alone")


class _Done(Exception):
    """The service answered: nothing more to check about the inventory here."""


def check_tool_report(vc, backend, *, where: str) -> list[Finding]:
    """Which version or CLI dialect the class's backend found (zfs: OpenZFS
    >= 0.8 or the older zfs-fuse-style CLI), so a site can hold it against
    what docs/backends.md says was tested; a tool that cannot say is a failure."""
    from .errors import SnapError

    try:
        said = backend.tool_report()
    except SnapError as exc:
        return [Finding(False, f"volume class {vc.name} on {where}: cannot tell the {vc.backend} tool's "
                               f"version: {exc}",
                        f"run the {vc.backend} tool by hand on {where} (docs/backends.md: what to check first)")]
    if said is None:
        return []
    return [Finding(True, f"volume class {vc.name} on {where}: backend {vc.backend} found {said}")]


def check_fs_type(vc, backend, prefix: str, *, where: str) -> list[Finding]:
    """Is the class's directory on the filesystem its backend snapshots? A
    scratch path that is plain ext4 on one node cuts nothing there."""
    want = getattr(backend, "FS_TYPES", ())
    if not want:
        return []
    try:
        got = backend.transport.run(["/usr/bin/stat", "-f", "-c", "%T", prefix], backend.timeout).text.strip()
    except Exception as exc:
        return [Finding(False, f"volume class {vc.name} on {where}: cannot stat {prefix}: {exc}",
                        f"make {prefix} exist on {where}")]
    return [Finding(got in want, f"volume class {vc.name} on {where}: {prefix} is {got or '?'} "
                                 f"(backend {vc.backend} needs {' or '.join(want)})",
                    f"mount the {want[0]} filesystem at {prefix} on {where}, or fix volume_class {vc.name!r}")]


def check_topology(cfg: Config, nodes: list[str], *, local_host: str | None = None,
                   run_on_node=None) -> list[Finding]:
    """The controller's view of the cluster: where the inventory is, whether
    every node can be reached over SSH with a known host key, whether each
    node's node-local classes are the backend they claim, and (with
    `run_on_node`, which runs doctor's own checks on a node) whether each
    node reaches the inventory."""
    out: list[Finding] = []
    local_host = local_host or os.uname().nodename
    others = [n for n in nodes if n != local_host]
    if cfg.inventory.url.startswith("sqlite") and others and not cfg.service.listen:
        out.append(Finding(False, f"SQLite inventory on {local_host} with {len(others)} other hosts and no "
                                  "slurm-snap service: node Epilogs cannot record",
                           "set [service] listen here and run `slurm-snap serve` (nodes and login hosts: "
                           "[inventory] url = \"slurm-snap://ADDR:PORT\"), or use PostgreSQL/MariaDB"))
    if cfg.service.listen:
        import socket

        from .service.address import parse_address

        host, port = parse_address(cfg.service.listen)
        try:
            socket.create_connection((host, port), timeout=5).close()
            out.append(Finding(True, f"slurm-snap service listening on {cfg.service.listen}"))
        except OSError as exc:
            out.append(Finding(False, f"slurm-snap service not answering on {cfg.service.listen} "
                                      f"({exc.strerror or exc})", "start `slurm-snap serve` (etc/README.md)"))
    ssh_classes = [vc for vc in cfg.volume_classes if vc.scope == "node-local" and vc.transport != "local"]
    if not nodes or not (ssh_classes or run_on_node):
        return out
    from .backends.factory import backend_for_class, ssh_host
    from .errors import SnapError

    known = _known_hosts(cfg.ssh.known_hosts)
    for node in nodes:
        addr = ssh_host(cfg, node)
        keyed = addr in known or f"[{addr}]:{cfg.ssh.port}" in known
        out.append(Finding(keyed, f"{node}: SSH host key of {addr} in {cfg.ssh.known_hosts}"
                           + ("" if keyed else " missing"),
                           f"add {node}'s host key (ssh-keyscan -p {cfg.ssh.port} {addr}, check its fingerprint) "
                           f"to {cfg.ssh.known_hosts}"))
        if not keyed:
            continue
        for vc in ssh_classes:
            try:
                backend = backend_for_class(cfg, vc, node)
                out.append(Finding(True, f"{node}: volume class {vc.name} over SSH: backend {vc.backend} tools present"))
            except SnapError as exc:
                out.append(Finding(False, f"{node}: volume class {vc.name} over SSH: {exc}",
                                   f"install the tool on {node}, or fix [ssh] / volume_class {vc.name!r}"))
                continue
            out.extend(check_tool_report(vc, backend, where=node))
            out.extend(check_fs_type(vc, backend, vc.prefix_for(node), where=node))
        if run_on_node is not None:
            out.extend(run_on_node(node))
    return out


def _known_hosts(path: str) -> set[str]:
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
