"""Waiting for a file to appear: inotify (via ctypes) for prompt local
wake-ups, plus a short capped poll, which is also the only thing that sees a
file created by another node on a network filesystem (inotify does not)."""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import time
from collections.abc import Callable

POLL_CAP = 0.05  # seconds; bounds how late a remote release or a termination is noticed

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_ONLYDIR = 0x01000000
_WATCH_MASK = _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_ONLYDIR


class _Inotify:
    """The three inotify calls we need; None from open() when unavailable."""

    def __init__(self, libc, fd: int):
        self._libc = libc
        self.fd = fd
        self._watched: set[str] = set()

    @classmethod
    def open(cls) -> "_Inotify | None":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            init = libc.inotify_init1
        except (OSError, AttributeError):
            return None  # not glibc/Linux: polling alone still works
        init.argtypes = [ctypes.c_int]
        init.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        fd = init(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None  # e.g. EMFILE: the per-user instance limit is reached
        return cls(libc, fd)

    def watch(self, directory: str) -> None:
        if directory in self._watched:
            return
        if self._libc.inotify_add_watch(self.fd, os.fsencode(directory), _WATCH_MASK) >= 0:
            self._watched.add(directory)
        # ENOENT (not created yet) or ENOSPC (watch limit): the poll covers it.

    def wait(self, seconds: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], seconds)
        if ready:
            try:
                while os.read(self.fd, 65536):  # drain; events only mean "look again"
                    pass
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno != errno.EAGAIN:
                    raise

    def close(self) -> None:
        os.close(self.fd)


def wait_for_path(path: str, timeout: float, should_abort: Callable[[], bool] = lambda: False,
                  use_inotify: bool = True, poll_cap: float = POLL_CAP) -> bool:
    """Return True as soon as `path` exists, False on timeout or when
    `should_abort()` becomes true (checked at least every `poll_cap` s)."""
    deadline = time.monotonic() + timeout
    watcher = _Inotify.open() if use_inotify else None
    parent = os.path.dirname(path)
    delay = 0.001
    try:
        while True:
            if watcher is not None:
                # Watch before checking, so a file created in between still wakes us;
                # the grandparent catches the creation of the parent itself.
                watcher.watch(os.path.dirname(parent))
                watcher.watch(parent)
            if os.path.exists(path):
                return True
            if should_abort():
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            pause = min(delay, remaining)
            if watcher is not None:
                watcher.wait(pause)
            else:
                time.sleep(pause)
            delay = min(delay * 2, poll_cap)
    finally:
        if watcher is not None:
            watcher.close()
