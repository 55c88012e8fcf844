"""Cut every volume of a set in parallel and check each snapshot against the
ranks' manifests.

One task per Volume row: node-local volumes go through the transport for
their node (backend_for_volume), shared volumes are rows without a node and
so are cut once. Snapshot names are a function of (job, set, volume), so a
rerun finds the same snapshot (backends' create() is idempotent) and repair
can find snapshots that were cut but never recorded.
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import os
import posixpath
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from ..backends.base import Backend, SnapshotRef
from ..backends.transport import LocalTransport
from ..errors import SnapError

# Enough threads that a 1,000-node set is cut in a few rounds of the backend's
# latency; each node-local SSH transport holds one connection while it works.
MAX_WORKERS = 256


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def snapshot_name(job_id: int, set_id: int, volume_id: int) -> str:
    return f"{name_prefix(job_id, set_id)}{volume_id}"


def name_prefix(job_id: int, set_id: int) -> str:
    return f"slurm-snap-{int(job_id)}-{int(set_id)}-"


@dataclass(frozen=True)
class VolumeInfo:
    """What the cutter needs of an inventory Volume row, detached from the session."""

    id: int
    path: str
    scope: str
    node: str
    volume_class: str
    backend: str
    site: str = ""
    region: str = ""

    @classmethod
    def of(cls, v) -> "VolumeInfo":
        return cls(v.id, v.path, v.scope, v.node or "", v.volume_class, v.backend, v.site or "", v.region or "")


@dataclass(frozen=True)
class Entry:
    path: str
    size: int


@dataclass
class CutResult:
    volume: VolumeInfo
    name: str
    ok: bool = False
    ref: SnapshotRef | None = None
    cut_started_at: dt.datetime | None = None
    cut_at: dt.datetime | None = None
    manifest_ok: bool | None = None
    manifest_why: str = ""
    error: str = ""


def _under(path: str, root: str) -> str | None:
    """Path of `path` relative to `root`, or None if it is not below it."""
    root = root.rstrip("/") or "/"
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1:]
    return None


def assign_manifests(volumes: Sequence[VolumeInfo], manifests: Iterable[tuple[str, Iterable]]
                     ) -> tuple[dict[int, list[Entry]], list[str]]:
    """Map each acknowledged file to the volume that holds it.

    `manifests` yields (node, entries with .path/.size or dicts). A file on a
    node-local volume belongs to that node's row; a shared volume holds files
    of every node. Files under no declared volume are returned separately: a
    checkpoint outside the set cannot be restored from it.
    """
    local: dict[str, list[VolumeInfo]] = {}
    shared: list[VolumeInfo] = []
    for v in volumes:
        (shared if v.scope == "shared" else local.setdefault(v.node, [])).append(v)
    real = {v.id: os.path.realpath(v.path) for v in shared}
    out: dict[int, list[Entry]] = {v.id: [] for v in volumes}
    outside: list[str] = []
    for node, entries in manifests:
        for e in entries:
            path, size = (e["path"], e["size"]) if isinstance(e, dict) else (e.path, e.size)
            home = None
            for v in local.get(node, []) + shared:
                rel = _under(path, v.path)
                if rel is None and v.id in real:
                    rel = _under(path, real[v.id])
                if rel is not None:
                    home = v
                    break
            if home is None:
                outside.append(f"{path}@{node}")
            else:
                out[home.id].append(Entry(path, int(size)))
    return out, outside


def verify(backend: Backend, volume: VolumeInfo, ref: SnapshotRef, entries: Sequence[Entry]) -> tuple[bool | None, str]:
    """Every acknowledged file exists in the snapshot with its acknowledged size."""
    if not entries:
        return True, ""
    if not ref.path:
        return None, f"{backend.name} snapshots have no visible path to check"
    real = os.path.realpath(volume.path) if volume.scope == "shared" else volume.path
    targets = []
    for e in entries:
        rel = _under(e.path, volume.path)
        if rel is None:
            rel = _under(e.path, real) or ""
        targets.append((e, posixpath.join(ref.path, rel) if rel else ref.path))
    sizes = _sizes(backend, [t for _e, t in targets])
    for (e, target), size in zip(targets, sizes):
        if size is None:
            return False, f"{e.path} is missing from the snapshot ({target})"
        if size != e.size:
            return False, f"{e.path} has {size} bytes in the snapshot, {e.size} acknowledged"
    return True, ""


def _sizes(backend: Backend, paths: list[str]) -> list[int | None]:
    transport = backend.transport
    if isinstance(transport, LocalTransport):
        out = []
        for p in paths:
            try:
                out.append(os.stat(p).st_size)
            except OSError:
                out.append(None)
        return out
    # Remote node: one stat call for all files; a failure means some file is
    # missing, so ask again one by one to name it.
    res = transport.run(["/usr/bin/stat", "-c", "%s", "--", *paths], backend.timeout)
    lines = res.stdout.decode(errors="replace").split()
    if res.status == 0 and len(lines) == len(paths):
        return [int(x) for x in lines]
    out = []
    for p in paths:
        r = transport.run(["/usr/bin/stat", "-c", "%s", "--", p], backend.timeout)
        out.append(int(r.stdout.split()[0]) if r.status == 0 and r.stdout.split() else None)
    return out


def cut_all(volumes: Sequence[VolumeInfo], *, job_id: int, set_id: int,
            backend_for: Callable[[VolumeInfo], Backend], entries: Mapping[int, Sequence[Entry]] | None = None,
            clock: Callable[[], dt.datetime] = utcnow, budget: float | None = None,
            on_part: Callable[[CutResult], None] | None = None,
            max_workers: int = MAX_WORKERS) -> list[CutResult]:
    """Cut every volume (each once), in parallel; never raises for one volume's failure."""
    entries = entries or {}

    def one(v: VolumeInfo) -> CutResult:
        r = CutResult(volume=v, name=snapshot_name(job_id, set_id, v.id))
        try:
            backend = backend_for(v)
            r.cut_started_at = clock()
            r.ref = backend.create(v.path, r.name)
            r.cut_at = clock()
            r.ok = True
            r.manifest_ok, r.manifest_why = verify(backend, v, r.ref, entries.get(v.id, ()))
        except SnapError as exc:
            r.error = str(exc)[:500]
        except Exception as exc:  # a backend bug must not stop the other volumes
            r.error = f"internal error: {type(exc).__name__}: {exc}"[:500]
        if r.ok and r.cut_at is None:
            r.cut_at = clock()
        if on_part is not None:
            on_part(r)
        return r

    if not volumes:
        return []
    if len(volumes) == 1:
        return [one(volumes[0])]
    pool = cf.ThreadPoolExecutor(max_workers=min(max_workers, len(volumes)), thread_name_prefix="slurm-snap-cut")
    futures = {pool.submit(one, v): v for v in volumes}
    done, not_done = cf.wait(futures, timeout=budget)
    pool.shutdown(wait=not not_done, cancel_futures=True)
    results = []
    for fut, v in futures.items():
        if fut in done:
            results.append(fut.result())
        else:
            results.append(CutResult(volume=v, name=snapshot_name(job_id, set_id, v.id),
                                     error=f"did not finish within {budget:g} s"))
    return results
