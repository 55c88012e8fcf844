"""Frames on the socket and MUNGE credentials.

A frame is a 4-byte big-endian length and that many bytes of JSON object.
Both sides cap what they accept, so a stray client cannot make the
controller allocate what it says it will send, and a deadline bounds the
whole frame, not each read, so a client sending a byte at a time (a
slow-loris) holds a connection no longer than that. Every way a frame can
be wrong is a FrameError (a ValueError): too long, late, not UTF-8 JSON,
nested past what the parser can hold, not an object; a connection closed
mid-frame is a ConnectionError.

MUNGE through its own tools (munge(1), unmunge(1)): they are installed on
every Slurm host and speak to munged for us; nothing runs through a shell.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import socket
import struct
import subprocess
import time

from ..errors import PermissionDenied, ServiceUnavailable

MAX_FRAME = 16 << 20
_LEN = struct.Struct(">I")


def send(sock: socket.socket, obj) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    if len(data) > MAX_FRAME:
        raise ValueError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    sock.sendall(_LEN.pack(len(data)) + data)
    return data


class FrameError(ValueError):
    """A frame that is not one: its text says how (for the service's log)."""


class FrameTimeout(FrameError):
    """The frame did not arrive whole before its deadline."""


def _read_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    parts, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameTimeout(f"frame not complete in time ({got} of {n} bytes)")
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - got, 1 << 16))
        except socket.timeout:
            raise FrameTimeout(f"frame not complete in time ({got} of {n} bytes)") from None
        if not chunk:
            raise ConnectionError("connection closed mid-frame" if got or parts else "connection closed")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def parse_frame(raw: bytes) -> dict:
    """A frame's bytes as the JSON object they must be."""
    try:
        obj = json.loads(raw)
    except RecursionError:   # "[[[[..." deeper than the parser's stack
        raise FrameError("frame nested too deeply") from None
    except ValueError as exc:   # not UTF-8, not JSON
        raise FrameError(f"frame is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(obj, dict):
        raise FrameError("frame is not a JSON object")
    return obj


def recv(sock: socket.socket, *, limit: int = MAX_FRAME, timeout: float | None = None) -> tuple[dict, bytes]:
    """One frame: (the decoded object, its bytes as sent). `timeout`: seconds
    for the whole frame (None: the socket's own timeout, per read)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    (n,) = _LEN.unpack(_read_exact(sock, _LEN.size, deadline))
    if n > limit:
        raise FrameError(f"frame of {n} bytes exceeds the limit of {limit}")
    raw = _read_exact(sock, n, deadline)
    return parse_frame(raw), raw


# ---- MUNGE --------------------------------------------------------------------
def _tool(name: str) -> str:
    path = shutil.which(name, path="/usr/bin:/usr/local/bin:/bin")
    if path is None:
        raise ServiceUnavailable(why=f"{name}(1) is not installed on this host: the slurm-snap service "
                                     "authenticates with MUNGE; the admin must install munge here (etc/README.md)")
    return path


def _socket_args(socket_path: str) -> list[str]:
    return ["--socket", socket_path] if socket_path else []


def encode(payload: bytes, *, socket_path: str = "", timeout: float = 10.0) -> str:
    """A credential carrying `payload`, vouching for this process's uid and gid."""
    r = subprocess.run([_tool("munge"), *_socket_args(socket_path)], input=payload, capture_output=True,
                       timeout=timeout, check=False)
    if r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip().splitlines()
        raise ServiceUnavailable(why="munge could not make a credential on this host ("
                                     + (why[-1] if why else f"status {r.returncode}")
                                     + "): the admin must start munged here (etc/README.md)")
    return r.stdout.decode().strip()


def decode(credential: str, *, socket_path: str = "", timeout: float = 10.0) -> tuple[int, int, bytes]:
    """(uid, gid, payload) of a credential, or PermissionDenied: munged
    refuses forged, expired and replayed credentials."""
    r = subprocess.run([_tool("unmunge"), "--numeric", *_socket_args(socket_path)], input=credential.encode(),
                       capture_output=True, timeout=timeout, check=False)
    if r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip().splitlines()
        raise PermissionDenied(why="MUNGE credential refused: " + (why[-1] if why else f"status {r.returncode}"))
    head, sep, payload = r.stdout.partition(b"\n\n")
    if not sep:
        raise PermissionDenied(why="unmunge printed no metadata")
    meta = {}
    for line in head.decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        meta[key.strip()] = value.strip()
    try:
        if int(meta.get("STATUS", "-1")) != 0:
            raise PermissionDenied(why=f"MUNGE credential status {meta.get('STATUS')}")
        return int(meta["UID"]), int(meta["GID"]), payload
    except (KeyError, ValueError):
        raise PermissionDenied(why="unmunge metadata without a numeric UID and GID") from None


def digest(frames: list[bytes]) -> str:
    h = hashlib.sha256()
    for f in frames:
        h.update(_LEN.pack(len(f)))
        h.update(f)
    return h.hexdigest()
