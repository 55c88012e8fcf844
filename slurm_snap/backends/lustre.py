"""lustre: whole-filesystem snapshots with `lctl snapshot_*` (ZFS-backed Lustre only).
UNTESTED against real Lustre: see docs/backends.md.

    volume   /lustre/fs1/projects/job42   (any path on filesystem `fsname`)
    snapshot fs1@s1 (lctl snapshot_create -F fs1 -n s1), scope: the whole filesystem
    clone    unsupported: mount the snapshot (lctl snapshot_mount, then mount the
             snapshot fsname on a client) and copy what you need

Because one snapshot covers every volume on the filesystem, create() with a
name that already exists returns it whichever volume asked: that is how sets
share one cut. coalesce_key(volume) is the fsname; the protocol cuts once per
key per set, and the inventory must count the sharers before delete().
"""
from __future__ import annotations

import datetime as dt
import re

from slurm_snap import errors
from slurm_snap.backends.base import (Backend, Capabilities, SnapshotRef, check_abs_path,
                                      check_name)

_FSNAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,8}$")  # Lustre fsnames are at most 8 characters


def parse_snapshot_list(text: str) -> dict[str, dict[str, str]]:
    """`lctl snapshot_list` key: value blocks -> {snapshot_name: fields}."""
    out: dict[str, dict[str, str]] = {}
    cur: dict[str, str] = {}
    for line in text.splitlines() + [""]:
        key, sep, value = line.partition(":")
        if sep and key.strip() == "filesystem_name" and cur:
            out[cur.get("snapshot_name", "")] = cur
            cur = {}
        if sep:
            cur[key.strip()] = value.strip()
        elif not line.strip() and cur:
            out[cur.get("snapshot_name", "")] = cur
            cur = {}
    out.pop("", None)
    return out


def parse_ctime(value: str | None) -> dt.datetime | None:
    try:
        # ctime(3) is local time; lctl runs on the MGS, which we assume keeps UTC.
        return dt.datetime.strptime(" ".join((value or "").split()), "%a %b %d %H:%M:%S %Y").replace(
            tzinfo=dt.timezone.utc)
    except ValueError:
        return None


class LustreBackend(Backend):
    name = "lustre"
    TOOLS = ("lctl",)
    OPTIONS = {"fsname": (str, None), "mountpoint": (str, None)}

    def __init__(self, options, transport):
        super().__init__(options, transport)
        fsname = self.options["fsname"]
        if not fsname or not _FSNAME_RE.fullmatch(fsname):
            raise errors.ConfigError(path=f"backend {self.name}", key="fsname",
                                     why=f"required: the Lustre filesystem name (1-8 of A-Z a-z 0-9 _ -), got {fsname!r}")
        if self.options["mountpoint"]:
            check_abs_path("mountpoint", self.options["mountpoint"])

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="filesystem", needs_root=True, can_clone=False)

    def coalesce_key(self, volume: str) -> str:
        self._volume(volume)
        return f"lustre:{self.options['fsname']}"

    def _volume(self, volume: str) -> str:
        volume = check_abs_path("lustre volume", volume)
        mp = self.options["mountpoint"]
        if mp and not (volume + "/").startswith(mp.rstrip("/") + "/"):
            raise errors.BadValueError(what="lustre volume", value=volume,
                                       why=f"not under {mp} (filesystem {self.options['fsname']})")
        return volume

    def _snapshots(self) -> dict[str, dict[str, str]]:
        return parse_snapshot_list(self.run("lctl", "snapshot_list", "-F", self.options["fsname"]).text)

    def _ref(self, volume: str, name: str, info: dict[str, str]) -> SnapshotRef:
        return self.ref(volume, name, f"{self.options['fsname']}@{name}", None,
                        parse_ctime(info.get("create_time")))

    def create(self, volume: str, name: str) -> SnapshotRef:
        volume, name = self._volume(volume), check_name(name)
        snaps = self._snapshots()
        if name not in snaps:
            self.run("lctl", "snapshot_create", "-F", self.options["fsname"], "-n", name)
            snaps = self._snapshots()
        return self._ref(volume, name, snaps[name])

    def list(self, volume: str) -> list[SnapshotRef]:
        volume = self._volume(volume)
        return [self._ref(volume, n, i) for n, i in sorted(self._snapshots().items())]

    def _name(self, ref: SnapshotRef) -> str:
        fsname, _, name = ref.ref.partition("@")
        if fsname != self.options["fsname"]:
            raise errors.BadValueError(what="lustre snapshot", value=ref.ref,
                                       why=f"belongs to filesystem {fsname!r}, not {self.options['fsname']!r}")
        return check_name(name)

    def exists(self, ref: SnapshotRef) -> bool:
        return self._name(ref) in self._snapshots()

    def delete(self, ref: SnapshotRef) -> bool:
        name = self._name(ref)
        if name not in self._snapshots():
            return False
        self.run("lctl", "snapshot_destroy", "-F", self.options["fsname"], "-n", name)
        return True

    def mount(self, ref: SnapshotRef) -> str:
        """Mount the snapshot on the servers; returns the snapshot fsname for clients to mount."""
        name = self._name(ref)
        self.run("lctl", "snapshot_mount", "-F", self.options["fsname"], "-n", name)
        return self._snapshots()[name].get("snapshot_fsname", "")
