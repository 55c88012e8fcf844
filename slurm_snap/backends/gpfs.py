"""gpfs: IBM Storage Scale fileset snapshots. UNTESTED against real GPFS: see docs/backends.md.

    volume   scratch_job42            (an independent fileset of device `device`)
    snapshot mmcrsnapshot fs1 s1 -j scratch_job42, visible at <junction>/.snapshots/s1
    clone    unsupported (mmclone works per file): copy from the snapshot path

Fileset snapshot names are per fileset, so two volumes never collide. Output
is read with -Y (colon-separated, HEADER line, percent-encoded values) and
parsed by header name, so added columns in newer releases do not break us.
"""
from __future__ import annotations

import datetime as dt
import re
import urllib.parse

from slurm_snap import errors
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef, check_name

_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$")


def parse_y(text: str, command: str) -> list[dict[str, str]]:
    """mm* -Y output -> one dict per data line, keyed by the HEADER field names."""
    header: list[str] | None = None
    rows = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) < 3 or fields[0] != command:
            continue
        if fields[2] == "HEADER":
            header = fields
            continue
        if header is not None:
            rows.append({h: urllib.parse.unquote(v) for h, v in zip(header, fields) if h})
    return rows


def parse_created(value: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(" ".join((value or "").split()), "%a %b %d %H:%M:%S %Y").replace(
            tzinfo=dt.timezone.utc)
    except ValueError:
        return None


class GpfsBackend(Backend):
    name = "gpfs"
    TOOLS = ("mmcrsnapshot", "mmlssnapshot", "mmdelsnapshot", "mmlsfileset")
    OPTIONS = {"device": (str, None)}

    def __init__(self, options, transport):
        super().__init__(options, transport)
        dev = self.options["device"]
        if not dev or not _ID_RE.fullmatch(dev):
            raise errors.ConfigError(path=f"backend {self.name}", key="device",
                                     why=f"required: the GPFS file system device name, got {dev!r}")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="fileset", needs_root=True, can_clone=False)

    def _fileset(self, volume: str, what: str = "gpfs fileset") -> str:
        if not isinstance(volume, str) or not _ID_RE.fullmatch(volume):
            raise errors.BadValueError(what=what, value=volume, why="expected a fileset name")
        return volume

    def _junction(self, fileset: str) -> str | None:
        rows = parse_y(self.run("mmlsfileset", self.options["device"], fileset, "-Y").text, "mmlsfileset")
        path = rows[0].get("path", "") if rows else ""
        return path if path.startswith("/") else None

    def _snapshots(self, fileset: str) -> dict[str, dict[str, str]]:
        rows = parse_y(self.run("mmlssnapshot", self.options["device"], "-j", fileset, "-Y").text, "mmlssnapshot")
        # .get: garbage or a changed format must not be a KeyError in the middle of a cut.
        return {r["directory"]: r for r in rows if r.get("fileset") == fileset and r.get("directory")}

    def _ref(self, fileset: str, name: str, row: dict[str, str], junction: str | None) -> SnapshotRef:
        path = f"{junction}/.snapshots/{name}" if junction else None
        return self.ref(fileset, name, f"{self.options['device']}:{fileset}:{name}", path,
                        parse_created(row.get("created")))

    def create(self, volume: str, name: str) -> SnapshotRef:
        fileset, name = self._fileset(volume), check_name(name)
        junction = self._junction(fileset)  # fails clearly for an unknown fileset
        snaps = self._snapshots(fileset)
        if name not in snaps:
            self.run("mmcrsnapshot", self.options["device"], name, "-j", fileset)
            snaps = self._snapshots(fileset)
            if name not in snaps:
                raise errors.BackendError(backend=self.name, why=f"mmcrsnapshot {name} -j {fileset} exited 0 "
                                                                 "but mmlssnapshot does not list it")
        return self._ref(fileset, name, snaps[name], junction)

    def list(self, volume: str) -> list[SnapshotRef]:
        fileset = self._fileset(volume)
        junction = self._junction(fileset)
        return [self._ref(fileset, n, r, junction) for n, r in sorted(self._snapshots(fileset).items())]

    def _split(self, ref: SnapshotRef) -> tuple[str, str]:
        dev, fileset, name = (ref.ref.split(":") + ["", ""])[:3]
        if dev != self.options["device"]:
            raise errors.BadValueError(what="gpfs snapshot", value=ref.ref,
                                       why=f"belongs to device {dev!r}, not {self.options['device']!r}")
        return self._fileset(fileset), check_name(name)

    def exists(self, ref: SnapshotRef) -> bool:
        fileset, name = self._split(ref)
        return name in self._snapshots(fileset)

    def delete(self, ref: SnapshotRef) -> bool:
        fileset, name = self._split(ref)
        if name not in self._snapshots(fileset):
            return False
        self.run("mmdelsnapshot", self.options["device"], name, "-j", fileset)
        return True
