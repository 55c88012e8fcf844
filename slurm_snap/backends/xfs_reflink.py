"""xfs-reflink: snapshots as reflink copies, on XFS (reflink=1) or any fs with FICLONE.

    volume   /srv/scratch/job42
    snapshot /srv/scratch/.snapshots/s1          (snapdir option, default <parent>/.snapshots)
    claim    /srv/scratch/.snapshots/.s1.slurm-snap  ({"volume", "created_at"}, written first)
    partial  /srv/scratch/.snapshots/.s1.partial (the copy in progress; renamed when complete)

Honest limits, reflected in capabilities: the copy walks the tree (cost grows
with the number of files) and is not atomic -- files written during the copy
may be caught half-way, which is why the protocol cuts only after the ranks'
barrier. Read-only is enforced with the immutable attribute (seal="immutable",
default; root can still `chattr -i`) or only advisory with seal="mode"
(chmod a-w, which root ignores: capabilities.read_only is then False).
"""
from __future__ import annotations

import datetime as dt
import json
import posixpath

from slurm_snap import errors
from slurm_snap.clock import utcnow
from slurm_snap.backends.base import (Backend, Capabilities, SnapshotRef, check_abs_path,
                                      check_name)

CLAIM_SUFFIX = ".slurm-snap"
PARTIAL_SUFFIX = ".partial"
# chattr only works on regular files and directories (on a device node it
# would open the device); symlinks cannot carry the flag at all.
_SEALABLE = ["(", "-type", "f", "-o", "-type", "d", ")"]


class ReflinkBackend(Backend):
    name = "xfs-reflink"
    FS_TYPES = ("xfs",)
    TOOLS = ("cp",)
    UTILS = ("test", "stat", "mkdir", "find", "mv", "rm", "chmod", "chattr", "tee", "cat", "tar")
    OPTIONS = {"snapdir": (str, None), "seal": (str, "immutable")}

    def __init__(self, options, transport):
        super().__init__(options, transport)
        if self.options["seal"] not in ("immutable", "mode"):
            raise errors.ConfigError(path=f"backend {self.name}", key="seal",
                                     why=f"must be 'immutable' or 'mode', not {self.options['seal']!r}")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=False, read_only=self.options["seal"] == "immutable",
                            instant=False, per_file_cost=True, scope="volume",
                            needs_root=True, can_clone=True, can_copy=True)

    def snapdir(self, volume: str) -> str:
        if self.options["snapdir"]:
            snapdir = check_abs_path("snapdir", self.options["snapdir"])
            if (snapdir + "/").startswith(volume + "/"):
                raise errors.ConfigError(path=f"backend {self.name}", key="snapdir",
                                         why=f"{snapdir!r} is inside volume {volume!r}; the copy would recurse")
            return snapdir
        return posixpath.join(posixpath.dirname(volume), ".snapshots")

    def _claim_path(self, path: str) -> str:
        head, tail = posixpath.split(path)
        return posixpath.join(head, f".{tail}{CLAIM_SUFFIX}")

    def _read_claim(self, path: str) -> dict | None:
        res = self.run("cat", "--", self._claim_path(path), ok=(0, 1))
        if res.status != 0:
            return None
        try:
            return json.loads(res.stdout)
        except ValueError:
            return None

    def _ref(self, volume: str, name: str, path: str, claim: dict) -> SnapshotRef:
        try:
            created = dt.datetime.fromisoformat(claim.get("created_at", ""))
        except ValueError:
            created = None
        return self.ref(volume, name, path, path, created)

    def _volume(self, volume: str) -> str:
        # `cp -a` of a link would copy the link, and `test -d` follows it.
        return self.volume_dir("volume directory", volume)[0]

    def _seal(self, path: str, top: bool) -> None:
        if self.options["seal"] == "mode":
            self.run("chmod", "-R", "a-w", "--", path)
            return
        depth = [] if top else ["-mindepth", "1"]
        self.run("find", path, *depth, *_SEALABLE, "-exec", self.tools["chattr"], "+i", "--", "{}", "+")

    def _unseal(self, path: str) -> None:
        if self.options["seal"] == "mode":
            self.run("chmod", "-R", "u+w", "--", path)
        else:
            self.run("find", path, *_SEALABLE, "-exec", self.tools["chattr"], "-i", "--", "{}", "+")

    def _remove(self, path: str) -> None:
        self._unseal(path)
        self.run("rm", "-rf", "--", path)

    def create(self, volume: str, name: str) -> SnapshotRef:
        check_name(name)
        volume = self._volume(volume)
        snapdir = self.snapdir(volume)
        target = posixpath.join(snapdir, name)
        if self.path_exists(target):
            claim = self._read_claim(target)
            if claim is not None and claim.get("volume") == volume:
                return self._ref(volume, name, target, claim)
            other = claim.get("volume") if claim else "an entry not made by slurm-snap"
            raise errors.SnapshotCollision(backend=self.name, name=target, other=other, volume=volume)
        self.mkdir_p(snapdir)
        partial = posixpath.join(snapdir, f".{name}{PARTIAL_SUFFIX}")
        if self.path_exists(partial):
            self._remove(partial)  # left by a crashed or timed-out attempt
        claim = {"volume": volume, "created_at": utcnow().isoformat()}
        self.run("tee", "--", self._claim_path(target), input=json.dumps(claim).encode())
        self.run("cp", "-a", "--reflink=always", "--", volume, partial)
        # Seal everything below the top first: an immutable directory cannot
        # be renamed, and the rename is what makes the snapshot visible.
        self._seal(partial, top=self.options["seal"] == "mode")
        self.run("mv", "-T", "--", partial, target)
        if self.options["seal"] == "immutable":
            self.run("chattr", "+i", "--", target)
        return self._ref(volume, name, target, claim)

    # A copy to another node: a tar stream of the snapshot unpacked into the
    # partial place on the same path there, then claimed, sealed and renamed
    # exactly as create() does, so exists() never sees half a copy.
    def _partial(self, ref: SnapshotRef) -> str:
        head, tail = posixpath.split(check_abs_path("snapshot", ref.ref))
        return posixpath.join(head, f".{check_name(tail)}{PARTIAL_SUFFIX}")

    def copy_out_argv(self, ref: SnapshotRef) -> list[str]:
        return [self.tools["tar"], "-C", check_abs_path("snapshot", ref.ref), "--numeric-owner", "-cpf", "-", "."]

    def copy_in_argv(self, ref: SnapshotRef) -> list[str]:
        partial = self._partial(ref)
        if self.path_exists(partial):
            self._remove(partial)
        self.mkdir_p(partial)
        return [self.tools["tar"], "-C", partial, "--numeric-owner", "-xpf", "-"]

    def finish_copy_in(self, ref: SnapshotRef) -> SnapshotRef:
        target, partial = check_abs_path("snapshot", ref.ref), self._partial(ref)
        claim = {"volume": ref.volume, "created_at": (ref.created_at or utcnow()).isoformat()}
        self.run("tee", "--", self._claim_path(target), input=json.dumps(claim).encode())
        self._seal(partial, top=self.options["seal"] == "mode")
        self.run("mv", "-T", "--", partial, target)
        if self.options["seal"] == "immutable":
            self.run("chattr", "+i", "--", target)
        return self._ref(ref.volume, posixpath.basename(target), target, claim)

    def discard_partial(self, ref: SnapshotRef) -> None:
        partial = self._partial(ref)
        if self.path_exists(partial):
            self._remove(partial)

    def list(self, volume: str) -> list[SnapshotRef]:
        volume = self._volume(volume)
        snapdir = self.snapdir(volume)
        refs = []
        for entry in self.listdir(snapdir):
            if entry.startswith("."):
                continue  # claims and partial copies
            path = posixpath.join(snapdir, entry)
            claim = self._read_claim(path)
            if claim is not None and claim.get("volume") == volume:
                refs.append(self._ref(volume, entry, path, claim))
        return refs

    def exists(self, ref: SnapshotRef) -> bool:
        path = check_abs_path("snapshot", ref.ref)
        return self.path_exists(path) and self._read_claim(path) is not None

    def delete(self, ref: SnapshotRef) -> bool:
        path = check_abs_path("snapshot", ref.ref)
        if not self.exists(ref):
            return False
        self._remove(path)
        self.run("rm", "-f", "--", self._claim_path(path))
        return True

    def delete_clone(self, path: str) -> bool:
        path = check_abs_path("clone", path)
        if not self.path_exists(path):
            return False
        if self.run("test", "-L", path, ok=(0, 1)).status == 0:
            raise errors.BadValueError(what="clone", value=path, why="is a symlink; refusing to follow it")
        self._remove(path)
        return True

    def clone(self, ref: SnapshotRef, target: str) -> str:
        target = self.check_clone_target(ref, target)
        self.run("cp", "-a", "--reflink=always", "--", ref.ref, target)
        # cp -a keeps mode bits but not the immutable flag; make the owner able to write.
        if self.options["seal"] == "mode":
            self.run("chmod", "-R", "u+w", "--", target)
        else:
            self._unseal(target)  # no-op on most filesystems; cheap insurance
        return target
