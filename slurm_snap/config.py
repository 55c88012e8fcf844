"""Load and validate slurm-snap's one TOML configuration file.

The file is read once per process into frozen dataclasses. Every key is known:
an unknown key or a wrong type is a ConfigError naming the key and the file,
because a typo in a hook's configuration would otherwise surface only at
preemption time, which is the worst moment to learn about it.

Length: one file for the one schema. Half of it is the declarative table of
every section and key (frozen dataclasses, each key's default and meaning);
the rest is the reader that walks that table and the checks of what a type
cannot say (ranges, paths, signal names), kept in the same file as the keys
they check, so a new key and its rule are added in one file.
"""
from __future__ import annotations

import os

from . import configcache
from .errors import ConfigError
from .record import factory, record
from .states import WANT_APP, WANTED

DEFAULT_PATH = "/etc/slurm-snap/slurm-snap.toml"
ENV_VAR = "SLURM_SNAP_CONFIG"

SCOPES = ("node-local", "shared")
POLICIES = ("open", "closed")


@record
class InventoryConfig:
    # SQLite must sit on a local disk of the host that runs the coordinator and
    # the slurmctld hooks; PostgreSQL/MariaDB URLs may be written from any host.
    url: str = "sqlite:////var/lib/slurm-snap/inventory.db"
    # Seconds a writer waits for a lock before failing.
    busy_timeout: float = 30.0


@record
class ServiceConfig:
    # On the controller: where `slurm-snap serve` listens ("ADDR[:PORT]",
    # port 6830 when left out: none of Slurm's 6817-6820). Nodes and login
    # hosts do not set it: their [inventory] url names it
    # (slurm-snap://ADDR[:PORT]) and they hold no database credentials.
    listen: str = ""
    # munged's socket; "" is munge's own default (/run/munge/munge.socket.2).
    munge_socket: str = ""
    # How long a request may run (a snapshot, a restore drill); past it the
    # service ends the request and tells the client.
    timeout: float = 3600.0
    # A request must arrive whole within this many seconds: a client that
    # sends a byte at a time holds a connection no longer.
    request_timeout: float = 10.0
    # Requests served at once; one more is refused as busy (logged with its
    # peer) and the client tries again for up to 30 s.
    max_connections: int = 64
    # Requests of one user served at once (root's, the hooks', count only
    # against max_connections).
    max_per_user: int = 8
    # Nodes and login hosts: how long to wait for the service to accept a
    # connection. A hook gives up on it (and keeps what it cut in its spool)
    # after at most this, so it must stay well inside timeouts.hook_budget.
    connect_timeout: float = 5.0
    # On the controller: serve's sweeper finalizes sets left in flight and
    # drills left RUNNING. It looks every sweep_every seconds and finalizes a
    # set sweep_after seconds past its deadline (docs/design.md, "No set
    # waits for a person": the bound is deadline + sweep_after + sweep_every).
    sweep_every: float = 15.0
    sweep_after: float = 30.0


@record
class PathsConfig:
    # Users may only declare volumes below these roots; no symlink below a
    # root is ever followed.
    allowed_roots: tuple[str, ...] = ()
    # On a filesystem every node of a job sees: ranks write acknowledgements
    # here and the coordinator watches one directory instead of N nodes.
    barrier_dir: str = "/var/spool/slurm-snap/barriers"
    # Spare namespace where restore drills put their clones; never a live volume.
    restore_root: str = "/var/tmp/slurm-snap-restore"
    # Where the hooks append hooks.log (one JSON line per hook run); rotated
    # by the packages' logrotate file.
    log_dir: str = "/var/log/slurm-snap"


@record
class NodeConfig:
    # This host's Slurm node name, for its agent's node tasks (slurm_snap/nodetasks):
    # "" = the short host name (NodeName is the host name at most sites).
    name: str = ""


@record
class SpoolConfig:
    # Each node's own durable spool of what its Epilogs cut while the service
    # or the database was away (slurm_snap/spool): on the node's local disk,
    # never the barrier directory's shared filesystem.
    directory: str = "/var/spool/slurm-snap/spool"
    # Past this many bytes of undelivered entries a new one is refused (the
    # part is still cut; the hook log says so). One entry is a few kB.
    max_bytes: int = 64 << 20
    # Space kept allocated and given up when the disk is full, so the entry
    # of the Epilog that finds it full still lands.
    reserve_bytes: int = 4 << 20


@record
class ProtocolConfig:
    # Sent to every rank to ask for a checkpoint (ranks also take SIGTERM as
    # one); cli_filter.lua is written from it (`config cli-filter`).
    checkpoint_signal: str = "SIGUSR1"
    # Label a set crash-consistent when barriers are missing, instead of failing it.
    allow_crash_consistent: bool = True
    # What --snapshot-on-preempt asks for when the user does not say ("app" or "crash").
    default_consistency: str = WANT_APP
    # Seconds asked of Slurm for --signal at submit (cli_filter); 0 = the partition's GraceTime.
    grace: int = 0
    # At preemption, rank 0 requeues the job as soon as every rank acknowledged
    # (client/early.py) instead of letting it hold its nodes to GraceTime's end.
    early_release: bool = True


@record
class TimeoutsConfig:
    # Seconds from the checkpoint request to the last rank's acknowledgement;
    # request + barrier + cut must fit the partition's GraceTime (doctor checks).
    barrier: float = 60.0
    # Seconds one backend tool call (a snapshot, a clone) may take.
    backend_call: float = 30.0
    # Seconds a whole hook may take: keep it well under Slurm's
    # PrologEpilogTimeout/MessageTimeout.
    hook_budget: float = 25.0
    # Seconds a restore drill may take, clone to first step.
    restore: float = 900.0
    # Seconds one Slurm command (squeue, scontrol) may take.
    slurm_command: float = 10.0


@record
class HooksConfig:
    # "open": a failing hook records why and exits 0, so slurm-snap never
    # drains a node; "closed": it exits non-zero and Slurm fails the job.
    failure_policy: str = "open"
    # PrologSlurmctld's entry point records the job after handing the launch
    # back (RECORD=background, written by the install step from this and the
    # policy): "closed" must see the recording succeed before the launch.
    record_in_background: bool = True

    @property
    def records_in_background(self) -> bool:
        return self.record_in_background and self.failure_policy != "closed"


@record
class AccessConfig:
    # Users who, besides a job's owner, may act on any job.
    operator_users: tuple[str, ...] = ("root",)
    # Members of this group are operators too ("" = none).
    operator_group: str = ""


@record
class SshConfig:
    # The SSH transport (to compute nodes, a Lustre MGS, a GPFS manager) logs
    # in as this user, with this private key only.
    user: str = "root"
    key: str = "/etc/slurm-snap/id_ed25519"
    # Host keys are verified against this file; an unknown host is refused.
    known_hosts: str = "/etc/slurm-snap/known_hosts"
    # sshd's port on every host reached.
    port: int = 22
    # Seconds to wait for a TCP connection and the SSH handshake.
    connect_timeout: float = 10.0
    # How to reach a compute node by its Slurm name; "{node}" is replaced.
    host_template: str = "{node}"
    # Node name -> host or address, for nodes whose name does not resolve
    # (Slurm's NodeAddr differs from NodeName); consulted before host_template.
    addresses: dict = factory(dict)


@record
class RestoreConfig:
    # Refuse a restore target outside the snapshot's site/region.
    enforce_residency: bool = False
    # May a job's owner (not an operator) name the drill's --target? Off by
    # default: the clone tools take paths, and a user who owns a parent of
    # their target could swap it for a link mid-drill (SECURITY.md).
    user_targets: bool = False
    # This cluster's site and region, compared with a volume class's when
    # enforce_residency is true.
    site: str = ""
    region: str = ""
    # The schedule runner drills every COMPLETE set of a job with a resume
    # command within this of its cut ("" = no scheduled drills), e.g. "1h".
    verify_within: str = ""
    # Seconds a requeued run's Prolog (through the controller) may spend
    # bringing node-local parts of the set it resumes from to the nodes its
    # ranks now run on; past it the run starts without them, and
    # resume.json, show and the job's output say which parts are missing.
    # 0: never move them.
    move_budget: float = 60.0
    # After the cut, the schedule runner copies every node-local part of each
    # restorable set to a partner node (the next node of the job's node list),
    # incrementally against the previous set's part where the backend can
    # (btrfs send -p), so the loss of one node loses no set (SCR's Partner).
    partner_copies: bool = False
    # Seconds one runner pass may spend on partner copies.
    partner_budget: float = 600.0
    # Where a drill's program runs. "job" (default): as a Slurm job of the
    # owner on the nodes that hold the set's node-local parts, which the
    # job's Prolog clones there (restore/submit.py, restore/onnode.py).
    # "local": in the process that runs the drill, on its host, for
    # single-host sites only (doctor warns): users' programs would run on
    # the controller.
    mode: str = "job"
    # The drill job's partition ("" = the drilled job's own) and QOS ("" =
    # the partition's default): a site may keep drills on a low-priority
    # partition/QOS of the same nodes.
    partition: str = ""
    qos: str = ""
    # sbatch --nice of drill jobs: behind the site's own work.
    nice: int = 1000
    # Seconds a drill job may wait in the queue before the drill gives up
    # (abandoned, not failed: the set is drilled again later).
    queue_timeout: float = 600.0


@record
class RepairConfig:
    # A node Slurm has DOWN, DRAIN(ED) or FAIL with a reason matching this
    # (case-insensitive) is lost with its disk: `repair` makes every set whose
    # only copy of a node-local part was there PARTIAL. Drained for
    # maintenance is not lost: the reason must say hardware.
    lost_reason: str = r"hardware|\bhw\b|disk|nvme|ssd|failed|dead|lost|replace"
    # Also ask each node's backend whether the snapshots recorded there still
    # exist (a disk replaced under a node Slurm still runs).
    probe_parts: bool = True


@record
class ScheduleConfig:
    # Partition -> interval of periodic snapshots for jobs that did not ask
    # with --snapshot-every ("*" = every partition), e.g. {"gpu" = "2h"}.
    every: dict = factory(dict)
    # Partition -> the shortest interval a job there gets ("*" = every
    # partition): a job asking for less is snapshotted at this.
    min_every: dict = factory(dict)
    # Sets one runner pass takes at once; each start waits signal_gap
    # seconds after the previous, so jobs due together are not signalled together.
    concurrency: int = 4
    # Seconds between two signals of one pass.
    signal_gap: float = 0.5
    # Drills one runner pass runs at once, newest set first.
    drills: int = 2


@record
class SlurmConfig:
    # slurm.conf as slurmctld reads it. PrologSlurmctld and EpilogSlurmctld
    # run without SLURM_CONF (measured on 22.05): without this, their squeue
    # reads Slurm's compiled-in default and, on a cluster whose slurm.conf is
    # elsewhere, cannot see the job (EpilogSlurmctld then misses every
    # preemption). "" = SLURM_CONF if the environment has it, else the default.
    conf: str = ""
    # Where Slurm's client commands are, when not in /usr/bin (a Slurm built
    # under its own prefix, e.g. /opt/slurm-24.11/bin): hooks get no PATH, and
    # another version's squeue in /usr/bin would be refused by slurmctld.
    bin_dir: str = ""


@record
class VolumeClass:
    # What users write in --snapshot-volumes: letters, digits, - or _.
    name: str
    # The directory the class's volumes live under ("{node}" is replaced by
    # the node's name for node-local classes).
    prefix: str
    # "node-local" (one volume per node of the job) or "shared" (one for the job).
    scope: str
    # The snapshot backend: btrfs, xfs-reflink, zfs, lvm, lustre, gpfs, cephfs
    # or a plugin's name (docs/backends.md).
    backend: str
    # Where the class's data lives, for restore.enforce_residency.
    site: str = ""
    region: str = ""
    # Jobs that declare no volumes get every default class.
    default: bool = False
    # The Prolog creates a per-job volume "<prefix>/jobs/<job_id>" owned by the user.
    per_job: bool = True
    # "local" runs the backend's tools where the hook runs; "ssh" on `host`
    # (shared scope) or on the job's node (node-local scope).
    transport: str = "local"
    # The host a shared class's tools run on with transport "ssh" (a Lustre MGS).
    host: str = ""
    # The backend's own settings ([volume_class.options]; docs/backends.md).
    options: dict = factory(dict)

    def prefix_for(self, node: str | None) -> str:
        # "{node}" lets several slurmd on one host keep separate scratch trees
        # (the dev cluster); on a real cluster the prefix is the same everywhere.
        return self.prefix.replace("{node}", node or "")

    def job_path(self, node: str | None, job_id: int) -> str:
        return f"{self.prefix_for(node)}/jobs/{job_id}"


@record
class Config:
    path: str
    inventory: InventoryConfig = InventoryConfig()
    paths: PathsConfig = PathsConfig()
    protocol: ProtocolConfig = ProtocolConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    hooks: HooksConfig = HooksConfig()
    access: AccessConfig = AccessConfig()
    ssh: SshConfig = SshConfig()
    node: NodeConfig = NodeConfig()
    restore: RestoreConfig = RestoreConfig()
    service: ServiceConfig = ServiceConfig()
    spool: SpoolConfig = SpoolConfig()
    slurm: SlurmConfig = SlurmConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    repair: RepairConfig = RepairConfig()
    volume_classes: tuple[VolumeClass, ...] = ()

    @property
    def via_service(self) -> bool:
        """True on a host that reaches the inventory through the controller's
        slurm-snap service (a node or login host without database credentials)."""
        return self.inventory.url.startswith("slurm-snap://")

    def volume_class(self, name: str) -> VolumeClass | None:
        for vc in self.volume_classes:
            if vc.name == name:
                return vc
        return None

    def snapshot_every(self, partition: str, asked: int | None) -> tuple[int | None, str]:
        """Seconds between a job's periodic snapshots in `partition` when it
        asked for `asked` (None: did not ask), and why, if not as asked: the
        partition's default ([schedule] every) for a job that did not ask,
        raised to the partition's minimum ([schedule] min_every). "*" is
        the entry for every partition without its own."""
        sch = self.schedule

        def lookup(table: dict, key: str):
            text = table.get(partition, table.get("*"))
            return None if text is None else duration_seconds(text, key=f"schedule.{key}", path=self.path)

        every, why = asked, ""
        if every is None:
            every = lookup(sch.every, "every")
            if every is not None:
                why = f"the default of partition {partition or '*'}"
        floor = lookup(sch.min_every, "min_every")
        if every is not None and floor is not None and every < floor:
            every, why = floor, f"raised to partition {partition or '*'}'s minimum"
        return every, why

    @property
    def signal_number(self) -> int:
        import _signal  # the C module: `signal` would import enum on the hooks' path

        return int(getattr(_signal, self.protocol.checkpoint_signal))


SECTIONS = {
    "inventory": InventoryConfig,
    "paths": PathsConfig,
    "protocol": ProtocolConfig,
    "timeouts": TimeoutsConfig,
    "hooks": HooksConfig,
    "access": AccessConfig,
    "ssh": SshConfig,
    "node": NodeConfig,
    "restore": RestoreConfig,
    "service": ServiceConfig,
    "spool": SpoolConfig,
    "slurm": SlurmConfig,
    "schedule": ScheduleConfig,
    "repair": RepairConfig,
}

# Below this, periodic snapshots would do little but signal the job.
MIN_EVERY_SECONDS = 10


def default_path() -> str:
    return os.environ.get(ENV_VAR) or DEFAULT_PATH


def load(path: str | os.PathLike | None = None) -> Config:
    path = str(path or default_path())
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = configcache.read(path, st)
            if data is not None:   # validated by an earlier process, file unchanged
                return _from_dict(data, path)
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(path=path, key="(file)", why="no such file") from None
    except OSError as exc:
        raise ConfigError(path=path, key="(file)", why=exc.strerror or str(exc)) from None
    import tomllib  # here, not at the top: a cached configuration needs no TOML parser

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(path=path, key="(file)", why=f"not UTF-8 at byte {exc.start}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path=path, key="(syntax)", why=str(exc)) from None
    cfg = from_dict(data, path)
    configcache.write(path, st, data)
    return cfg


def from_dict(data: dict, path: str = "<memory>") -> Config:
    cfg = _from_dict(data, path)
    _check_semantics(cfg)
    return cfg


def _from_dict(data: dict, path: str) -> Config:
    kwargs: dict = {"path": path}
    for key, value in data.items():
        if key in SECTIONS:
            kwargs[key] = _build(SECTIONS[key], value, path, key)
        elif key == "volume_class":
            if not isinstance(value, list):
                raise ConfigError(path=path, key=key, why="must be an array of tables ([[volume_class]])")
            kwargs["volume_classes"] = tuple(
                _build(VolumeClass, item, path, f"volume_class[{i}]") for i, item in enumerate(value)
            )
        else:
            raise ConfigError(path=path, key=key, why="unknown key")
    return Config(**kwargs)


def _build(cls, value, path: str, where: str):
    if not isinstance(value, dict):
        raise ConfigError(path=path, key=where, why="must be a table")
    kwargs = {}
    for key, item in value.items():
        if key not in cls.__record_fields__:
            raise ConfigError(path=path, key=f"{where}.{key}", why="unknown key")
        kwargs[key] = _coerce(cls.__annotations__[key], item, path, f"{where}.{key}")
    missing = [name for name in cls.__record_fields__ if name not in kwargs and name not in cls.__record_defaults__]
    if missing:
        raise ConfigError(path=path, key=f"{where}.{missing[0]}", why="required key missing")
    return cls(**kwargs)


def _coerce(hint: str, item, path: str, key: str):
    """`item` as the type the key is annotated with (the annotation's text:
    this module's annotations are strings, and reading them as such needs no
    `typing`)."""
    def bad(expected: str):
        return ConfigError(path=path, key=key, why=f"expected {expected}, got {type(item).__name__} {item!r}")

    if hint == "bool":
        if not isinstance(item, bool):
            raise bad("a boolean")
        return item
    if hint == "int":
        if isinstance(item, bool) or not isinstance(item, int):
            raise bad("an integer")
        return item
    if hint == "float":
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise bad("a number")
        return float(item)
    if hint == "str":
        if not isinstance(item, str):
            raise bad("a string")
        return item
    if hint == "dict":
        if not isinstance(item, dict):
            raise bad("a table")
        return item
    if hint == "tuple[str, ...]":
        if not isinstance(item, list) or not all(isinstance(x, str) for x in item):
            raise bad("an array of strings")
        return tuple(item)
    raise bad(hint)


def _check_semantics(cfg: Config) -> None:
    p = cfg.path
    if cfg.hooks.failure_policy not in POLICIES:
        raise ConfigError(path=p, key="hooks.failure_policy",
                          why=f"{cfg.hooks.failure_policy!r} is not one of {', '.join(POLICIES)}")
    if cfg.protocol.default_consistency not in WANTED:
        raise ConfigError(path=p, key="protocol.default_consistency",
                          why=f"{cfg.protocol.default_consistency!r} is not one of {', '.join(WANTED)}")
    import signal as _signal

    sig = cfg.protocol.checkpoint_signal
    # Signals, not the other IntEnums of the module (SIG_DFL, SIG_IGN, SIG_BLOCK... are ints too).
    if not (sig.startswith("SIG") and isinstance(getattr(_signal, sig, None), _signal.Signals)) \
            or sig in ("SIGKILL", "SIGSTOP"):
        raise ConfigError(path=p, key="protocol.checkpoint_signal", why=f"{sig!r} is not a catchable signal name")
    if cfg.protocol.grace < 0:
        raise ConfigError(path=p, key="protocol.grace", why="must not be negative")
    for name in ("barrier", "backend_call", "hook_budget", "restore", "slurm_command"):
        if getattr(cfg.timeouts, name) <= 0:
            raise ConfigError(path=p, key=f"timeouts.{name}", why="must be positive")
    if cfg.slurm.conf and (not os.path.isabs(cfg.slurm.conf) or ".." in cfg.slurm.conf.split("/")):
        raise ConfigError(path=p, key="slurm.conf", why=f"{cfg.slurm.conf!r} is not a clean absolute path")
    if cfg.slurm.bin_dir and (not os.path.isabs(cfg.slurm.bin_dir) or ".." in cfg.slurm.bin_dir.split("/")):
        raise ConfigError(path=p, key="slurm.bin_dir", why=f"{cfg.slurm.bin_dir!r} is not a clean absolute path")
    for key in ("barrier_dir", "restore_root", "log_dir"):
        if not os.path.isabs(getattr(cfg.paths, key)):
            raise ConfigError(path=p, key=f"paths.{key}", why=f"{getattr(cfg.paths, key)!r} is not absolute")
    for i, root in enumerate(cfg.paths.allowed_roots):
        if not os.path.isabs(root) or ".." in root.split("/"):
            raise ConfigError(path=p, key=f"paths.allowed_roots[{i}]", why=f"{root!r} is not a clean absolute path")
    from .service.address import SCHEME, parse_address

    if cfg.inventory.url.startswith(SCHEME):
        parse_address(cfg.inventory.url[len(SCHEME):], what="inventory.url", config=p)
    if cfg.service.listen:
        parse_address(cfg.service.listen, what="service.listen", config=p)
    for name in ("timeout", "request_timeout", "max_connections", "max_per_user",
                 "connect_timeout", "sweep_every", "sweep_after"):
        if getattr(cfg.service, name) <= 0:
            raise ConfigError(path=p, key=f"service.{name}", why="must be positive")
    if not os.path.isabs(cfg.spool.directory) or ".." in cfg.spool.directory.split("/"):
        raise ConfigError(path=p, key="spool.directory", why=f"{cfg.spool.directory!r} is not a clean absolute path")
    if cfg.spool.max_bytes < 1 << 20:
        raise ConfigError(path=p, key="spool.max_bytes", why="must be at least 1048576 (one entry can be 700 kB)")
    if cfg.spool.reserve_bytes < 0:
        raise ConfigError(path=p, key="spool.reserve_bytes", why="must not be negative")
    if not 0 < cfg.ssh.port < 65536:
        raise ConfigError(path=p, key="ssh.port", why=f"{cfg.ssh.port} is not a TCP port")
    for node, host in cfg.ssh.addresses.items():
        if not node or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in node):
            raise ConfigError(path=p, key=f"ssh.addresses.{node}", why="a node name is letters, digits, '-', '_', '.'")
        # The host reaches paramiko and error messages: one token, printable.
        if not isinstance(host, str) or not host or any(not c.isprintable() or c.isspace() for c in host):
            raise ConfigError(path=p, key=f"ssh.addresses.{node}",
                              why=f"expected a host name or address, got {host!r}")
    if cfg.node.name and not all(c.isascii() and (c.isalnum() or c in "-_.") for c in cfg.node.name):
        raise ConfigError(path=p, key="node.name", why="a node name is letters, digits, '-', '_', '.'")
    _check_schedule(cfg)
    seen = set()
    for i, vc in enumerate(cfg.volume_classes):
        where = f"volume_class[{i}]"
        if not vc.name or not vc.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(path=p, key=f"{where}.name", why=f"{vc.name!r} must be letters, digits, - or _")
        if vc.name in seen:
            raise ConfigError(path=p, key=f"{where}.name", why=f"duplicate volume class {vc.name!r}")
        seen.add(vc.name)
        if vc.scope not in SCOPES:
            raise ConfigError(path=p, key=f"{where}.scope", why=f"{vc.scope!r} is not one of {', '.join(SCOPES)}")
        if not vc.prefix.startswith("/") or ".." in vc.prefix.split("/"):
            raise ConfigError(path=p, key=f"{where}.prefix", why=f"{vc.prefix!r} is not a clean absolute path")
        if "{node}" in vc.prefix and vc.scope != "node-local":
            raise ConfigError(path=p, key=f"{where}.prefix", why="{node} is only meaningful for node-local classes")
        if vc.transport not in ("local", "ssh"):
            raise ConfigError(path=p, key=f"{where}.transport", why=f"{vc.transport!r} is not local or ssh")


def duration_seconds(text: str, *, key: str, path: str) -> int:
    """A configured duration in whole seconds, or a ConfigError naming the key."""
    from .slurm.duration import parse_duration
    from .errors import BadValueError

    try:
        return int(parse_duration(text, what=key).total_seconds())
    except BadValueError as exc:
        raise ConfigError(path=path, key=key, why=str(exc)) from None


def _check_schedule(cfg: Config) -> None:
    p, sch = cfg.path, cfg.schedule
    for table in ("every", "min_every"):
        for part, text in getattr(sch, table).items():
            key = f"schedule.{table}.{part}"
            if not isinstance(text, str):
                raise ConfigError(path=p, key=key, why=f"expected a duration such as \"2h\", got {text!r}")
            if duration_seconds(text, key=key, path=p) < MIN_EVERY_SECONDS:
                raise ConfigError(path=p, key=key, why=f"{text!r} is under {MIN_EVERY_SECONDS} s")
    if sch.concurrency < 1:
        raise ConfigError(path=p, key="schedule.concurrency", why="must be at least 1")
    if sch.drills < 0:
        raise ConfigError(path=p, key="schedule.drills", why="must not be negative")
    if sch.signal_gap < 0:
        raise ConfigError(path=p, key="schedule.signal_gap", why="must not be negative")
    import re

    try:
        re.compile(cfg.repair.lost_reason, re.I)
    except re.error as exc:
        raise ConfigError(path=p, key="repair.lost_reason", why=f"not a regular expression: {exc}") from None
    if cfg.restore.partner_budget <= 0:
        raise ConfigError(path=p, key="restore.partner_budget", why="must be positive")
    if cfg.restore.mode not in ("job", "local"):
        raise ConfigError(path=p, key="restore.mode", why=f"{cfg.restore.mode!r} is not \"job\" or \"local\"")
    if not 0 <= cfg.restore.nice <= 2147483645:
        raise ConfigError(path=p, key="restore.nice", why=f"{cfg.restore.nice} is not sbatch --nice's 0..2147483645")
    if cfg.restore.queue_timeout <= 0:
        raise ConfigError(path=p, key="restore.queue_timeout", why="must be positive")
    for key in ("partition", "qos"):
        value = getattr(cfg.restore, key)
        if value and not all(c.isalnum() or c in "-_." for c in value):
            raise ConfigError(path=p, key=f"restore.{key}", why=f"{value!r} is not a Slurm {key} name")
    if cfg.restore.move_budget < 0:
        raise ConfigError(path=p, key="restore.move_budget", why="must be >= 0 (0: never move node-local parts)")
    if cfg.restore.verify_within and duration_seconds(cfg.restore.verify_within, key="restore.verify_within",
                                                      path=p) <= 0:
        raise ConfigError(path=p, key="restore.verify_within", why="must be positive (or \"\" for no drills)")


def as_dict(cfg: Config) -> dict:
    """The effective configuration, for `config check` and the doctor."""
    import dataclasses

    out = dataclasses.asdict(cfg)
    out["volume_class"] = out.pop("volume_classes")
    return out
