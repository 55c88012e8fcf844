"""A live progress line for long commands, and their phases' durations.

`restore-test` may run for its whole 900 s deadline, a hand-run `schedule`
pass waits for its sets and drills, partner copies stream gigabytes, and
`prune --apply` deletes snapshots one by one: without a word until the end,
an admin cannot tell a slow step from a hung one. A command opens one
`Line`; the code doing the work reports to whichever line is open with the
module functions `phase()` and `advance()`, so no progress object is
threaded through the library, and code run without a line (hooks, the
service, tests) reports to nobody at no cost.

On a terminal (stderr is a TTY, and not `--json`) the line is redrawn in
place, at most every `REFRESH` seconds and on every phase change:

    restore-test set:12 | clone 2/4 | 1.3 GiB | 00:07

Elsewhere it prints nothing. Independently, each phase's end is logged at
INFO with its duration (and items, bytes), which `-v` shows, on a terminal
or not. One process, one line: a module-level slot, not a context
variable, so the worker threads of the schedule runner and of node-local
copies report to it too.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Callable, Iterator, TextIO

log = logging.getLogger("slurm_snap.progress")

REFRESH = 0.25          # seconds between two redraws of the line
_active: "Line | None" = None
_slot = threading.Lock()


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def clock_text(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class Line:
    """The one progress line of a command; a context manager.

    `live` False keeps it silent (not a terminal, --json); phases are still
    timed and logged."""

    def __init__(self, what: str, *, live: bool | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, ticker: bool = True):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.clock = clock
        self._ticker = ticker and self.live
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = clock()
        self.name = ""
        self.total: int | None = None
        self.done = 0
        self.bytes = 0
        self._phase_started = self.started
        self._drawn = 0.0
        self._width = 0
        self.held = 0

    # -- reporting --------------------------------------------------------------
    def phase(self, name: str, total: int | None = None) -> None:
        with self._lock:
            self._end_phase()
            self.name, self.total, self.done, self.bytes = name, total, 0, 0
            self._phase_started = self.clock()
            self._draw(force=True)

    def advance(self, n: int = 1, nbytes: int = 0) -> None:
        with self._lock:
            self.done += n
            self.bytes += nbytes
            # The last item is always drawn: the line ends on "N/N".
            self._draw(force=self.total is not None and self.done >= self.total)

    def text(self) -> str:
        """The line as drawn: what, phase with done/total, bytes, elapsed."""
        parts = [self.what]
        if self.name:
            count = f" {self.done}/{self.total}" if self.total is not None else (f" {self.done}" if self.done else "")
            parts.append(self.name + count)
        if self.bytes:
            parts.append(human_bytes(self.bytes))
        parts.append(clock_text(self.clock() - self.started))
        return " | ".join(parts)

    # -- the context ------------------------------------------------------------
    def __enter__(self) -> "Line":
        global _active
        with _slot:
            _active = self
        if self._ticker:
            # Elapsed time moves on while one long step (a clone, a drill's
            # resume command) reports nothing.
            self._thread = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        global _active
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._end_phase()
            if self.live and self._width:
                self._write("\r" + " " * self._width + "\r")
        with _slot:
            if _active is self:
                _active = None

    # -- inside -----------------------------------------------------------------
    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._draw(force=True)

    def _end_phase(self) -> None:
        if not self.name:
            return
        if self.live and self._width:   # the log line (at -v) starts on a clean line
            self._write("\r" + " " * self._width + "\r")
            self._width = 0
        took = self.clock() - self._phase_started
        detail = ""
        if self.total is not None or self.done:
            detail += f", {self.done}" + (f"/{self.total}" if self.total is not None else "") + " done"
        if self.bytes:
            detail += f", {human_bytes(self.bytes)}"
        log.info("%s: %s took %.1f s%s", self.what, self.name, took, detail)
        self.name = ""

    def _draw(self, force: bool = False) -> None:
        if not self.live:
            return
        now = self.clock()
        if not force and now - self._drawn < REFRESH:
            return
        self._drawn = now
        text = self.text()
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self._write("\r" + text + " " * pad)

    def _write(self, s: str) -> None:
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):   # a closed terminal must not fail the work
            self.live = False


def phase(name: str, total: int | None = None) -> None:
    """Start a phase of the open line (if any, and not held): `total` items
    to do, if known."""
    line = _active
    if line is not None and not line.held:
        line.phase(name, total)


def advance(n: int = 1, nbytes: int = 0) -> None:
    """`n` more items of the phase done, `nbytes` more bytes moved (while the
    line is held, only the bytes count)."""
    line = _active
    if line is not None:
        line.advance(0 if line.held else n, nbytes)


def count(n: int = 1) -> None:
    """`n` more items done, by the code that holds the line."""
    line = _active
    if line is not None:
        line.advance(n, 0)


@contextlib.contextmanager
def hold() -> Iterator[None]:
    """Keep the current phase while work that reports its own runs inside
    it: a schedule pass counts its sets and drills, not each drill's clones
    (their bytes still add up). Counted with count()."""
    line = _active
    if line is not None:
        line.held += 1
    try:
        yield
    finally:
        if line is not None:
            line.held -= 1
