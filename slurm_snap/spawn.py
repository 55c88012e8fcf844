"""Run an argv to its end with a deadline, output captured, without the
subprocess module: what the local transport and Slurm's commands use.

`import subprocess` (with the signal, threading, selectors and contextlib
modules it needs) costs ~38 M instructions, ~11 ms on the 2-core machine of
docs/benchmarks.md, and every opted-in job's Prolog runs one tool (a btrfs
subvolume create) through it. posix_spawn, pipes and poll are all in the
interpreter already. The child gets what subprocess gave it here: the argv
(no shell), the environment given, stdin from /dev/null or a pipe, a session
of its own (so a timeout kills its children too), no other descriptor of
ours, and SIGPIPE/SIGXFSZ back at their defaults (Python ignores SIGPIPE).
"""
from __future__ import annotations

import _signal
import os
import select
import time

# Bytes read per call from the child's pipes.
_CHUNK = 1 << 16


class Expired(Exception):
    """The child outran its deadline; it and its session were killed.
    `stdout`/`stderr` hold what it wrote before."""

    def __init__(self, stdout: bytes, stderr: bytes):
        super().__init__("timed out")
        self.stdout, self.stderr = stdout, stderr


def run(argv: list[str], env: dict[str, str], timeout: float, input: bytes | None = None
        ) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr) of argv; a status < 0 is the signal that
    ended it (as subprocess reports it). Raises FileNotFoundError or
    PermissionError if argv[0] cannot be executed, Expired past `timeout`."""
    deadline = time.monotonic() + timeout
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r = in_w = None
    if input is not None:
        in_r, in_w = os.pipe()
    stdin = [(os.POSIX_SPAWN_DUP2, in_r, 0)] if in_r is not None else \
        [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)]
    actions = stdin + [(os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
    # Ours are close-on-exec already (PEP 446); one inherited by this process
    # (from slurmd, say) must not reach the tool either.
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds() if fd > 2]
    try:
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                             setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ))
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (out_w, err_w, in_r):
            if fd is not None:
                os.close(fd)
    try:
        out, err = _collect(pid, out_r, err_r, in_w, input, deadline)
    except Expired:
        _kill(pid)
        raise
    return _wait(pid, deadline, out, err), out, err


def _inheritable_fds() -> list[int]:
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            if os.get_inheritable(fd):
                out.append(fd)
        except OSError:   # the descriptor listdir itself used
            pass
    return out


def _collect(pid: int, out_r: int, err_r: int, in_w: int | None, data: bytes | None,
             deadline: float) -> tuple[bytes, bytes]:
    """Read stdout and stderr to their ends (and feed stdin) before the deadline."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    view = memoryview(data or b"")
    if in_w is not None:
        os.set_blocking(in_w, False)
        if view:
            poller.register(in_w, select.POLLOUT)
        else:
            os.close(in_w)
            in_w = None
    open_fds = set(chunks) | ({in_w} if in_w is not None else set())
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Expired(b"".join(chunks[out_r]), b"".join(chunks[err_r]))
            for fd, _events in poller.poll(left * 1000):
                if fd == in_w:
                    try:
                        view = view[os.write(in_w, view[:_CHUNK]):]
                    except BrokenPipeError:
                        view = view[:0]
                    if not view:
                        poller.unregister(in_w)
                        open_fds.discard(in_w)
                        os.close(in_w)
                        in_w = None
                    continue
                block = os.read(fd, _CHUNK)
                if block:
                    chunks[fd].append(block)
                else:
                    poller.unregister(fd)
                    open_fds.discard(fd)
        return b"".join(chunks[out_r]), b"".join(chunks[err_r])
    finally:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)


def _wait(pid: int, deadline: float, out: bytes, err: bytes) -> int:
    """The child's exit status, once it has closed its output (it may still
    be exiting): polled, as a tool that closed its pipes and hangs must not
    outlive the deadline either."""
    pause = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            _kill(pid)
            raise Expired(out, err)
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def _kill(pid: int, reap_within: float = 5.0) -> None:
    """SIGKILL the child's session and reap the child, waiting for it a few
    seconds at most (a tool stuck in the kernel dies only when it leaves)."""
    try:
        os.killpg(pid, _signal.SIGKILL)
    except ProcessLookupError:
        pass
    end = time.monotonic() + reap_within
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] or time.monotonic() >= end:
                return
        except ChildProcessError:
            return
        time.sleep(0.005)
