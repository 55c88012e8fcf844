"""Run a drilled program and watch for its first successful step.

The program proves it resumed by printing `SLURM_SNAP_FIRST_STEP <step>` on
stdout or by writing that line to the marker file (slurm_snap.client.marker).
Whichever comes first counts; time to first step is measured from the start
of the command. The program runs in its own process group so the deadline
(and the stop after the first step) kills every process it started.

Used by the local drill (as root, switching to the job's owner) and inside a
Slurm job by `--submit` drills (already the owner: no switch).
"""
from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

MARKER_RE = re.compile(rb"^SLURM_SNAP_FIRST_STEP\s+(\d+)\s*$")
TAIL_LINES = 20
TAIL_BYTES = 2000
POLL = 0.05
# After the first step the program has proven itself; it gets this long to
# stop on SIGTERM (e.g. to finish writing) before SIGKILL.
STOP_GRACE = 5.0


@dataclass(frozen=True)
class Credentials:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass
class RunResult:
    started: bool = False
    first_step: int | None = None
    time_to_first_step: float | None = None
    marker_source: str = ""
    exit_status: int | None = None
    timed_out: bool = False
    elapsed: float = 0.0
    stdout_tail: list[str] = field(default_factory=list)
    stderr_tail: str = ""
    error: str = ""
    # Where and when (epoch seconds) the program started: a drill job's node
    # (restore/injob.py); the queue wait is the time from the submission to it.
    host: str = ""
    started_at: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "RunResult":
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def parse_marker(data: bytes) -> int | None:
    for line in data.splitlines():
        m = MARKER_RE.match(line.strip())
        if m:
            return int(m.group(1))
    return None


def read_marker_file(path: str) -> int | None:
    """The step in the marker file, or None; never follows a symlink (the
    directory belongs to the user and this may run as root)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return parse_marker(os.read(fd, 4096))
    except OSError:
        return None
    finally:
        os.close(fd)


class _Watch:
    def __init__(self, start: float):
        self.start = start
        self.lock = threading.Lock()
        self.first_step: int | None = None
        self.at: float | None = None
        self.source = ""
        self.seen = threading.Event()
        self.stdout_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stderr = bytearray()

    def found(self, step: int, source: str) -> None:
        with self.lock:
            if self.first_step is None:
                self.first_step, self.at, self.source = step, time.monotonic() - self.start, source
                self.seen.set()

    def read_stdout(self, stream) -> None:
        for line in iter(stream.readline, b""):
            m = MARKER_RE.match(line.strip())
            if m:
                self.found(int(m.group(1)), "stdout")
            self.stdout_tail.append(line.decode(errors="replace").rstrip("\n")[:500])

    def read_stderr(self, stream) -> None:
        for chunk in iter(lambda: stream.read(4096), b""):
            self.stderr += chunk
            del self.stderr[:-TAIL_BYTES]


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(argv: Sequence[str], *, env: Mapping[str, str], cwd: str, deadline: float,
                marker_file: str | None = None, creds: Credentials | None = None) -> RunResult:
    """Run argv (no shell) until its first step, its exit, or the deadline."""
    result = RunResult()
    kwargs = {}
    if creds is not None:
        kwargs = {"user": creds.uid, "group": creds.gid, "extra_groups": list(creds.groups)}
    start = time.monotonic()
    result.started_at = time.time()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(env), cwd=cwd, close_fds=True,
                                start_new_session=True, **kwargs)
    except OSError as exc:
        result.error = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
        return result
    result.started = True
    watch = _Watch(start)
    readers = [threading.Thread(target=watch.read_stdout, args=(proc.stdout,), daemon=True),
               threading.Thread(target=watch.read_stderr, args=(proc.stderr,), daemon=True)]
    for t in readers:
        t.start()
    try:
        while True:
            if marker_file and not watch.seen.is_set():
                step = read_marker_file(marker_file)
                if step is not None:
                    watch.found(step, "marker file")
            if watch.seen.is_set():
                _stop(proc)
                break
            if proc.poll() is not None:
                # The marker may have been the last thing it did before exiting.
                for t in readers:
                    t.join(timeout=2)
                if marker_file and not watch.seen.is_set():
                    step = read_marker_file(marker_file)
                    if step is not None:
                        watch.found(step, "marker file")
                _killpg(proc.pid, signal.SIGKILL)  # children it left behind
                break
            if time.monotonic() - start >= deadline:
                result.timed_out = True
                _stop(proc, grace=1.0)
                break
            watch.seen.wait(POLL)
    finally:
        if proc.poll() is None:
            _stop(proc, grace=0)
        for t in readers:
            t.join(timeout=2)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
    result.elapsed = time.monotonic() - start
    result.exit_status = proc.returncode
    result.first_step, result.time_to_first_step, result.marker_source = watch.first_step, watch.at, watch.source
    if result.first_step is not None:
        result.timed_out = False  # found before the deadline check fired
    result.stdout_tail = list(watch.stdout_tail)
    result.stderr_tail = bytes(watch.stderr).decode(errors="replace")
    return result


def _stop(proc: subprocess.Popen, grace: float = STOP_GRACE) -> None:
    _killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
