"""Wake up as soon as a file lands in a directory: inotify through ctypes,
reporting the names that changed so the coordinator parses only those.

inotify sees only what this kernel writes: acknowledgements written by ranks
on other hosts of a network filesystem arrive unannounced. So `wait` also
returns after a short capped backoff, and None tells the caller to rescan
(the same after a queue overflow, or where inotify is unavailable).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
import time

IN_CLOSE_WRITE = 0x00000008
IN_MOVED_TO = 0x00000080
IN_Q_OVERFLOW = 0x00004000
IN_ONLYDIR = 0x01000000
_MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_ONLYDIR
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name

_libc = None


def _lib():
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.inotify_init1.argtypes = [ctypes.c_int]
            libc.inotify_init1.restype = ctypes.c_int
            libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            libc.inotify_add_watch.restype = ctypes.c_int
        except (OSError, AttributeError):
            libc = False  # not Linux/glibc: polling only
        _libc = libc
    return _libc or None


class DirWatcher:
    """`with DirWatcher(path) as w: names = w.wait(timeout)`.

    wait() returns a list of file names created or replaced in the directory
    (possibly empty on a spurious wake-up), or None when the caller must
    rescan the whole directory.
    """

    def __init__(self, path: str, *, poll_min: float = 0.002, poll_max: float = 0.05,
                 use_inotify: bool = True):
        self.path = path
        self.fd = -1
        self.poll_min, self.poll_max = poll_min, poll_max
        self._delay = poll_min
        libc = _lib() if use_inotify else None
        if libc is not None:
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0:
                if libc.inotify_add_watch(fd, os.fsencode(path), _MASK) >= 0:
                    self.fd = fd
                else:
                    os.close(fd)  # ENOSPC (watch limit) or a vanished directory: poll

    @property
    def inotify(self) -> bool:
        return self.fd >= 0

    def __enter__(self) -> "DirWatcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            # Closing an inotify instance waits for an RCU grace period in the
            # kernel (measured 10-20 ms here): do it off the critical path.
            threading.Thread(target=os.close, args=(self.fd,), daemon=True).start()
            self.fd = -1

    def wait(self, timeout: float) -> list[str] | None:
        """Block up to min(timeout, current backoff) for events."""
        pause = max(0.0, min(timeout, self._delay))
        if self.fd < 0:
            time.sleep(pause)
            self._delay = min(self._delay * 2, self.poll_max)
            return None
        ready, _, _ = select.select([self.fd], [], [], pause)
        if not ready:
            # Quiet: maybe remote writers (network filesystem); back off and rescan.
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
