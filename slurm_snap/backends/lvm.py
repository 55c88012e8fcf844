"""lvm: LVM2 thin snapshots. UNTESTED against real LVM: see docs/backends.md.

    volume   vg0/scratch                     (a thin logical volume)
    snapshot vg0/s1 (lvcreate -s -p r -n s1 vg0/scratch; thin: no size, read-only)
    clone    lvcreate -s -n TARGET vg0/s1 + lvchange -ay -K: /dev/vg0/TARGET (writable)

Snapshots are block devices, not mounted: `path` is None. Names share the
volume group's namespace, so the same name for two volumes of one VG is a
collision (told apart by the snapshot's origin).
"""
from __future__ import annotations

import datetime as dt
import re

from slurm_snap import errors
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef, check_name

_NAME = r"[A-Za-z0-9+_.][A-Za-z0-9+_.-]*"  # lvm(8) VALID NAMES; no leading '-'
_VOLUME_RE = re.compile(rf"^({_NAME})/({_NAME})$")
SEP = "|"


def check_volume(value: str, what: str = "lvm volume") -> tuple[str, str]:
    m = _VOLUME_RE.fullmatch(value) if isinstance(value, str) else None
    if not m:
        raise errors.BadValueError(what=what, value=value, why="expected VG/LV")
    return m.group(1), m.group(2)


def parse_lvs(text: str) -> dict[str, dict]:
    """`lvs --noheadings --separator '|' -o lv_name,origin,lv_time,lv_attr` -> {lv: fields}."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split(SEP)
        if len(parts) != 4:
            continue
        name, origin, when, attr = parts
        try:
            created = dt.datetime.strptime(when, "%Y-%m-%d %H:%M:%S %z").astimezone(dt.timezone.utc)
        except ValueError:
            created = None
        out[name] = {"origin": origin, "created": created, "attr": attr}
    return out


class LvmThinBackend(Backend):
    name = "lvm"
    TOOLS = ("lvcreate", "lvs", "lvremove", "lvchange")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="volume", needs_root=True, can_clone=True)

    def _lvs(self, vg: str) -> dict[str, dict]:
        return parse_lvs(self.run("lvs", "--noheadings", "--separator", SEP,
                                  "-o", "lv_name,origin,lv_time,lv_attr", vg).text)

    def _ref(self, volume: str, vg: str, name: str, info: dict) -> SnapshotRef:
        return self.ref(volume, name, f"{vg}/{name}", None, info["created"])

    def create(self, volume: str, name: str) -> SnapshotRef:
        vg, lv = check_volume(volume)
        check_name(name)
        lvs = self._lvs(vg)
        if lv not in lvs:
            raise errors.NotFound(what="lvm volume", value=volume)
        if name in lvs:
            if lvs[name]["origin"] == lv:
                return self._ref(volume, vg, name, lvs[name])
            other = f"{vg}/{lvs[name]['origin']}" if lvs[name]["origin"] else "a non-snapshot volume"
            raise errors.SnapshotCollision(backend=self.name, name=f"{vg}/{name}", other=other, volume=volume)
        self.run("lvcreate", "-s", "-p", "r", "-n", name, f"{vg}/{lv}")
        return self._ref(volume, vg, name, self._lvs(vg)[name])

    def list(self, volume: str) -> list[SnapshotRef]:
        vg, lv = check_volume(volume)
        return [self._ref(volume, vg, n, i) for n, i in sorted(self._lvs(vg).items()) if i["origin"] == lv]

    def _info(self, ref: SnapshotRef) -> dict | None:
        vg, name = check_volume(ref.ref, "lvm snapshot")
        res = self.run("lvs", "--noheadings", "--separator", SEP, "-o", "lv_name,origin,lv_time,lv_attr",
                       vg, ok=(0, 5))
        info = parse_lvs(res.text).get(name) if res.status == 0 else None
        return info if info and info["origin"] else None

    def exists(self, ref: SnapshotRef) -> bool:
        return self._info(ref) is not None

    def delete(self, ref: SnapshotRef) -> bool:
        info = self._info(ref)
        if info is None:
            return False
        if info["attr"][1:2] != "r":  # only our read-only snapshots, never a live volume
            raise errors.BadValueError(what="lvm snapshot", value=ref.ref, why="is not read-only; refusing to delete it")
        self.run("lvremove", "-y", ref.ref)
        return True

    def clone(self, ref: SnapshotRef, target: str) -> str:
        vg, name = check_volume(ref.ref, "lvm snapshot")
        tvg, tlv = check_volume(target if "/" in target else f"{vg}/{target}", "clone target")
        if tvg != vg:
            raise errors.BadValueError(what="clone target", value=target, why=f"must be in volume group {vg}")
        if tlv in self._lvs(vg):
            raise errors.AlreadyExists(what="clone target", value=f"{vg}/{tlv}")
        if not self.exists(ref):
            raise errors.NotFound(what="snapshot", value=ref.ref)
        self.run("lvcreate", "-s", "-n", tlv, ref.ref)
        # Thin snapshots carry the activation-skip flag: -K activates anyway.
        self.run("lvchange", "-ay", "-K", f"{vg}/{tlv}")
        return f"/dev/{vg}/{tlv}"
