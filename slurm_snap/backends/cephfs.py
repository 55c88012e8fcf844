"""cephfs: CephFS directory snapshots through the .snap pseudo-directory.
Tested against Ceph 16.2 (ceph-fuse) and a fake: see docs/backends.md.

    volume   /cephfs/scratch/job42      (any directory; snapshots must be enabled)
    snapshot mkdir /cephfs/scratch/job42/.snap/s1 (read-only, atomic for the subtree)
    delete   rmdir /cephfs/scratch/job42/.snap/s1
    clone    cp -a of the snapshot (writable; costs a full copy, not instant)

Snapshots live inside their volume's .snap, so names never collide between
volumes. Entries named _NAME_INODE in .snap are ancestors' snapshots seen from
below (measured: `_ps_1099511627776`) and are not listed; that is why the MDS
refuses a snapshot name starting with '_' (EINVAL), and why we refuse it first,
naming it. created_at is None: Ceph 16 has `ceph.snap.btime` (an xattr), but
reading it needs a tool beyond coreutils on the host that cuts.
"""
from __future__ import annotations

import posixpath
import re

from slurm_snap import errors
from slurm_snap.backends.base import (Backend, Capabilities, SnapshotRef, check_abs_path,
                                      check_name)

_INHERITED_RE = re.compile(r"^_.+_\d+$")


class CephfsBackend(Backend):
    name = "cephfs"
    TOOLS = ("mkdir", "rmdir")
    UTILS = ("test", "find", "cp", "chmod", "stat")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="volume", needs_root=False, can_clone=True)

    def _volume(self, volume: str) -> str:
        # mkdir VOLUME/.snap/NAME through a link would snapshot its target.
        return self.volume_dir("cephfs volume directory", volume)[0]

    def _path(self, volume: str, name: str) -> str:
        return posixpath.join(volume, ".snap", name)

    def create(self, volume: str, name: str) -> SnapshotRef:
        volume, name = self._volume(volume), check_name(name)
        if name.startswith("_"):
            raise errors.BadValueError(what="cephfs snapshot name", value=name,
                                       why="CephFS reserves names starting with '_' for ancestors' snapshots")
        path = self._path(volume, name)
        if self.run("test", "-d", path, ok=(0, 1)).status != 0:
            self.run("mkdir", "--", path)
        return self.ref(volume, name, path, path)

    def list(self, volume: str) -> list[SnapshotRef]:
        volume = self._volume(volume)
        return [self.ref(volume, n, self._path(volume, n), self._path(volume, n))
                for n in self.listdir(posixpath.join(volume, ".snap")) if not _INHERITED_RE.fullmatch(n)]

    def _snap_path(self, ref: SnapshotRef) -> str:
        path = check_abs_path("cephfs snapshot", ref.ref)
        if posixpath.basename(posixpath.dirname(path)) != ".snap":
            raise errors.BadValueError(what="cephfs snapshot", value=path, why="not under a .snap directory")
        return path

    def exists(self, ref: SnapshotRef) -> bool:
        return self.run("test", "-d", self._snap_path(ref), ok=(0, 1)).status == 0

    def delete(self, ref: SnapshotRef) -> bool:
        if not self.exists(ref):
            return False
        self.run("rmdir", "--", self._snap_path(ref))
        return True

    def clone(self, ref: SnapshotRef, target: str) -> str:
        target = self.check_clone_target(ref, target)
        self.run("cp", "-a", "--", self._snap_path(ref), target)
        self.run("chmod", "-R", "u+w", "--", target)  # snapshot files carry their read-only modes
        return target
