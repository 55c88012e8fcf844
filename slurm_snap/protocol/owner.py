"""Who drives a set: `host:pid:starttime`, recorded on the set so `repair` can
tell a coordinator that is still working from one that died. The process
start time (from /proc) defends against a recycled pid."""
from __future__ import annotations

import os
import socket


def _stat_fields(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    # Fields from 3 (state) on; the command name (field 2) may contain spaces and ')'.
    return raw[raw.rfind(b")") + 2:].split()


def _start_time(pid: int) -> str:
    rest = _stat_fields(pid)
    return rest[19].decode() if len(rest) > 19 else ""


def token(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def parse(owner: str) -> tuple[str, int | None, str]:
    host, _, rest = (owner or "").partition(":")
    pid_s, _, start = rest.partition(":")
    return host, int(pid_s) if pid_s.isdigit() else None, start


def alive(owner: str, *, host: str | None = None) -> bool | None:
    """True/False for an owner on this host; None when it runs elsewhere (or is unknown)."""
    h, pid, start = parse(owner)
    if not h or pid is None or h != (host or socket.gethostname()):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _stat_fields(pid)
    if fields and fields[0] in (b"Z", b"X"):
        return False  # killed, not yet reaped
    return not start or (len(fields) > 19 and fields[19].decode() == start)
