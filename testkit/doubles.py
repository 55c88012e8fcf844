"""Test and benchmark doubles that plug into the real code paths, imported
by both as `testkit.doubles`: one module name, so the backend registry sees
one class per name.

- CopyBackend ("test-copy"): snapshots a directory by copying it; idempotent
  names, a claim file naming the volume, list/exists/delete: enough of the
  Backend contract for protocol tests and repair's orphan search.
- SimBackend ("test-sim"): no I/O, a fixed cut latency; for the coordinator
  benchmark.
Both register through the backend registry, like any third-party backend.
- SimRanks: a forked process playing N nodes x R ranks: on the trigger (what
  SIGUSR1 is to a real rank) it reads request.json and writes each rank's ack
  at its scheduled delay, recording when each landed.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from slurm_snap.backends import registry
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef, check_abs_path, check_name
from slurm_snap.jobdir import ack_filename
from slurm_snap.jobrecords import Ack, ManifestEntry
from slurm_snap.clock import utcnow
from slurm_snap.errors import BackendError, NotFound, SnapshotCollision

CLAIM = ".volume"


class CopyBackend(Backend):
    name = "test-copy"
    OPTIONS = {"snapdir": (str, None), "delay": (float, 0.0), "fail_on": (str, None)}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=False, read_only=False, instant=False, per_file_cost=True,
                            scope="volume", needs_root=False, can_clone=True)

    def snapdir(self, volume: str) -> str:
        return self.options["snapdir"] or os.path.join(os.path.dirname(volume.rstrip("/")), ".snapshots")

    def _claim(self, path: str) -> str | None:
        try:
            with open(path + CLAIM) as f:
                return f.read()
        except OSError:
            return None

    def create(self, volume: str, name: str) -> SnapshotRef:
        check_name(name)
        volume = check_abs_path("volume", volume)
        if not os.path.isdir(volume):
            raise NotFound(what="volume directory", value=volume)
        if self.options["fail_on"] and self.options["fail_on"] in volume:
            raise BackendError(backend=self.name, why=f"injected failure for {volume}")
        target = os.path.join(self.snapdir(volume), name)
        if os.path.isdir(target):
            owner = self._claim(target)
            if owner == volume:
                return self.ref(volume, name, target, target)
            raise SnapshotCollision(backend=self.name, name=target, other=owner, volume=volume)
        if self.options["delay"]:
            time.sleep(self.options["delay"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        partial = os.path.join(os.path.dirname(target), f".{name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(volume, partial, symlinks=True)
        with open(target + CLAIM, "w") as f:
            f.write(volume)
        os.rename(partial, target)
        return self.ref(volume, name, target, target)

    def list(self, volume: str) -> list[SnapshotRef]:
        d = self.snapdir(volume)
        try:
            names = sorted(os.listdir(d))
        except FileNotFoundError:
            return []
        return [self.ref(volume, n, os.path.join(d, n), os.path.join(d, n)) for n in names
                if not n.startswith(".") and not n.endswith(CLAIM) and self._claim(os.path.join(d, n)) == volume]

    def exists(self, ref: SnapshotRef) -> bool:
        return os.path.isdir(ref.ref) and self._claim(ref.ref) is not None

    def delete(self, ref: SnapshotRef) -> bool:
        if not self.exists(ref):
            return False
        shutil.rmtree(ref.ref)
        os.unlink(ref.ref + CLAIM)
        return True

    def clone(self, ref: SnapshotRef, target: str) -> str:
        shutil.copytree(ref.ref, target, symlinks=True)
        return target


class SimBackend(Backend):
    """Fixed latency, no I/O; snapshots live in a process-wide dict."""

    name = "test-sim"
    OPTIONS = {"latency": (float, 0.002)}
    _made: dict[str, str] = {}
    _lock = threading.Lock()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                            scope="volume", needs_root=False, can_clone=False)

    def create(self, volume: str, name: str) -> SnapshotRef:
        time.sleep(self.options["latency"])
        with self._lock:
            self._made.setdefault(name, volume)
        return self.ref(volume, name, f"sim:{name}", None)

    def list(self, volume: str) -> list[SnapshotRef]:
        with self._lock:
            return [self.ref(volume, n, f"sim:{n}") for n, v in sorted(self._made.items()) if v == volume]

    def exists(self, ref: SnapshotRef) -> bool:
        with self._lock:
            return ref.name in self._made

    def delete(self, ref: SnapshotRef) -> bool:
        with self._lock:
            return self._made.pop(ref.name, None) is not None


def register_test_backends() -> None:
    reg = registry.default_registry()
    reg.register(CopyBackend.name, CopyBackend)
    reg.register(SimBackend.name, SimBackend)


# ---- simulated ranks -----------------------------------------------------------
@dataclass(frozen=True)
class RankPlan:
    node: str
    rank: int
    local_rank: int
    local_size: int
    delay: float
    manifest: tuple[ManifestEntry, ...] = ()


def plan_ranks(nodes: Sequence[str], ranks_per_node: int, *, base: float = 0.0, spread: float = 0.0,
               seed: int = 0) -> list[RankPlan]:
    rnd = random.Random(seed)
    out = []
    for i, node in enumerate(nodes):
        for lr in range(ranks_per_node):
            out.append(RankPlan(node, i * ranks_per_node + lr, lr, ranks_per_node, base + rnd.random() * spread))
    return out


def write_ack(ack_dir: str, job_id: int, epoch: str, p: RankPlan, step: int, *, fsync: bool = False) -> None:
    """A rank's acknowledgement, renamed into place. Not fsio.atomic_write:
    the barrier benchmark stamps the moment right after the rename, and the
    directory fsync atomic_write adds would land after the waiter woke."""
    data = Ack(job_id=str(job_id), epoch=epoch, node=p.node, rank=p.rank, local_rank=p.local_rank,
               local_size=p.local_size, step=step, written_at=utcnow(), manifest=p.manifest).to_bytes()
    name = ack_filename(p.node, p.rank)
    tmp = os.path.join(ack_dir, f".{name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.rename(tmp, os.path.join(ack_dir, name))


def _ranks_main(conn, job_dir: str, job_id: int, plans: list[RankPlan], step: int, fsync: bool) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        trigger = time.time()
        with open(os.path.join(job_dir, "request.json")) as f:
            epoch = json.load(f)["epoch"]
        written = []
        for p in sorted(plans, key=lambda p: p.delay):
            wait = trigger + p.delay - time.time()
            if wait > 0:
                time.sleep(wait)
            write_ack(os.path.join(job_dir, "ack"), job_id, epoch, p, step, fsync=fsync)
            written.append(time.time())
        conn.send({"trigger": trigger, "first": min(written), "last": max(written), "count": len(written)})


class SimRanks:
    """A separate process (no shared GIL with the coordinator) playing every rank."""

    def __init__(self, job_dir: str, job_id: int, plans: list[RankPlan], *, step: int = 1, fsync: bool = False):
        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_ranks_main, args=(child, job_dir, job_id, plans, step, fsync), daemon=True)
        self.proc.start()

    def signal(self, job_id: int) -> None:
        """The coordinator's signaller: what one `scancel --signal` is to real ranks."""
        self._conn.send(True)

    def result(self, timeout: float = 60.0) -> dict:
        if not self._conn.poll(timeout):
            raise TimeoutError("simulated ranks did not report")
        return self._conn.recv()

    def close(self) -> None:
        try:
            self._conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
