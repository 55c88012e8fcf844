"""Waking up as soon as a file lands: inotify through ctypes, with a capped
poll beside it. Standard library only: the rank client waits for its release
with it, the coordinator for acknowledgements.

inotify sees only what this kernel writes. A file created by another host on
a network filesystem (an acknowledgement from another node, a release written
by the controller) arrives unannounced, so every wait also returns after a
short backoff and the caller looks again. Where inotify is unavailable (not
Linux/glibc, the per-user instance limit reached, the watch limit reached)
the poll alone still works.
"""
from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
import time
from collections.abc import Callable

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_Q_OVERFLOW = 0x00004000
IN_ONLYDIR = 0x01000000
# A file is worth reading once it is whole: written and closed, or renamed
# into place. CREATE matters only when waiting for a directory to appear.
WRITTEN = IN_CLOSE_WRITE | IN_MOVED_TO
APPEARED = WRITTEN | IN_CREATE
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

POLL_MIN = 0.002
POLL_MAX = 0.05   # bounds how late a file written by another host is noticed

_libc = None


def _lib():
    global _libc
    if _libc is None:
        try:
            # The program's own symbols: find_library would fork `ldconfig -p`.
            libc = ctypes.CDLL(None, use_errno=True)
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_init1.restype = ctypes.c_int
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_add_watch.restype = ctypes.c_int
        except (OSError, AttributeError):
            libc = False
        _libc = libc
    return _libc or None


class Watcher:
    """Directories watched by one inotify instance.

        with Watcher([d], use_inotify=True) as w:
            names = w.wait(timeout)

    wait() returns the names created or replaced in a watched directory
    (possibly empty on a spurious wake-up), or None when the caller must look
    for itself: a quiet interval (maybe a writer on another host), a queue
    overflow, or no inotify at all. Quiet intervals back off from `poll_min`
    to `poll_max`.
    """

    def __init__(self, directories=(), *, events: int = WRITTEN, use_inotify: bool = True,
                 poll_min: float = POLL_MIN, poll_max: float = POLL_MAX, close_in_background: bool = False):
        self.fd = -1
        self.close_in_background = close_in_background
        self.mask = events | IN_ONLYDIR
        self.poll_min, self.poll_max = poll_min, poll_max
        self._delay = poll_min
        self._watched: set[str] = set()
        libc = _lib() if use_inotify else None
        if libc is not None:
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                self.fd = fd
        for d in directories:
            self.watch(d)

    @property
    def inotify(self) -> bool:
        return self.fd >= 0 and bool(self._watched)

    def watch(self, directory: str) -> bool:
        """Add a directory; False if it cannot be watched (missing, limit reached)."""
        if self.fd < 0:
            return False
        if directory in self._watched:
            return True
        if _lib().inotify_add_watch(self.fd, os.fsencode(directory), self.mask) < 0:
            return False  # ENOENT (not created yet) or ENOSPC: the poll covers it
        self._watched.add(directory)
        return True

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            if self.close_in_background:
                # Closing an inotify instance waits for an RCU grace period in
                # the kernel (measured 10-20 ms here): the coordinator does it
                # off its critical path.
                threading.Thread(target=os.close, args=(self.fd,), daemon=True).start()
            else:
                os.close(self.fd)
            self.fd = -1

    def wait(self, timeout: float) -> list[str] | None:
        """Block up to min(timeout, current backoff) for events."""
        pause = max(0.0, min(timeout, self._delay))
        if not self.inotify:
            time.sleep(pause)
            self._delay = min(self._delay * 2, self.poll_max)
            return None
        ready, _, _ = select.select([self.fd], [], [], pause)
        if not ready:
            self._delay = min(self._delay * 2, self.poll_max)
            return None
        self._delay = self.poll_min
        names: list[str] = []
        try:
            while True:
                buf = os.read(self.fd, 1 << 16)
                if not buf:
                    break
                off = 0
                while off + _EVENT.size <= len(buf):
                    _wd, mask, _cookie, length = _EVENT.unpack_from(buf, off)
                    off += _EVENT.size
                    raw = buf[off:off + length].split(b"\0", 1)[0]
                    off += length
                    if mask & IN_Q_OVERFLOW:
                        return None
                    if raw:
                        names.append(os.fsdecode(raw))
        except BlockingIOError:
            pass
        return names


def wait_for_path(path: str, timeout: float, should_abort: Callable[[], bool] = lambda: False,
                  use_inotify: bool = True, poll_cap: float = POLL_MAX) -> bool:
    """True as soon as `path` exists; False on timeout or once `should_abort()`
    is true (checked at least every `poll_cap` seconds)."""
    deadline = time.monotonic() + timeout
    parent = os.path.dirname(path)
    with Watcher(events=APPEARED, use_inotify=use_inotify, poll_min=0.001, poll_max=poll_cap) as watcher:
        while True:
            # Watch before looking, so a file created in between still wakes
            # us; the grandparent catches the creation of the parent itself.
            watcher.watch(os.path.dirname(parent))
            watcher.watch(parent)
            if os.path.exists(path):
                return True
            if should_abort():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            watcher.wait(remaining)
