"""zfs: dataset snapshots (`pool/fs@name`). UNTESTED against real ZFS: see docs/backends.md.

    volume   tank/scratch/job42
    snapshot tank/scratch/job42@s1, visible at <mountpoint>/.zfs/snapshot/s1
    clone    zfs clone tank/scratch/job42@s1 tank/restore/job42 (writable dataset)

Snapshot names are per dataset, so two volumes never collide on a name.
"""
from __future__ import annotations

import datetime as dt
import re

from slurm_snap import errors
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef, check_name

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


class ZfsBackend(Backend):
    name = "zfs"
    TOOLS = ("zfs",)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="volume", needs_root=True, can_clone=True)

    def _snapshots(self, dataset: str) -> dict[str, dt.datetime | None]:
        return parse_snapshot_list(self.run(
            "zfs", "list", "-H", "-p", "-t", "snapshot", "-o", "name,creation", "-d", "1", dataset).text, dataset)

    def _mountpoint(self, dataset: str) -> str | None:
        res = self.run("zfs", "get", "-H", "-p", "-o", "value", "mountpoint", dataset, ok=(0, 1))
        mp = res.text.strip()
        return mp if res.status == 0 and mp.startswith("/") else None

    def _ref(self, dataset: str, full: str, created: dt.datetime | None, mp: str | None) -> SnapshotRef:
        snap = full.partition("@")[2]
        path = f"{mp}/.zfs/snapshot/{snap}" if mp else None
        return self.ref(dataset, snap, full, path, created)

    def create(self, volume: str, name: str) -> SnapshotRef:
        dataset, name = check_dataset(volume), check_name(name)
        full = f"{dataset}@{name}"
        snaps = self._snapshots(dataset)  # also fails clearly if the dataset is missing
        if full not in snaps:
            self.run("zfs", "snapshot", full)
            snaps = self._snapshots(dataset)
            if full not in snaps:
                raise errors.BackendError(backend=self.name,
                                          why=f"zfs snapshot {full} exited 0 but zfs list does not show it")
        return self._ref(dataset, full, snaps.get(full), self._mountpoint(dataset))

    def list(self, volume: str) -> list[SnapshotRef]:
        dataset = check_dataset(volume)
        mp = self._mountpoint(dataset)
        return [self._ref(dataset, full, created, mp)
                for full, created in sorted(self._snapshots(dataset).items())]

    def exists(self, ref: SnapshotRef) -> bool:
        dataset = check_dataset(ref.volume)
        res = self.run("zfs", "list", "-H", "-p", "-t", "snapshot", "-o", "name,creation", "-d", "1",
                       dataset, ok=(0, 1))
        return res.status == 0 and ref.ref in parse_snapshot_list(res.text, dataset)

    def delete(self, ref: SnapshotRef) -> bool:
        if "@" not in ref.ref:  # never let a crafted ref destroy a dataset
            raise errors.BadValueError(what="zfs snapshot", value=ref.ref, why="not a snapshot name (no '@')")
        if not self.exists(ref):
            return False
        self.run("zfs", "destroy", ref.ref)
        return True

    def clone(self, ref: SnapshotRef, target: str) -> str:
        target = check_dataset(target, "clone target dataset")
        if self.run("zfs", "get", "-H", "-p", "-o", "value", "mountpoint", target, ok=(0, 1)).status == 0:
            raise errors.AlreadyExists(what="clone target dataset", value=target)
        if not self.exists(ref):
            raise errors.NotFound(what="snapshot", value=ref.ref)
        self.run("zfs", "clone", ref.ref, target)
        return self._mountpoint(target) or target
