"""A node's durable spool: what its Epilogs cut, kept until the inventory
has it. The node side of "nothing lost", as slurmctld keeps accounting
records in its agent queue while slurmdbd is away.

    <[spool] directory>/            root 0700, on the node's own disk
        entries/                    one SpoolEntry a file, delivered oldest first
            <ns>-<job>-preempt-<restart>-<node>.json
                                    <ns>: time.time_ns() when first written (20
                                    digits, so the names sort in the order written)
        rejected/                   entries whose content does not parse, kept for
                                    an admin with a .why beside each; never retried
        reserve                     [spool] reserve_bytes of allocated space, given
                                    up when the disk is full so the entry still lands
        agent.json                  the delivery agent's backoff (AgentState)
        agent.lock                  flock: one delivery pass at a time

Every entry is written whole or not at all and survives a power cut
(fsio.atomic_write durable: fsync the file, rename, fsync the directory);
removing one after delivery is an unlink and a directory fsync, so a crash
in between delivers it again, which the controller's delivery ignores
(idempotent). The spool is bounded ([spool] max_bytes over entries/): past
it a new entry is refused, with the reason, rather than fill the node's
disk. Standard library only: the Epilog's path imports it.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from typing import Iterator

from ..errors import BadValueError, SpoolError
from ..fsio import atomic_write, fsync_path, read_json
from ..jobrecords import check_name
from . import ENTRIES, REJECTED
from .records import AgentState, SpoolEntry

RESERVE = "reserve"
STATE = AgentState.FILE
LOCK = "agent.lock"
# The service takes requests of at most 1 MiB (service.server.MAX_REQUEST),
# carried in a base64 MUNGE credential: an entry larger than this could never
# be delivered, so it is refused when written (the hook log says so).
MAX_ENTRY_BYTES = 700 * 1024


class Outbox:
    """`Outbox(directory, max_bytes=, reserve_bytes=)`: the spool of this node."""

    def __init__(self, directory: str, *, max_bytes: int, reserve_bytes: int):
        if not os.path.isabs(directory):
            raise BadValueError(what="spool directory", value=directory, why="must be an absolute path")
        self.directory = directory
        self.entries_dir = os.path.join(directory, ENTRIES)
        self.rejected_dir = os.path.join(directory, REJECTED)
        self.max_bytes = max_bytes
        self.reserve_bytes = reserve_bytes

    @classmethod
    def of(cls, cfg) -> "Outbox":
        return cls(cfg.spool.directory, max_bytes=cfg.spool.max_bytes, reserve_bytes=cfg.spool.reserve_bytes)

    def _error(self, why: str) -> SpoolError:
        return SpoolError(directory=self.directory, why=why)

    # -- layout ---------------------------------------------------------------
    def prepare(self) -> "Outbox":
        """The directories, root's alone (idempotent); never through a link."""
        try:
            for path in (self.directory, self.entries_dir, self.rejected_dir):
                os.makedirs(path, mode=0o700, exist_ok=True)
                st = os.lstat(path)
                if not stat.S_ISDIR(st.st_mode):
                    raise self._error(f"{path} is not a directory (refusing to follow it)")
                if st.st_mode & 0o077 and os.geteuid() == st.st_uid:
                    os.chmod(path, 0o700)
        except OSError as exc:
            raise self._error(f"cannot create it: {exc.strerror or exc}") from None
        return self

    def ensure_reserve(self) -> bool:
        """Allocate the reserve if it is missing; False if the disk cannot
        hold it now (then the next pass tries again)."""
        path = os.path.join(self.directory, RESERVE)
        try:
            if os.path.getsize(path) >= self.reserve_bytes:
                return True
        except OSError:
            pass
        if self.reserve_bytes <= 0:
            return True
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, self.reserve_bytes)
            os.fsync(fd)
            return True
        except OSError:
            # No reserve rather than a short one: a full disk's Epilog would
            # give up a file that frees nothing.
            try:
                os.unlink(path)
            except OSError:
                pass
            return False
        finally:
            os.close(fd)

    def _give_up_reserve(self) -> bool:
        try:
            os.unlink(os.path.join(self.directory, RESERVE))
            fsync_path(self.directory, directory=True)
            return True
        except FileNotFoundError:
            return False

    # -- entries --------------------------------------------------------------
    def names(self) -> list[str]:
        """Entries waiting, oldest first."""
        try:
            return sorted(n for n in os.listdir(self.entries_dir) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._error(f"cannot list {self.entries_dir}: {exc.strerror or exc}") from None

    def used_bytes(self) -> int:
        total = 0
        for name in self.names():
            try:
                total += os.lstat(os.path.join(self.entries_dir, name)).st_size
            except OSError:
                pass
        return total

    @staticmethod
    def _suffix(entry: SpoolEntry) -> str:
        return (f"-{int(entry.job_id)}-{check_name('epoch', entry.epoch)}-"
                f"{check_name('node name', entry.node)}.json")

    def put(self, entry: SpoolEntry) -> str:
        """Keep `entry` durably; returns its file name. A rerun of the same
        Epilog (Slurm may run a hook twice) replaces its earlier entry in
        place, keeping its position in the order."""
        data = (json.dumps(entry.to_json(), sort_keys=True) + "\n").encode()
        if len(data) > MAX_ENTRY_BYTES:
            raise self._error(f"an entry of job {entry.job_id} is {len(data)} bytes, over the "
                              f"{MAX_ENTRY_BYTES} the service accepts in one request")
        self.prepare()
        suffix = self._suffix(entry)
        names = self.names()
        name = next((n for n in names if n.endswith(suffix)), None)
        used = self.used_bytes()
        if name is None and used + len(data) > self.max_bytes:
            raise self._error(f"it holds {used} bytes in {len(names)} entries, its bound is {self.max_bytes} "
                              "([spool] max_bytes): the service has not taken them for a long time; "
                              "`slurm-snap node-agent --status` says why")
        name = name or f"{time.time_ns():020d}{suffix}"
        path = os.path.join(self.entries_dir, name)
        try:
            atomic_write(path, data, mode=0o600, durable=True, nofollow=True)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not self._give_up_reserve():
                raise self._error(f"cannot write {name}: {exc.strerror or exc}") from None
            # The disk is full: the reserve exists for exactly this entry.
            try:
                atomic_write(path, data, mode=0o600, durable=True, nofollow=True)
            except OSError as exc2:
                raise self._error(f"cannot write {name}, even after giving up its reserve: "
                                  f"{exc2.strerror or exc2}") from None
        return name

    def read(self, name: str) -> SpoolEntry:
        """One entry; BadValueError naming the file and field when it does not parse."""
        path = os.path.join(self.entries_dir, name)
        try:
            data = read_json(path, max_bytes=MAX_ENTRY_BYTES)
        except ValueError as exc:
            raise BadValueError(what="spool entry", value=path, why=str(exc)) from None
        if data is None:
            raise FileNotFoundError(path)
        return SpoolEntry.parse(data, path)

    def pending(self) -> Iterator[tuple[str, SpoolEntry | BadValueError]]:
        """(name, entry or why it does not parse), oldest first."""
        for name in self.names():
            try:
                yield name, self.read(name)
            except FileNotFoundError:
                continue   # delivered meanwhile (the Epilog's own attempt)
            except BadValueError as exc:
                yield name, exc

    def remove(self, name: str) -> None:
        """Delivered: gone, durably (a crash before the fsync delivers it again)."""
        try:
            os.unlink(os.path.join(self.entries_dir, name))
        except FileNotFoundError:
            return
        fsync_path(self.entries_dir, directory=True)

    def reject(self, name: str, why: str) -> None:
        """An entry that does not parse: kept aside for an admin, never retried."""
        os.makedirs(self.rejected_dir, mode=0o700, exist_ok=True)
        os.rename(os.path.join(self.entries_dir, name), os.path.join(self.rejected_dir, name))
        atomic_write(os.path.join(self.rejected_dir, name + ".why"), (why + "\n").encode(), mode=0o600)
        fsync_path(self.entries_dir, directory=True)

    # -- the agent's state and lock ---------------------------------------------------
    def read_state(self) -> AgentState:
        path = os.path.join(self.directory, STATE)
        try:
            data = read_json(path)
            return AgentState() if data is None else AgentState.parse(data, path)
        except (ValueError, BadValueError):
            return AgentState()   # a damaged backoff record only costs one early retry

    def write_state(self, state: AgentState) -> None:
        try:
            atomic_write(os.path.join(self.directory, STATE),
                         (json.dumps(state.to_json(), sort_keys=True) + "\n").encode(), mode=0o600, durable=False,
                         nofollow=True)
        except OSError:
            pass   # a full disk must not stop delivery; the backoff is only advice

    def lock(self, *, wait: bool = False) -> int | None:
        """flock on agent.lock: the descriptor, or None if another pass holds it."""
        self.prepare()
        fd = os.open(os.path.join(self.directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        return fd
