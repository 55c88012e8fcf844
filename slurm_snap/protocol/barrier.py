"""Collect the ranks' acknowledgements of one epoch from `<job dir>/ack/`.

The ack directory is owned by the job's user and read by root, so every file
is opened relative to a directory descriptor with O_NOFOLLOW|O_NONBLOCK and
must be a regular file owned by that user (or root): a symlink or hard link
to /etc/shadow, or a FIFO, is rejected with its reason, never read.
Parsing is jobrecords.Ack's (one definition of an acknowledgement on both
sides of the barrier); the per-node completeness rule is here.
"""
from __future__ import annotations

import datetime as dt
import errno
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..clock import utcnow
from ..errors import BadValueError
from ..jobdir import is_ack_name
from ..jobrecords import MAX_ACK_BYTES, Ack
from ..watch import Watcher

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class BarrierState:
    job_id: int
    epoch: str
    nodes: tuple[str, ...]
    # node -> rank -> (ack, first seen): the newest valid version of each file.
    acks: dict[str, dict[int, tuple[Ack, dt.datetime]]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)     # file name -> why
    complete: set[str] = field(default_factory=set)            # nodes whose barrier is complete
    complete_at: dict[str, dt.datetime] = field(default_factory=dict)

    @property
    def all_complete(self) -> bool:
        return len(self.complete) == len(self.nodes)

    @property
    def missing_nodes(self) -> list[str]:
        return [n for n in self.nodes if n not in self.complete]

    def acks_of(self, node: str) -> list[Ack]:
        return [a for a, _t in self.acks.get(node, {}).values()]

    def all_acks(self) -> list[tuple[Ack, dt.datetime]]:
        return [item for ranks in self.acks.values() for item in ranks.values()]

    def records(self) -> list[Ack]:
        """Every acknowledgement with when it was first seen, as the inventory
        and the verdict take it."""
        return [a.seen(seen) for a, seen in self.all_acks()]


def node_barrier_complete(acks_for_node: Iterable[Ack]) -> bool:
    """True when one node's acks cover local ranks 0..local_size-1, all with
    the same local_size, one distinct rank per local rank (every ack was
    checked for this set's epoch when it was parsed)."""
    acks = list(acks_for_node)
    if not acks:
        return False
    nodes = {ack.node for ack in acks}
    if len(nodes) > 1:
        raise BadValueError(what="acknowledgements of one node", value=sorted(nodes),
                            why="come from several nodes")
    if len({ack.local_size for ack in acks}) != 1:
        return False
    local_size = acks[0].local_size
    by_local_rank: dict[int, set[int]] = {}
    for ack in acks:
        by_local_rank.setdefault(ack.local_rank, set()).add(ack.rank)
    # Length first: local_size comes from a rank's file and may be huge.
    if len(by_local_rank) != local_size or set(by_local_rank) != set(range(local_size)):
        return False
    # Two different global ranks claiming one local rank means the acks do not
    # describe one consistent layout of this node.
    return all(len(ranks) == 1 for ranks in by_local_rank.values())


class AckCollector:
    """Reads and validates ack files incrementally; tracks per-node completeness."""

    def __init__(self, ack_dir: str, *, job_id: int, epoch: str, nodes: Sequence[str],
                 owner_uid: int | None = None, node_filter: str | None = None,
                 max_bytes: int = MAX_ACK_BYTES, clock: Callable[[], dt.datetime] = utcnow):
        self.ack_dir = ack_dir
        self.state = BarrierState(job_id=job_id, epoch=epoch, nodes=tuple(dict.fromkeys(nodes)))
        self._node_set = set(self.state.nodes)
        self.owner_uid = owner_uid
        self.node_filter = node_filter
        self.max_bytes = max_bytes
        self.clock = clock
        self._sig: dict[str, tuple] = {}   # name -> (ino, mtime, ctime, size) last examined
        self._dfd = -1

    # -- directory ----------------------------------------------------------
    def _open_dir(self) -> bool:
        if self._dfd >= 0:
            return True
        try:
            self._dfd = os.open(self.ack_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _wanted(self, name: str) -> bool:
        if not is_ack_name(name):
            return False  # the client's temporaries and foreign files
        return self.node_filter is None or name.startswith(self.node_filter + ".")

    def rescan(self) -> int:
        """Look at every file (new or changed since last time); returns how many were read."""
        if not self._open_dir():
            return 0
        try:
            names = os.listdir(self._dfd)
        except OSError:
            return 0
        return self.update(names, check_changed=True)

    def update(self, names: Iterable[str], *, check_changed: bool = False) -> int:
        if not self._open_dir():
            return 0
        read = 0
        touched: set[str] = set()
        # One read per name: inotify may report a name twice in one batch.
        for name in dict.fromkeys(names):
            if not self._wanted(name):
                continue
            node = self._read_one(name, check_changed)
            if node is not None:
                read += 1
                touched.add(node)
        for node in touched:
            self._recheck(node)
        return read

    # -- one file -----------------------------------------------------------
    def _read_one(self, name: str, check_changed: bool) -> str | None:
        """Parse `name` if new or changed; returns the node it belongs to, if valid."""
        try:
            fd = os.open(name, _FLAGS, dir_fd=self._dfd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot open: {exc.strerror}"
            self._reject(name, why)
            return None
        try:
            st = os.fstat(fd)
            sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if check_changed and self._sig.get(name) == sig:
                return None
            self._sig[name] = sig
            if not stat.S_ISREG(st.st_mode):
                self._reject(name, "is not a regular file")
                return None
            if self.owner_uid is not None and st.st_uid not in (self.owner_uid, 0):
                self._reject(name, f"owned by uid {st.st_uid}, not the job's user (uid {self.owner_uid})")
                return None
            if st.st_nlink > 1:
                self._reject(name, "has several hard links")
                return None
            if st.st_size > self.max_bytes:
                self._reject(name, f"{st.st_size} bytes, larger than the limit of {self.max_bytes}")
                return None
            chunks, size = [], 0
            while size <= self.max_bytes:  # a network filesystem may return short reads
                chunk = os.read(fd, self.max_bytes + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            raw = b"".join(chunks)
        finally:
            os.close(fd)
        try:
            ack = Ack.from_bytes(raw, self.state.job_id, self.state.epoch, self.max_bytes)
        except BadValueError as exc:
            self._reject(name, str(exc)[:300])
            return None
        expected_name = f"{ack.node}.{ack.rank}.json"
        if name != expected_name:
            self._reject(name, f"file name does not match its content ({expected_name})")
            return None
        if ack.node not in self._node_set:
            self._reject(name, f"node {ack.node!r} is not one of the job's nodes")
            return None
        self.state.rejected.pop(name, None)
        ranks = self.state.acks.setdefault(ack.node, {})
        prev = ranks.get(ack.rank)
        ranks[ack.rank] = (ack, prev[1] if prev and prev[0] == ack else self.clock())
        return ack.node

    def _reject(self, name: str, why: str) -> None:
        self.state.rejected[name] = why

    def _recheck(self, node: str) -> None:
        st = self.state
        try:
            done = node_barrier_complete(st.acks_of(node))
        except BadValueError:
            done = False
        if done and node not in st.complete:
            st.complete.add(node)
            st.complete_at[node] = self.clock()
        elif not done:
            st.complete.discard(node)
            st.complete_at.pop(node, None)


def wait_for_barrier(collector: AckCollector, *, timeout: float, use_inotify: bool = True,
                     should_stop: Callable[[], bool] = lambda: False,
                     on_progress: Callable[[], None] | None = None) -> bool:
    """Return True once every node's barrier is complete, False at the deadline.

    inotify reports new names at once (parsed one by one as they land, so the
    last arrival costs one parse, not N); quiet periods trigger a rescan with a
    capped backoff for writers on other hosts. `on_progress` runs after each
    batch while the barrier is still open (the coordinator records the
    acknowledgements so far); never after the last one, which must be acted on
    at once.
    """
    deadline = time.monotonic() + max(0.0, timeout)
    with Watcher([collector.ack_dir], use_inotify=use_inotify, close_in_background=True) as watcher:
        collector.rescan()  # after the watch is set: nothing slips between
        while not collector.state.all_complete:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or should_stop():
                break
            names = watcher.wait(remaining)
            if names is None:
                collector.rescan()
            elif names:
                collector.update(names)
            else:
                continue
            if on_progress is not None and not collector.state.all_complete:
                on_progress()
        if not collector.state.all_complete:
            collector.rescan()  # a last look: files may have landed during the final wait
    return collector.state.all_complete
