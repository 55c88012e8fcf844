"""Start a program that outlives the hook that started it.

PrologSlurmctld holds the job's launch until it exits, and recording a job
in the inventory means importing SQLAlchemy (about 240 ms here, more than the
whole start-path budget of 100 ms). The recording does not need to hold the
launch: nothing reads the job's rows before it has run for a while. So the
hook validates the job in the foreground (a bad declaration still fails it
at once) and starts the recording as a grandchild in its own session, with
stdio on /dev/null: slurmctld neither waits for it nor kills it with the
hook's process group, and no pipe of slurmctld's stays open.

The grandchild execs a fresh interpreter rather than running on in a forked
copy: a forked process must not reuse its parent's SQLite state (an open
WAL database in the parent gives the child "locking protocol" errors).
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence


def spawn_detached(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """exec `argv` in a detached grandchild; return its pid once the exec succeeded."""
    r, w = os.pipe2(os.O_CLOEXEC)
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.close(r)
            os.setsid()
            grandchild = os.fork()
            if grandchild:  # the intermediate: report the pid and go
                os.write(w, f"pid {grandchild}\n".encode())
                code = 0
            else:
                _detach_stdio(keep=w)
                try:
                    os.execve(argv[0], list(argv), dict(env))
                except OSError as exc:
                    os.write(w, f"error {exc}\n".encode())
                code = 127
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    try:
        # EOF once the intermediate has exited and the grandchild's exec
        # closed the write end (CLOEXEC), or the grandchild reported failing.
        while chunk := os.read(r, 4096):
            data += chunk
    finally:
        os.close(r)
        os.waitpid(child, 0)
    lines = data.decode(errors="replace").splitlines()
    errors = [x[6:] for x in lines if x.startswith("error ")]
    pids = [x[4:] for x in lines if x.startswith("pid ")]
    if errors or not pids or not pids[0].isdigit():
        raise OSError(f"could not start {argv[0]}: {'; '.join(errors) or 'no process'}")
    return int(pids[0])


def _detach_stdio(keep: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    # Whatever else the hook inherited from slurmctld (pipes, sockets) is not ours.
    os.closerange(3, keep)
    os.closerange(keep + 1, 65536)
