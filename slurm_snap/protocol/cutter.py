"""Cut every volume of a set in parallel and check each snapshot against the
ranks' manifests.

One task per Volume row: node-local volumes go through the transport for
their node (backend_for_volume), shared volumes are rows without a node and
so are cut once. Snapshot names are a function of (job, set, volume) for the
coordinator's sets, and of (job, restart count, node, path) for a
preemption's parts (part_name), which a node computes alone when the
inventory is away; either way a rerun finds the same snapshot (backends'
create() is idempotent) and repair can find snapshots that were cut but
never recorded.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import datetime as dt
import hashlib
import os
import posixpath
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from ..clock import utcnow
from .. import states as S
from ..backends.base import Backend, SnapshotRef
from ..backends.transport import LocalTransport
from ..errors import SnapError
from ..inventory.records import SnapshotRecord
from ..jobrecords import VolumeRecord

# Threads cutting at once. They start (and open their SSH connections) while
# the ranks checkpoint. Measured on 2 CPUs with 1,000 volumes: 256 threads
# beat 1,024 (fewer GIL hand-offs) although they need four rounds.
MAX_WORKERS = 256


def snapshot_name(job_id: int, set_id: int, volume_id: int) -> str:
    return f"{name_prefix(job_id, set_id)}{volume_id}"


def name_prefix(job_id: int, set_id: int) -> str:
    return f"slurm-snap-{int(job_id)}-{int(set_id)}-"


def part_name(job_id: int, restart_count: int, node: str, path: str) -> str:
    """A preemption set's part, named without the inventory: the node cutting
    it knows the job, the run it preempts (job.json's restart count, whose
    epoch is preempt-<restart>) and the volume (node and path), not the set's
    or the volume's row ids. Digits, letters and '-' only, like the set form,
    so every backend accepts it; repair computes the same name from the set's
    epoch and the volume rows (repair_names)."""
    key = hashlib.sha256(f"{node}\0{path}".encode()).hexdigest()[:12]
    return f"slurm-snap-{int(job_id)}-r{int(restart_count)}-{key}"


NameFor = Callable[[VolumeRecord], str]


def set_names(job_id: int, set_id: int) -> NameFor:
    """The coordinator's names: (job, set, volume id)."""
    return lambda v: snapshot_name(job_id, set_id, v.id)


def preempt_names(job_id: int, restart_count: int) -> NameFor:
    """A preemption's names: (job, preempted run, node, path)."""
    return lambda v: part_name(job_id, restart_count, v.node, v.path)


@dataclass(frozen=True)
class Entry:
    path: str
    size: int


@dataclass
class CutResult:
    volume: VolumeRecord
    name: str
    ok: bool = False
    ref: SnapshotRef | None = None
    cut_started_at: dt.datetime | None = None
    cut_at: dt.datetime | None = None
    manifest_ok: bool | None = None
    manifest_why: str = ""
    error: str = ""
    shared_key: str = ""

    def record(self) -> SnapshotRecord:
        """The inventory's part for this result: CUT, or MISSING with the error."""
        v = self.volume
        return SnapshotRecord(volume_id=v.id, backend=v.backend, name=self.name,
                              ref=self.ref.ref if self.ref else "", path=(self.ref.path or "") if self.ref else "",
                              node=v.node, cut_started_at=self.cut_started_at, cut_at=self.cut_at,
                              state=S.PART_CUT if self.ok else S.PART_MISSING,
                              error=(self.manifest_why if self.ok else self.error)[:2000], site=v.site,
                              region=v.region, shared_key=self.shared_key,
                              manifest_ok=self.manifest_ok if self.ok else None)


def _under(path: str, root: str) -> str | None:
    """Path of `path` relative to `root`, or None if it is not below it."""
    root = root.rstrip("/") or "/"
    if path == root:
        return ""
    if path.startswith(root + "/"):
        return path[len(root) + 1:]
    return None


def assign_manifests(volumes: Sequence[VolumeRecord], manifests: Iterable[tuple[str, Iterable]]
                     ) -> tuple[dict[int, list[Entry]], list[str]]:
    """Map each acknowledged file to the volume that holds it.

    `manifests` yields (node, manifest entries). A file on a
    node-local volume belongs to that node's row; a shared volume holds files
    of every node. Files under no declared volume are returned separately: a
    checkpoint outside the set cannot be restored from it.
    """
    local: dict[str, list[VolumeRecord]] = {}
    shared: list[VolumeRecord] = []
    for v in volumes:
        (shared if v.scope == "shared" else local.setdefault(v.node, [])).append(v)
    real = {v.id: os.path.realpath(v.path) for v in shared}
    out: dict[int, list[Entry]] = {v.id: [] for v in volumes}
    outside: list[str] = []
    for node, entries in manifests:
        for e in entries:
            path, size = e.path, e.size
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


def verify(backend: Backend, volume: VolumeRecord, ref: SnapshotRef,
           entries: Sequence[Entry]) -> tuple[bool | None, str]:
    """Every acknowledged file exists in the snapshot with its acknowledged size."""
    if not entries:
        return True, ""
    if ref.path:
        return _check_files(backend, volume, ref.path, entries)
    if not (backend.capabilities.can_clone and volume.path.startswith("/")):
        return None, f"{backend.name} snapshots have no visible path to check"
    return _verify_through_clone(backend, volume, ref, entries)


# A snapshot with no browsable path (zfs-fuse: no .zfs directory) is checked
# through a clone of it: the same content, writable but never written. Next
# to the volume (hidden), because a clone must stay on the volume's
# filesystem. Measured on zfs-fuse 0.7: clone + check + destroy ~0.3 s, which
# the ranks wait for only where a snapshot has no path.
VERIFY_CLONE_PREFIX = ".slurm-snap-verify-"


def _verify_through_clone(backend: Backend, volume: VolumeRecord, ref: SnapshotRef,
                          entries: Sequence[Entry]) -> tuple[bool | None, str]:
    target = posixpath.join(posixpath.dirname(volume.path.rstrip("/")), VERIFY_CLONE_PREFIX + ref.name)
    try:
        clone = backend.clone(ref, target)
    except SnapError as exc:
        return None, f"{backend.name} snapshots have no visible path, and a clone to check could not be made: {exc}"
    ok, why = None, ""
    try:
        ok, why = _check_files(backend, volume, clone, entries)
    finally:
        try:
            backend.delete_clone(clone)
        except SnapError as exc:  # the check stands; the leftover is said where prune will trip on it
            why = (why + "; " if why else "") + f"the clone checked at {clone} was not removed: {exc}"
    return ok, why


def _check_files(backend: Backend, volume: VolumeRecord, root: str,
                 entries: Sequence[Entry]) -> tuple[bool, str]:
    """Every entry exists under `root` (the snapshot's files) with its size."""
    real = os.path.realpath(volume.path) if volume.scope == "shared" else volume.path
    targets = []
    for e in entries:
        rel = _under(e.path, volume.path)
        if rel is None:
            rel = _under(e.path, real) or ""
        targets.append((e, posixpath.join(root, rel) if rel else root))
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


# Sets whose whole-filesystem snapshot is requested within one window share it.
COALESCE_WINDOW = 5.0


def coalesced_name(key: str, at: dt.datetime, window: float = COALESCE_WINDOW) -> str:
    """The one name every set cutting filesystem `key` in this window uses:
    backends return the existing snapshot for a name, so they share it."""
    safe = "".join(c if c.isalnum() or c in "_.-" else "-" for c in key)
    return f"slurm-snap-shared-{safe}-{int(at.timestamp() // window)}"


def cut_one(v: VolumeRecord, *, job_id: int, set_id: int, backend_for: Callable[[VolumeRecord], Backend],
            entries: Sequence[Entry], clock: Callable[[], dt.datetime], name_for: NameFor | None = None) -> CutResult:
    """Cut and verify one volume; a failure is returned, never raised."""
    r = CutResult(volume=v, name=(name_for or set_names(job_id, set_id))(v))
    if v.refused:
        r.error = f"not cut: the Prolog refused this path ({v.refused})"[:500]
        return r
    try:
        backend = backend_for(v)
        r.cut_started_at = clock()
        key = backend.coalesce_key(v.path)
        if key:
            r.shared_key = key
            r.name = coalesced_name(key, r.cut_started_at)
        r.ref = backend.create(v.path, r.name)
        r.cut_at = clock()
        if key and r.ref.created_at and r.ref.created_at < r.cut_started_at:
            # Another set cut it first: this set's data is as of that earlier
            # instant, and the verdict must judge the barrier against it.
            r.cut_started_at = r.cut_at = r.ref.created_at
        r.ok = True
        r.manifest_ok, r.manifest_why = verify(backend, v, r.ref, entries)
    except SnapError as exc:
        r.error = str(exc)[:500]
    except Exception as exc:  # a backend bug must not stop the other volumes
        r.error = f"internal error: {type(exc).__name__}: {exc}"[:500]
    return r


class CutPool:
    """Worker threads started -- and every backend built (SSH connections
    opened) -- while the ranks are still checkpointing, so the cut itself
    only pays the backends' own latency."""

    def __init__(self, volumes: Sequence[VolumeRecord], backend_for: Callable[[VolumeRecord], Backend],
                 max_workers: int = MAX_WORKERS):
        self._factory = backend_for
        self._backends: dict[int, Backend] = {}
        self.workers = max(1, min(max_workers, len(volumes)))
        self.ex = cf.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="slurm-snap-cut")
        queue = collections.deque(volumes)
        self._warm = [self.ex.submit(self._warm_worker, queue) for _ in range(self.workers)]

    def _warm_worker(self, queue) -> None:
        while True:
            try:
                v = queue.popleft()
            except IndexError:
                return
            try:
                self.backend_for(v)
            except Exception:  # reported by the cut itself, per volume
                pass

    def backend_for(self, v: VolumeRecord) -> Backend:
        b = self._backends.get(v.id)
        if b is None:
            b = self._backends[v.id] = self._factory(v)
        return b

    def cut(self, volumes: Sequence[VolumeRecord], *, job_id: int, set_id: int,
            entries: Mapping[int, Sequence[Entry]] | None = None, clock: Callable[[], dt.datetime] = utcnow,
            budget: float | None = None, on_part: Callable[[CutResult], None] | None = None,
            meanwhile: Callable[[], None] | None = None, name_for: NameFor | None = None) -> list[CutResult]:
        """Cut every volume (each once), in parallel; never raises for one volume's failure."""
        entries = entries or {}
        name_for = name_for or set_names(job_id, set_id)
        queue = collections.deque(volumes)
        done: dict[int, CutResult] = {}

        def worker() -> None:
            # Workers pull from one queue: one submit per thread, not per volume.
            while True:
                try:
                    v = queue.popleft()
                except IndexError:
                    return
                r = cut_one(v, job_id=job_id, set_id=set_id, backend_for=self.backend_for,
                            entries=entries.get(v.id, ()), clock=clock, name_for=name_for)
                done[v.id] = r
                if on_part is not None:
                    on_part(r)

        futures = [self.ex.submit(worker) for _ in range(min(self.workers, len(volumes)))]
        if meanwhile is not None:
            meanwhile()  # the caller's own work (recording the acks) while the volumes are cut
        cf.wait(futures, timeout=budget)
        queue.clear()  # past the budget: start nothing more
        for f in futures:
            if f.done() and f.exception() is not None:
                raise f.exception()
        return [done.get(v.id) or CutResult(volume=v, name=name_for(v), error=f"did not finish within {budget:g} s")
                for v in volumes]

    def close(self) -> None:
        self.ex.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "CutPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cut_all(volumes: Sequence[VolumeRecord], *, job_id: int, set_id: int,
            backend_for: Callable[[VolumeRecord], Backend], entries: Mapping[int, Sequence[Entry]] | None = None,
            clock: Callable[[], dt.datetime] = utcnow, budget: float | None = None,
            on_part: Callable[[CutResult], None] | None = None,
            max_workers: int = MAX_WORKERS, name_for: NameFor | None = None) -> list[CutResult]:
    """Build a pool and cut (the preemption Epilog's few volumes)."""
    if not volumes:
        return []
    with CutPool(volumes, backend_for, max_workers) as pool:
        return pool.cut(volumes, job_id=job_id, set_id=set_id, entries=entries, clock=clock,
                        budget=budget, on_part=on_part, name_for=name_for)
