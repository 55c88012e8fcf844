"""What doctor's probes gather and its checks judge: plain records, no I/O."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HookScript:
    """One program Slurm will run for a hook key, as this host sees it.

    `configured`: the value in slurm.conf (a path or a glob, e.g.
    /etc/slurm/prolog.d/*); `path`: one file it names ("" when a glob
    matched nothing here); `text`: that file's start when it could be read
    (None when it could not, or does not exist here)."""
    configured: str
    path: str
    text: str | None = None


@dataclass(frozen=True)
class InventoryReach:
    """Whether this host reaches the inventory: directly (`where` the URL without
    credentials) or through the service (`uid` MUNGE vouched for). `error`
    empty when it does; `driver_error` when the database driver, not
    slurm-snap, refused (a schema that was never created looks like that)."""
    via_service: bool
    where: str
    uid: int | None = None
    error: str = ""
    driver_error: bool = False


@dataclass(frozen=True)
class FsType:
    """What `stat -f` says a class's directory is, against what its backend snapshots."""
    prefix: str
    want: tuple[str, ...]
    got: str = ""
    error: str = ""


@dataclass(frozen=True)
class ClassTools:
    """A volume class's backend as built on one host.

    `over_ssh`: built over SSH, from the controller: "shared" for a shared
    class whose tools run on its host (a Lustre MGS), "node" for a node's
    node-local class; "" built locally. `host` is where (the class's host or
    the node). `error`: building it failed (tool missing, SSH refused).
    `tool_report`: the version or dialect the backend found (None: the
    backend has nothing to say), `tool_error` when asking failed. `fs`:
    None when not checked."""
    name: str
    backend: str
    over_ssh: str = ""
    host: str = ""
    error: str = ""
    tool_report: str | None = None
    tool_error: str = ""
    fs: FsType | None = None

    @property
    def where(self) -> str:
        return self.host or "this host"


@dataclass(frozen=True)
class LocalFacts:
    """slurm-snap's own side on this host (no inventory: not asked, `doctor --local`)."""
    inventory: InventoryReach | None
    classes: tuple[ClassTools, ...]
    barrier_dir: str
    barrier_dir_exists: bool


@dataclass(frozen=True)
class NodeReport:
    """What `doctor --json` printed on a node over SSH (or why it could not run)."""
    node: str
    helper: str
    status: int = 0
    stdout: str = ""
    stderr: str = ""
    error: str = ""


@dataclass(frozen=True)
class NodeFacts:
    """One node as the controller sees it."""
    node: str
    address: str
    host_key_known: bool
    classes: tuple[ClassTools, ...] = ()
    report: NodeReport | None = None


@dataclass(frozen=True)
class TopologyFacts:
    """The cluster as the controller sees it. `service_error`: None when no
    service is configured here, "" when it answered."""
    local_host: str
    nodes: tuple[str, ...]
    service_error: str | None = None
    node_facts: tuple[NodeFacts, ...] = ()


@dataclass(frozen=True)
class FileFacts:
    """A file slurm-snap trusts, as this host has it: `role` says what it is
    (SECURITY.md's words), `owner` its owner's name, `mode` its permission
    bits, `dir_owner`/`dir_mode` the same of the directory holding it (whoever
    may write there may put another file in its place). `exists` False:
    nothing at `path`; `error`: it could not be looked at."""
    role: str
    path: str
    exists: bool
    owner: str = ""
    mode: int = 0
    dir_owner: str = ""
    dir_mode: int = 0
    error: str = ""


@dataclass(frozen=True)
class PortFacts:
    """What may hold the service's port on the controller: the running
    Slurm's configuration (`scontrol show config`), slurmdbd.conf's text
    (None: not readable here) and the kernel's ephemeral range (None:
    unknown)."""
    slurm: dict
    dbd_conf: str | None
    ephemeral: tuple[int, int] | None


@dataclass(frozen=True)
class SudoFacts:
    """What `sudo -n -l` printed on `host` for the SSH account (status and
    text), or `error` when the host could not be asked."""
    host: str
    status: int | None = None
    text: str = ""
    error: str = ""
