"""btrfs: read-only subvolume snapshots.

    volume   /srv/scratch/job42          (must be a subvolume: inode 256)
    snapshot /srv/scratch/.snapshots/s1  (snapdir option, default <parent>/.snapshots)
    clone    btrfs subvolume snapshot (writable) of the snapshot

Which volume a snapshot belongs to is btrfs's own record: the snapshot's
"Parent UUID" equals the volume's UUID. That is how create() tells an
idempotent repeat from a name collision, and how list() filters a shared
snapshot directory.
"""
from __future__ import annotations

import os
import posixpath

from slurm_snap import errors
from slurm_snap.backends.base import (Backend, Capabilities, SnapshotRef, check_abs_path,
                                      check_name)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import datetime as dt

BTRFS_ROOT_INODE = 256  # every subvolume's root directory has this inode number

# linux/btrfs.h: BTRFS_IOC_SUBVOL_CREATE = _IOW(0x94, 14, struct btrfs_ioctl_vol_args),
# the struct being {__s64 fd; char name[4088];}: what `btrfs subvolume create` calls.
_IOC_SUBVOL_CREATE = 0x5000940E
_VOL_ARGS_NAME = 4088


def parse_show(text: str) -> dict[str, str]:
    """`btrfs subvolume show` -> {"UUID": ..., "Parent UUID": ..., "Flags": ...}."""
    info: dict[str, str] = {}
    for line in text.splitlines()[1:]:
        key, sep, value = line.strip().partition(":")
        if sep and line.startswith("\t") and not line.startswith("\t\t"):
            info[key.strip()] = value.strip()
    return info


def parse_time(value: str | None) -> dt.datetime | None:
    import datetime as dt   # here: the Prolog's create_volume reads no time

    try:
        return dt.datetime.strptime(value or "", "%Y-%m-%d %H:%M:%S %z").astimezone(dt.timezone.utc)
    except ValueError:
        return None


class BtrfsBackend(Backend):
    name = "btrfs"
    FS_TYPES = ("btrfs",)
    TOOLS = ("btrfs",)
    UTILS = ("test", "stat", "mkdir", "find")
    OPTIONS = {"snapdir": (str, None)}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="volume", needs_root=True, can_clone=True, can_send=True)

    def snapdir(self, volume: str) -> str:
        if self.options["snapdir"]:
            return check_abs_path("snapdir", self.options["snapdir"])
        return posixpath.join(posixpath.dirname(volume), ".snapshots")

    def _show(self, path: str) -> dict[str, str]:
        return parse_show(self.run("btrfs", "subvolume", "show", "--", path).text)

    @classmethod
    def volume_problem(cls, path: str, inode: int) -> str | None:
        if inode == BTRFS_ROOT_INODE:
            return None
        return (f"not a btrfs subvolume (a plain directory: inode {inode}, a subvolume's root is "
                f"{BTRFS_ROOT_INODE}), and btrfs snapshots whole subvolumes only: make it one with "
                f"`btrfs subvolume create {path}` (then move its data in)")

    def _volume_uuid(self, volume: str) -> str:
        volume, ino = self.volume_dir("btrfs volume", volume)
        problem = self.volume_problem(volume, ino)
        if problem:
            raise errors.BadValueError(what="btrfs volume", value=volume, why=problem)
        return self._show(volume)["UUID"]

    def _ref(self, volume: str, name: str, path: str, info: dict[str, str]) -> SnapshotRef:
        return self.ref(volume, name, path, path, parse_time(info.get("Creation time")))

    def _snapshot_info(self, path: str) -> dict[str, str] | None:
        """show() of a snapshot at `path`, or None if nothing snapshot-like is there."""
        if self.inode(path) != BTRFS_ROOT_INODE:
            return None
        return self._show(path)

    def create(self, volume: str, name: str) -> SnapshotRef:
        check_name(name)
        uuid = self._volume_uuid(volume)
        volume = volume.rstrip("/")
        target = posixpath.join(self.snapdir(volume), name)
        ino = self.inode(target)
        if ino is not None:
            info = self._show(target) if ino == BTRFS_ROOT_INODE else None
            if info is not None and info.get("Parent UUID") == uuid:
                return self._ref(volume, name, target, info)
            other = f"subvolume with UUID {info.get('Parent UUID')}" if info else "a non-snapshot entry"
            raise errors.SnapshotCollision(backend=self.name, name=target, other=other, volume=volume)
        self.mkdir_p(posixpath.dirname(target))
        # Only ever into a fresh path: into an existing directory btrfs would
        # nest the snapshot inside it, like cp.
        self.run("btrfs", "subvolume", "snapshot", "-r", "--", volume, target)
        return self._ref(volume, name, target, self._show(target))

    def list(self, volume: str) -> list[SnapshotRef]:
        uuid = self._volume_uuid(volume)
        volume = volume.rstrip("/")
        snapdir = self.snapdir(volume)
        refs = []
        for entry in self.listdir(snapdir):
            path = posixpath.join(snapdir, entry)
            info = self._snapshot_info(path)
            if info is not None and info.get("Parent UUID") == uuid:
                refs.append(self._ref(volume, entry, path, info))
        return refs

    def exists(self, ref: SnapshotRef) -> bool:
        info = self._snapshot_info(check_abs_path("snapshot", ref.ref))
        if info is None:
            return False
        # Every snapshot is read-only (create's -r); a received copy becomes so
        # only at the stream's end: a receive cut off half-way (full, or
        # incremental, which starts as a writable snapshot of the parent)
        # leaves a writable subvolume, which is not a snapshot.
        return "readonly" in info.get("Flags", "")

    # A snapshot travels as `btrfs send` (incremental with -p), and is
    # received at the very same path on the other node: the per-job volume and
    # its snapdir have the same path on every node, so resume.json, the
    # inventory and a drill name one path whichever node holds the copy.
    def send_argv(self, ref: SnapshotRef, parent: SnapshotRef | None = None) -> list[str]:
        path = check_abs_path("snapshot", ref.ref)
        extra = ["-p", check_abs_path("parent snapshot", parent.ref)] if parent is not None else []
        return [self.tools["btrfs"], "send", "-q", *extra, path]

    def receive_argv(self, ref: SnapshotRef) -> list[str]:
        path = check_abs_path("snapshot", ref.ref)
        self.mkdir_p(posixpath.dirname(path))
        # receive names the subvolume after the sent one: DIR/<basename>.
        return [self.tools["btrfs"], "receive", "-q", posixpath.dirname(path)]

    def discard_partial(self, ref: SnapshotRef) -> None:
        path = check_abs_path("snapshot", ref.ref)
        info = self._snapshot_info(path)
        if info is None or "readonly" in info.get("Flags", ""):
            return
        self.run("btrfs", "subvolume", "delete", "--", path)

    def delete(self, ref: SnapshotRef) -> bool:
        path = check_abs_path("snapshot", ref.ref)
        info = self._snapshot_info(path)
        if info is None:
            return False
        # Refuse anything that is not a snapshot (taken here, or received from
        # another node): a crafted ref must not be able to delete the live volume.
        made = info.get("Parent UUID", "-") != "-" or info.get("Received UUID", "-") != "-"
        if not made or "readonly" not in info.get("Flags", ""):
            raise errors.BadValueError(what="btrfs snapshot", value=path,
                                       why="is not a read-only snapshot; refusing to delete it")
        self.run("btrfs", "subvolume", "delete", "--", path)
        return True

    def delete_clone(self, path: str) -> bool:
        path = check_abs_path("clone", path)
        ino = self.inode(path)
        if ino is None:
            return False
        if ino != BTRFS_ROOT_INODE:
            raise errors.BadValueError(what="btrfs clone", value=path, why="is not a subvolume; refusing to delete it")
        # A clone is one writable subvolume: one ioctl, not a tree walk.
        self.run("btrfs", "subvolume", "delete", "--", path)
        return True

    def create_volume(self, path: str) -> str:
        path = check_abs_path("volume", path)
        if self.path_exists(path):
            raise errors.AlreadyExists(what="volume", value=path)
        # A subvolume, not a directory: only a subvolume can be snapshotted alone.
        if self.transport.local and not self.options["tool_dir"]:
            # The tool's own ioctl, here: the Prolog creates one per volume on
            # every opted-in job's start, and a `btrfs` process costs ~3 ms.
            _subvol_create(path)
        else:
            self.run("btrfs", "subvolume", "create", "--", path)
        return path

    def clone(self, ref: SnapshotRef, target: str) -> str:
        target = self.check_clone_target(ref, target)
        self.run("btrfs", "subvolume", "snapshot", "--", ref.ref, target)
        return target


def _subvol_create(path: str) -> None:
    """`btrfs subvolume create PATH` as its ioctl on PATH's parent directory;
    a failure is the tool's (CommandFailed, with the kernel's reason)."""
    import fcntl

    parent, name = posixpath.split(path)
    raw = os.fsencode(name)
    args = bytearray(8 + _VOL_ARGS_NAME)
    try:
        if not raw or len(raw) >= _VOL_ARGS_NAME:
            raise OSError(36, os.strerror(36))   # ENAMETOOLONG, as the tool says it
        args[8:8 + len(raw)] = raw
        fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, _IOC_SUBVOL_CREATE, args)
        finally:
            os.close(fd)
    except OSError as exc:
        why = "not a btrfs filesystem" if exc.errno == 25 else exc.strerror   # ENOTTY: another filesystem
        raise errors.CommandFailed(argv0="btrfs", status=1, argv=["btrfs", "subvolume", "create", "--", path],
                                   host="localhost", stderr=f"ERROR: cannot create subvolume '{path}': {why}") from None
