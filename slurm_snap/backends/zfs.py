"""zfs: dataset snapshots (`pool/fs@name`). See docs/backends.md for what was run where.

    volume   tank/scratch/job42, or the path a dataset is mounted at
             (/tank/scratch/jobs/42: what volume classes and the Prolog use)
    snapshot tank/scratch/job42@s1, visible at <mountpoint>/.zfs/snapshot/s1
             (where the filesystem has a .zfs directory: OpenZFS does,
             zfs-fuse 0.7 does not, and its snapshots then have no path)
    clone    zfs clone tank/scratch/job42@s1 tank/restore/job42 (writable dataset);
             to a path: a dataset of the snapshot's pool mounted at that path,
             which must lie inside a mounted dataset of that pool

Snapshot names are per dataset, so two volumes never collide on a name.

Two CLI dialects are in use at sites (see Dialect): OpenZFS >= 0.8, tested
against a fake of its documented CLI, and the older one of zfs-fuse 0.7
(Debian 12), tested against the real thing.
"""
from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

from slurm_snap import errors
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef, check_abs_path, check_name
from slurm_snap.backends.transport import Result, Transport

# zfs(8) component rules; a leading '-' would also read as an option.
_DATASET_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]*(/[A-Za-z0-9_.: -]*[A-Za-z0-9_.:-])*$")


_SNAP_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}$")


def check_dataset(value: str, what: str = "zfs dataset") -> str:
    if not isinstance(value, str) or not _DATASET_RE.fullmatch(value) or len(value) > 255:
        raise errors.BadValueError(what=what, value=value,
                                   why="expected pool/fs[/...] of A-Z a-z 0-9 _ . : - (and inner spaces)")
    return value


def parse_snapshot_list(text: str, dataset: str | None = None) -> dict[str, dt.datetime | None]:
    """`zfs list -H -p -o name,creation` -> {"pool/fs@snap": creation}.

    With `dataset`, only that dataset's snapshots with a name we could have
    made: a line naming another dataset is never taken for one of ours (repair
    deletes what list() returns under our names).
    """
    out = {}
    for line in text.splitlines():
        name, _, creation = line.partition("\t")
        if dataset is not None and not (name.startswith(dataset + "@")
                                        and _SNAP_RE.fullmatch(name[len(dataset) + 1:])):
            continue
        if "@" in name:
            out[name] = (dt.datetime.fromtimestamp(int(creation), dt.timezone.utc)
                         if creation.strip().isdigit() else None)
    return out


@dataclass(frozen=True)
class Dialect:
    """Which zfs CLI the backend talks to, as the tool itself reported it.

    `zfs version` exists from OpenZFS 0.8 on (zfs-version(8)). Older CLIs
    (zfs-fuse 0.7, OpenZFS 0.7) answer it with "unrecognized command" and
    exit 2; zfs-fuse 0.7 also has no `zfs list -p` ("invalid option 'p'",
    exit 2), so with those the backend lists snapshots through `zfs get -p`,
    which every one of them has. OpenZFS 0.7 does have `list -p`, but the
    `get` form is right there too, so one legacy path covers both.
    """

    name: str             # "openzfs" or "legacy"
    version: str | None   # "2.1.11-1" from `zfs version`; None when the CLI cannot say
    list_parsable: bool   # `zfs list -p` prints epoch seconds
    # zfs-fuse unmounts through FUSE, which finishes after `zfs destroy` has
    # looked: destroying a mounted dataset fails "dataset is busy" for a
    # moment (measured: the first try fails, a retry ~20 ms later succeeds).
    busy_after_unmount: bool = False

    def describe(self) -> str:
        if self.name == "openzfs":
            return f"OpenZFS {self.version} (zfs version; zfs list -p)"
        return "pre-0.8 zfs CLI without `zfs version` (zfs-fuse 0.7 or OpenZFS <= 0.7; listing via zfs get -p)"


_VERSION_RE = re.compile(r"^zfs-(\d[\w.+~-]*)\s*$")


def parse_dialect(status: int, stdout: str, stderr: str) -> Dialect | None:
    """The dialect from what `zfs version` did; None if the output is not one we know.

    OpenZFS prints `zfs-2.1.11-1` then `zfs-kmod-2.1.11-1` and exits 0;
    zfs-fuse 0.7 prints "unrecognized command 'version'" and its usage, exit 2.
    """
    if status == 0:
        first = (stdout.strip().splitlines() or [""])[0].strip()
        m = _VERSION_RE.fullmatch(first)
        return Dialect("openzfs", m.group(1), True) if m else None
    if status == 2 and "unrecognized command 'version'" in stderr:
        return Dialect("legacy", None, False, busy_after_unmount=True)
    return None


_CLONE_CHARS_RE = re.compile(r"[^A-Za-z0-9_.:-]")


class ZfsBackend(Backend):
    name = "zfs"
    TOOLS = ("zfs",)
    # mkdir/rmdir: a restore drill's namespace next to a volume (restore/drill.py).
    UTILS = ("test", "mkdir", "rmdir")

    def __init__(self, options: Mapping[str, Any], transport: Transport):
        # Probed on first use, not here: building a backend (config checks,
        # doctor) costs no zfs call, and a hanging or failing zfs surfaces as
        # the verb's own Timeout/CommandFailed, as with every other backend.
        self._dialect: Dialect | None = None
        super().__init__(options, transport)

    @property
    def dialect(self) -> Dialect:
        """The CLI dialect, probed once per backend instance (one `zfs version`)."""
        if self._dialect is None:
            res = self.run("zfs", "version", ok=(0, 2))
            stderr = res.stderr.decode(errors="replace")
            found = parse_dialect(res.status, res.text, stderr)
            if found is None:
                said = " / ".join(ln.strip() for ln in (res.text + stderr).splitlines() if ln.strip())[:300]
                raise errors.BackendError(
                    backend=self.name,
                    why=f"`zfs version` exited {res.status} with output we do not know: {said or '(none)'}")
            self._dialect = found
        return self._dialect

    def tool_report(self) -> str:
        return self.dialect.describe()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="volume", needs_root=True, can_clone=True)

    def _listing(self, dataset: str, ok: tuple[int, ...] = (0,)) -> Result:
        """This dataset's snapshots as `name<TAB>epoch` lines, in the dialect's words.

        The legacy `zfs get -d 1` also prints the dataset and its child
        datasets; parse_snapshot_list keeps only `dataset@<our name>` lines.
        """
        if self.dialect.list_parsable:
            return self.run("zfs", "list", "-H", "-p", "-t", "snapshot", "-o", "name,creation", "-d", "1",
                            dataset, ok=ok)
        return self.run("zfs", "get", "-H", "-p", "-o", "name,value", "-d", "1", "creation", dataset, ok=ok)

    def _mounted(self) -> list[tuple[str, str]]:
        """(dataset, mountpoint) of every filesystem mounted at a path; one
        `zfs list`, whose name,mountpoint -H output every CLI we know has."""
        out = self.run("zfs", "list", "-H", "-o", "name,mountpoint", "-t", "filesystem").text
        pairs = (line.split("\t") for line in out.splitlines())
        return [(p[0], p[1].rstrip("/") or "/") for p in pairs if len(p) == 2 and p[1].startswith("/")]

    def _dataset(self, volume: str) -> str:
        """A dataset name as given, or the dataset mounted exactly at a path.

        Volume classes name volumes by path (the Prolog makes
        <prefix>/jobs/<id>); a snapshot covers one dataset, so a path must be
        a dataset's mountpoint, not a directory inside one, as a btrfs volume
        must be a subvolume."""
        if not (isinstance(volume, str) and volume.startswith("/")):
            return check_dataset(volume)
        path = check_abs_path("zfs volume", volume).rstrip("/") or "/"
        for name, mp in self._mounted():
            if mp == path:
                return name
        raise errors.BadValueError(what="zfs volume", value=volume,
                                   why="no zfs dataset is mounted there; make the directory a dataset "
                                       "(`zfs create POOL/...` with that mountpoint)")

    def _containing(self, path: str) -> tuple[str, str] | None:
        """The dataset whose mount holds `path` (longest mountpoint prefix)."""
        best = None
        for name, mp in self._mounted():
            if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (best is None or len(mp) > len(best[1])):
                best = (name, mp)
        return best

    def create_volume(self, path: str) -> str:
        """A dataset mounted at `path`, a child of the dataset mounted at its
        parent directory (<prefix>/jobs must itself be a dataset's mountpoint:
        `zfs create -p` would turn directories into datasets mounted over them)."""
        path = check_abs_path("volume", path).rstrip("/")
        if self.path_exists(path):
            raise errors.AlreadyExists(what="volume", value=path)
        parent, leaf = path.rsplit("/", 1)
        mounted = dict((mp, name) for name, mp in self._mounted())
        if (parent or "/") not in mounted:
            raise errors.BadValueError(what="zfs volume", value=path,
                                       why=f"its parent {parent or '/'} is not a zfs dataset's mountpoint; "
                                           "make it one (`zfs create POOL/.../jobs`)")
        dataset = check_dataset(f"{mounted[parent or '/']}/{leaf}", "zfs volume dataset")
        self.run("zfs", "create", dataset)
        if self._mountpoint(dataset) != path:  # a parent with a different mountpoint scheme
            raise errors.BackendError(backend=self.name,
                                      why=f"zfs create {dataset} did not mount it at {path}")
        return path

    def _snapshots(self, dataset: str) -> dict[str, dt.datetime | None]:
        return parse_snapshot_list(self._listing(dataset).text, dataset)

    def _mountpoint(self, dataset: str) -> str | None:
        res = self.run("zfs", "get", "-H", "-p", "-o", "value", "mountpoint", dataset, ok=(0, 1))
        mp = res.text.strip()
        return mp if res.status == 0 and mp.startswith("/") else None

    def _snapdir(self, dataset: str) -> str | None:
        """<mountpoint>/.zfs/snapshot if this filesystem has one, else None.

        Asked of the filesystem, not inferred from the dialect: OpenZFS has
        the .zfs directory even with snapdir=hidden, zfs-fuse 0.7 has none
        even with snapdir=visible. A path that does not exist must not be
        recorded: the cutter would check acknowledged files against it.
        """
        mp = self._mountpoint(dataset)
        if mp is None:
            return None
        snapdir = f"{mp.rstrip('/')}/.zfs/snapshot"
        return snapdir if self.run("test", "-d", snapdir, ok=(0, 1)).status == 0 else None

    def _ref(self, volume: str, full: str, created: dt.datetime | None, snapdir: str | None) -> SnapshotRef:
        snap = full.partition("@")[2]
        path = f"{snapdir}/{snap}" if snapdir else None
        return self.ref(volume, snap, full, path, created)

    def create(self, volume: str, name: str) -> SnapshotRef:
        dataset, name = self._dataset(volume), check_name(name)
        full = f"{dataset}@{name}"
        snaps = self._snapshots(dataset)  # also fails clearly if the dataset is missing
        if full not in snaps:
            self.run("zfs", "snapshot", full)
            snaps = self._snapshots(dataset)
            if full not in snaps:
                raise errors.BackendError(backend=self.name,
                                          why=f"zfs snapshot {full} exited 0 but zfs list does not show it")
        return self._ref(volume, full, snaps.get(full), self._snapdir(dataset))

    def list(self, volume: str) -> list[SnapshotRef]:
        dataset = self._dataset(volume)
        snaps = self._snapshots(dataset)
        snapdir = self._snapdir(dataset) if snaps else None
        return [self._ref(volume, full, created, snapdir) for full, created in sorted(snaps.items())]

    def exists(self, ref: SnapshotRef) -> bool:
        # Through the volume, not the ref's own dataset part: a ref that
        # names another dataset's snapshot is not this volume's.
        dataset = self._dataset(ref.volume)
        res = self._listing(dataset, ok=(0, 1))
        return res.status == 0 and ref.ref in parse_snapshot_list(res.text, dataset)

    def delete(self, ref: SnapshotRef) -> bool:
        if "@" not in ref.ref:  # never let a crafted ref destroy a dataset
            raise errors.BadValueError(what="zfs snapshot", value=ref.ref, why="not a snapshot name (no '@')")
        if not self.exists(ref):
            return False
        self.run("zfs", "destroy", ref.ref)
        return True

    def clone(self, ref: SnapshotRef, target: str) -> str:
        if isinstance(target, str) and target.startswith("/"):
            return self._clone_to_path(ref, target)
        target = check_dataset(target, "clone target dataset")
        if self.run("zfs", "get", "-H", "-p", "-o", "value", "mountpoint", target, ok=(0, 1)).status == 0:
            raise errors.AlreadyExists(what="clone target dataset", value=target)
        if not self.exists(ref):
            raise errors.NotFound(what="snapshot", value=ref.ref)
        self.run("zfs", "clone", ref.ref, target)
        return self._mountpoint(target) or target

    def _clone_to_path(self, ref: SnapshotRef, target: str) -> str:
        """`zfs clone -o mountpoint=TARGET` into a dataset named after the
        target, beside the dataset whose mount holds it. Only inside the
        snapshot's own pool's mounts: ZFS would mount a clone anywhere, but a
        mount on another filesystem (an NFS or parallel-filesystem restore
        root) is seen by the one host that ran zfs, and with zfs-fuse only in
        its daemon's mount namespace. OtherFilesystem lets a drill retry
        next to the volume."""
        target = self.check_clone_target(ref, target).rstrip("/")
        pool = check_dataset(ref.ref.partition("@")[0], "zfs snapshot").split("/")[0]
        holder = self._containing(target.rsplit("/", 1)[0] or "/")
        if holder is None or holder[0].split("/")[0] != pool:
            raise errors.OtherFilesystem(backend=self.name, value=target,
                                         why=f"is not inside a mounted dataset of pool {pool!r}")
        flat = _CLONE_CHARS_RE.sub("_", target[len(holder[1]):].strip("/"))[-180:].lstrip("-.")
        dataset = check_dataset(f"{holder[0]}/slurm-snap-clone-{flat}", "clone dataset")
        self.run("zfs", "clone", "-o", f"mountpoint={target}", ref.ref, dataset)
        return target

    # Retry pauses for "dataset is busy" where the dialect needs them: ~3 s in
    # all, so a dataset that is really in use still fails soon and clearly.
    BUSY_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)

    def _destroy_dataset(self, name: str) -> None:
        delays = self.BUSY_RETRY_DELAYS if self.dialect.busy_after_unmount else ()
        for delay in delays:
            res = self.run("zfs", "destroy", name, ok=(0, 1))
            if res.status == 0:
                return
            if "dataset is busy" not in res.stderr.decode(errors="replace"):
                break  # a real refusal: the last run below reports it
            time.sleep(delay)
        self.run("zfs", "destroy", name)

    def _remove_mountpoint_dir(self, path: str) -> None:
        """ZFS makes the directory of a `-o mountpoint=` clone and leaves it
        after destroy: removed (only if empty: rmdir), so the clone is gone as
        a path too. zfs-fuse finishes the unmount a moment later (EBUSY)."""
        for delay in self.BUSY_RETRY_DELAYS:
            if self.run("rmdir", "--", path, ok=(0, 1)).status == 0 or not self.path_exists(path):
                return
            time.sleep(delay)
        self.run("rmdir", "--", path)

    def delete_clone(self, path: str) -> bool:
        """Destroy the clone dataset mounted at `path` (or named `path`, as
        clone() returns for one without a mountpoint).

        Needed on ZFS, not just tidy: a snapshot with a dependent clone
        cannot be destroyed ("snapshot has dependent clones"), and removing
        the clone's files would leave the dataset and its pin in place.
        Only a dataset whose `origin` is a snapshot is destroyed, and without
        -r, so a clone that grew its own snapshots fails instead of taking them.
        """
        by_path = isinstance(path, str) and path.startswith("/")
        key = check_abs_path("zfs clone", path) if by_path else check_dataset(path, "zfs clone")
        # name, mountpoint and origin exist in every zfs CLI we know; -H is tab-separated.
        out = self.run("zfs", "list", "-H", "-o", "name,mountpoint,origin", "-t", "filesystem").text
        for line in out.splitlines():
            fields = line.split("\t")
            if len(fields) != 3 or key != (fields[1] if by_path else fields[0]):
                continue
            name, _, origin = fields
            if "@" not in origin:
                raise errors.BadValueError(what="zfs clone", value=path,
                                           why=f"dataset {name} is not a clone (origin {origin}); refusing to destroy it")
            self._destroy_dataset(name)
            if by_path:
                self._remove_mountpoint_dir(key)
            return True
        if by_path and self.path_exists(key):
            raise errors.BadValueError(what="zfs clone", value=path, why="no zfs dataset is mounted there")
        return False
