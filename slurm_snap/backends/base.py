"""The backend contract: what every snapshot backend MUST do.

A backend turns a *volume* (a path, dataset, logical volume, fileset...) into
read-only point-in-time snapshots and back into writable clones. The protocol
layer only ever talks to this interface and decides by `capabilities` (data),
never by isinstance checks. Each backend lives in its own module; tools run
through a Transport (local subprocess or SSH), never through a shell.
"""
from __future__ import annotations

import abc
import os
import stat as _stat

from slurm_snap import errors
from slurm_snap.backends.transport import Result, Transport
from slurm_snap.record import record

TYPE_CHECKING = False   # typing's import would cost every opted-in Prolog ~10 ms
if TYPE_CHECKING:
    import datetime as dt
    from typing import Any, ClassVar, Literal, Mapping

    Scope = Literal["volume", "fileset", "filesystem"]

# Snapshot names end up as path components and tool arguments on every
# filesystem we support; this is the intersection that is safe everywhere
# (no leading '-' or '.', so no option injection or hidden/relative names).
# Sets rather than a regular expression: `re` would cost the hooks ~6 ms.
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_NAME_REST = _NAME_FIRST | frozenset(".:-")

DEFAULT_TIMEOUT = 60.0


@record
class Capabilities:
    """What a backend's snapshots are, as data the protocol can decide on."""

    atomic: bool          # the whole volume is cut at one instant
    read_only: bool       # the snapshot refuses writes (enforced, not advisory)
    instant: bool         # cost does not grow with the amount of data
    per_file_cost: bool   # cost grows with the number of files
    scope: Scope          # what one snapshot covers
    needs_root: bool      # the tool must run as root on the target host
    can_clone: bool       # clone() is implemented
    # How a snapshot reaches another host (backends.transfer): `send` is the
    # filesystem's own stream (btrfs/zfs send), incremental against a parent
    # both hosts hold; `copy` a tar stream of the snapshot's files, always full.
    can_send: bool = False
    can_copy: bool = False


@record
class SnapshotRef:
    """A snapshot as the inventory records it.

    `ref` is the string the backend understands (e.g. `tank/home@s1`,
    `/mnt/.snapshots/s1`); `path` is where its files are visible, if anywhere.
    """

    backend: str
    volume: str
    name: str
    ref: str
    path: str | None = None
    created_at: dt.datetime | None = None


def check_name(name: str) -> str:
    """Reject snapshot names that are unsafe as a path component or argument."""
    if not (isinstance(name, str) and 0 < len(name) <= 200 and name[0] in _NAME_FIRST
            and _NAME_REST.issuperset(name)):
        raise errors.BadValueError(
            what="snapshot name", value=name,
            why="use 1-200 of A-Z a-z 0-9 _ . : -, not starting with '.' or '-'")
    return name


def _file_type(st: os.stat_result) -> str:
    """What `stat -c %F` calls the file `st` describes."""
    m = st.st_mode
    if _stat.S_ISREG(m):
        return "regular file" if st.st_size else "regular empty file"
    for test, name in ((_stat.S_ISDIR, "directory"), (_stat.S_ISLNK, "symbolic link"), (_stat.S_ISFIFO, "fifo"),
                       (_stat.S_ISSOCK, "socket"), (_stat.S_ISCHR, "character special file"),
                       (_stat.S_ISBLK, "block special file")):
        if test(m):
            return name
    return "weird file"


def check_abs_path(what: str, value: str) -> str:
    """Volumes given as paths: absolute, no NUL or newline (any other byte is fine)."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise errors.BadValueError(what=what, value=value, why="must be an absolute path")
    if any(c in value for c in "\0\n\r"):
        raise errors.BadValueError(what=what, value=value, why="must not contain NUL or newlines")
    if any(part in (".", "..") for part in value.split("/")):
        raise errors.BadValueError(what=what, value=value, why="must not contain '.' or '..' components")
    return value.rstrip("/") or "/"


class Backend(abc.ABC):
    """One filesystem's snapshot verbs.

    Subclasses set `name`, `TOOLS` (tool names resolved on the target host at
    construction) and `OPTIONS` (option name -> (type, default)); the registry
    rejects options not listed there. Optional verbs raise errors.Unsupported.

    Common options every backend accepts:
      tool_dir  -- look tools up in this absolute directory instead of the fixed
                   PATH (/usr/sbin:/usr/bin:/sbin:/bin); how tests use fakes.
      timeout   -- seconds one tool call may take before errors.Timeout.
    """

    name: ClassVar[str] = "abstract"
    # What `stat -f -c %T` prints for a directory this backend can snapshot
    # (doctor checks each node's path); () when there is nothing to check.
    FS_TYPES: ClassVar[tuple[str, ...]] = ()
    # Filesystem tools: looked up in the tool_dir option if set, else the fixed PATH.
    TOOLS: ClassVar[tuple[str, ...]] = ()
    # Plain coreutils the backend needs on the target host: always the fixed PATH.
    UTILS: ClassVar[tuple[str, ...]] = ()
    OPTIONS: ClassVar[Mapping[str, tuple[type, Any]]] = {}
    COMMON_OPTIONS: ClassVar[Mapping[str, tuple[type, Any]]] = {
        "tool_dir": (str, None),
        "timeout": (float, DEFAULT_TIMEOUT),
    }

    def __init__(self, options: Mapping[str, Any], transport: Transport):
        self.transport = transport
        self.options = self.parse_options(options)
        self.timeout = float(self.options["timeout"])
        self.tools: dict[str, str] = {}
        self.check()

    # -- options and tools --------------------------------------------------
    @classmethod
    def option_spec(cls) -> dict[str, tuple[type, Any]]:
        return {**cls.COMMON_OPTIONS, **cls.OPTIONS}

    @classmethod
    def parse_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        spec = cls.option_spec()
        where = f"backend {cls.name}"
        for key in options:
            if key not in spec:
                raise errors.ConfigError(path=where, key=key,
                                         why=f"unknown option (known: {', '.join(sorted(spec))})")
        parsed: dict[str, Any] = {}
        for key, (typ, default) in spec.items():
            value = options.get(key, default)
            if value is not None and not isinstance(value, typ):
                if typ is float and isinstance(value, int) and not isinstance(value, bool):
                    value = float(value)
                else:
                    raise errors.ConfigError(path=where, key=key,
                                             why=f"expected {typ.__name__}, got {value!r}")
            parsed[key] = value
        if parsed["tool_dir"] is not None:
            check_abs_path("tool_dir", parsed["tool_dir"])
        if parsed["timeout"] <= 0:
            raise errors.ConfigError(path=where, key="timeout", why="must be > 0")
        return parsed

    def check(self) -> None:
        """Resolve every tool on the target host; errors.ToolMissing names the first missing one."""
        found = self.transport.find_tools(self.TOOLS, self.options["tool_dir"], self.timeout)
        found.update(self.transport.find_tools(self.UTILS, None, self.timeout))
        for tool in (*self.TOOLS, *self.UTILS):
            if found.get(tool) is None:
                raise errors.ToolMissing(self.name, tool, self.transport.where)
            self.tools[tool] = found[tool]

    # -- running tools ------------------------------------------------------
    def run(self, tool: str, *args: str, ok: tuple[int, ...] = (0,), input: bytes | None = None) -> Result:
        """Run a resolved tool; non-`ok` status -> errors.CommandFailed with its stderr."""
        argv = [self.tools[tool], *args]
        result = self.transport.run(argv, self.timeout, input=input)
        if result.status not in ok:
            where = self.transport.where
            # One line for the CLI and the inventory's event log; long enough for any real error.
            lines = [ln.strip() for ln in result.stderr.decode(errors="replace").splitlines() if ln.strip()]
            raise errors.CommandFailed(
                argv0=tool if where == "localhost" else f"{tool} (on {where})", status=result.status,
                stderr=" / ".join(lines)[:2000] or "(no stderr)", argv=argv, host=where)
        return result

    # -- path helpers for backends whose volumes are directories -----------
    # (need "test", "stat", "mkdir", "find" in UTILS). On a transport that
    # runs here (`transport.local`) they ask the kernel directly, with the
    # same answers: a process per question cost an opted-in Prolog ~2 ms
    # for each `test -e` and the cut ~1 ms for each `stat`.
    def path_exists(self, path: str) -> bool:
        if self.transport.local:
            return os.path.exists(path)     # follows a link, as test -e does
        return self.run("test", "-e", path, ok=(0, 1)).status == 0

    def inode(self, path: str) -> int | None:
        if self.transport.local:
            try:
                return os.lstat(path).st_ino   # not through a link, as stat without -L
            except OSError:
                return None
        res = self.run("stat", "-c", "%i", "--", path, ok=(0, 1))
        return int(res.text.strip()) if res.status == 0 else None

    def volume_dir(self, what: str, volume: str) -> tuple[str, int]:
        """(path, inode) of a volume that is a directory, in one `stat`.

        MUST refuse a symlink as a symlink, never follow it: a volume checked
        at submit and swapped for a link later would have root snapshot (and
        a drill clone out) whatever the link points to. errors.NotFound when
        nothing is there, errors.BadValueError for a link or a non-directory.
        """
        volume = check_abs_path(what, volume)
        if self.transport.local:
            try:
                st = os.lstat(volume)
            except OSError:
                raise errors.NotFound(what=what, value=volume) from None
            kind, ino = _file_type(st), st.st_ino
        else:
            res = self.run("stat", "-c", "%F:%i", "--", volume, ok=(0, 1))
            if res.status != 0:
                raise errors.NotFound(what=what, value=volume)
            kind, _, raw = res.text.strip().rpartition(":")
            ino = int(raw)
        if kind == "symbolic link":
            raise errors.BadValueError(what=what, value=volume,
                                       why="is a symlink; refusing to follow it (declare the directory itself)")
        if kind != "directory":
            raise errors.BadValueError(what=what, value=volume, why=f"is a {kind}, not a directory")
        return volume, ino

    @classmethod
    def volume_problem(cls, path: str, inode: int) -> str | None:
        """Why the directory `path` (with inode number `inode`) cannot be
        snapshotted on its own by this backend, and what to do instead; None
        if it can (the default: any directory).

        Pure, so that the submit host, which runs no filesystem tool and as
        the user, can judge a declared path from its own stat() before the
        job runs, in the very words the backend would fail with later.
        """
        return None

    def mkdir_p(self, path: str) -> None:
        if self.transport.local:
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise errors.CommandFailed(argv0="mkdir", status=1, argv=["mkdir", "-p", "--", path],
                                           host=self.transport.where,
                                           stderr=f"mkdir: cannot create directory '{path}': {exc.strerror}") from None
            return
        self.run("mkdir", "-p", "--", path)

    def listdir(self, path: str) -> list[str]:
        """Entry names in `path` (not recursive); [] if it does not exist."""
        if self.transport.local:
            # find starts at a link without following it, and lists nothing in it.
            if os.path.islink(path) or not os.path.isdir(path):
                return []
            return sorted(os.listdir(path))
        if not self.path_exists(path):
            return []
        out = self.run("find", path, "-mindepth", "1", "-maxdepth", "1", "-printf", "%f\\0").stdout
        return sorted(n.decode(errors="surrogateescape") for n in out.split(b"\0") if n)

    def ref(self, volume: str, name: str, ref: str, path: str | None = None,
            created_at: dt.datetime | None = None) -> SnapshotRef:
        return SnapshotRef(self.name, volume, name, ref, path, created_at)

    # -- the contract -------------------------------------------------------
    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend's snapshots are (see Capabilities)."""

    @abc.abstractmethod
    def create(self, volume: str, name: str) -> SnapshotRef:
        """Make a read-only point-in-time snapshot `name` of `volume`.

        MUST be idempotent: if `name` already exists for `volume`, return it
        unchanged (Slurm may run a hook twice). MUST raise errors.SnapshotCollision
        if `name` exists for a *different* volume. MUST NOT leave a partial
        snapshot that list() or exists() would report as complete.
        """

    @abc.abstractmethod
    def list(self, volume: str) -> list[SnapshotRef]:
        """Return every snapshot of `volume` this backend can see, sorted by name.

        MUST NOT include snapshots of other volumes, or incomplete ones.
        """

    @abc.abstractmethod
    def exists(self, ref: SnapshotRef) -> bool:
        """True if the snapshot is still there and complete."""

    @abc.abstractmethod
    def delete(self, ref: SnapshotRef) -> bool:
        """Remove the snapshot. MUST return False (not raise) if it is already gone."""

    def clone(self, ref: SnapshotRef, target: str) -> str:
        """Make a new writable copy of the snapshot at `target` and return its path.

        MUST refuse (errors.AlreadyExists) an existing target; MUST leave the
        snapshot itself read-only. Optional: raises errors.Unsupported.
        """
        raise errors.Unsupported(backend=self.name, verb="clone")

    def check_clone_target(self, ref: SnapshotRef, target: str) -> str:
        """What every clone() checks first: a fresh absolute target, an existing snapshot."""
        target = check_abs_path("clone target", target)
        if self.path_exists(target):
            raise errors.AlreadyExists(what="clone target", value=target)
        if not self.exists(ref):
            raise errors.NotFound(what="snapshot", value=ref.ref)
        return target

    def delete_clone(self, path: str) -> bool:
        """Remove a writable clone made by clone(). MUST return False if it is
        already gone, and MUST NOT follow a symlink at `path`. The caller has
        checked that `path` is a clone it made (restore namespaces only).
        Optional: raises errors.Unsupported.
        """
        raise errors.Unsupported(backend=self.name, verb="delete_clone")

    def create_volume(self, path: str) -> str:
        """Create an empty volume at `path` that can be snapshotted on its own
        (the Prolog's per-job volume). MUST refuse an existing path
        (errors.AlreadyExists). Optional: raises errors.Unsupported, and the
        caller then makes a plain directory inside the class's volume.
        """
        raise errors.Unsupported(backend=self.name, verb="create_volume")

    # -- moving a snapshot to another host (backends.transfer drives these) --
    def send_argv(self, ref: SnapshotRef, parent: SnapshotRef | None = None) -> list[str]:
        """argv printing `ref` on stdout as the filesystem's own stream,
        incremental against `parent` (a snapshot of the same volume that the
        receiving host also holds). Only with capabilities.can_send."""
        raise errors.Unsupported(backend=self.name, verb="send")

    def receive_argv(self, ref: SnapshotRef) -> list[str]:
        """argv that, fed send_argv()'s stream of `ref` from another host, makes
        the same snapshot at the same ref on this host (the received copy).
        MUST refuse nothing here; the caller has asked exists() first.
        Only with capabilities.can_send."""
        raise errors.Unsupported(backend=self.name, verb="receive")

    def copy_out_argv(self, ref: SnapshotRef) -> list[str]:
        """argv printing the snapshot's files as a tar stream (copy fallback)."""
        raise errors.Unsupported(backend=self.name, verb="copy")

    def copy_in_argv(self, ref: SnapshotRef) -> list[str]:
        """argv unpacking copy_out_argv()'s stream into a partial place that
        finish_copy_in() makes the snapshot `ref` (so exists() never sees half)."""
        raise errors.Unsupported(backend=self.name, verb="copy")

    def finish_copy_in(self, ref: SnapshotRef) -> SnapshotRef:
        raise errors.Unsupported(backend=self.name, verb="copy")

    def discard_partial(self, ref: SnapshotRef) -> None:
        """Remove what a failed receive or copy of `ref` left on this host.
        MUST NOT remove a complete snapshot (exists(ref) True)."""

    def tool_report(self) -> str | None:
        """What the backend's tool says it is (version, CLI dialect), for
        `slurm-snap doctor`: sites run mixed versions, and the evidence in
        docs/backends.md is for named ones. None when there is nothing to
        ask. MAY run the tool; its errors propagate (doctor reports them).
        """
        return None

    def coalesce_key(self, volume: str) -> str | None:
        """Key under which snapshots of several volumes can be one snapshot.

        None for volume-scoped backends. Whole-filesystem backends return e.g.
        the filesystem name: every volume with the same key is covered by one
        snapshot, so the protocol can cut it once per set (see docs/backends.md).
        """
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} via {self.transport.where}>"
