"""A node-local part from one node's agent to another's: the source's tool's
stdout into the target's tool's stdin over one TCP connection between the
two nodes, each end root on its own node, authenticated with MUNGE.

    receiving agent                              sending agent
    listen on its address, tell the service
                                  <- connect ---
                                  <- {"credential": root's, payload {token, role: "sender", to: NODE}}
    check: uid 0, the task's token, role, its own node name
    {"credential": root's, payload {token, role: "receiver", node}} ->
                                                 check the same
                                  <- the stream (btrfs send [-p], or tar) in chunks,
                                     each its 4-byte length first; length 0 once
                                     the sending tool exited 0
    btrfs receive (or tar into a partial, then rename); a stream that ends
    without its last chunk is broken; check the copy is whole
    {"ok": true | false, "error"} ->

Nothing runs through a shell: each end starts its backend's argv through
LocalTransport.open (as backends/transfer.py does through the controller).
The token comes from the service in sealed replies and binds a credential
to this one transfer; munged refuses a credential replayed or older than
its TTL. The bytes travel in clear, as a shared filesystem's do (SECURITY.md).
A receiver that hears from no valid sender within its wait fails its task;
a connection that does not authenticate is closed and the wait goes on.
"""
from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import dataclass

from .. import errors
from ..backends.base import Backend, SnapshotRef
from ..service import wire

CHUNK = 1 << 20
HANDSHAKE_TIMEOUT = 15.0
_LEN = struct.Struct(">I")


@dataclass(frozen=True)
class Moved:
    method: str        # send, send-incremental, copy, present
    bytes: int
    seconds: float


def method_of(backend: Backend) -> str:
    """The same class's backend at both ends: send when it can, else copy."""
    if backend.capabilities.can_send:
        return "send"
    if backend.capabilities.can_copy:
        return "copy"
    raise errors.Unsupported(backend=backend.name, verb="a transfer between nodes")


def own_address(service_host: str) -> str:
    """The address this node reaches the service from: the one its peer can reach it at."""
    family = socket.AF_INET6 if ":" in service_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((service_host, 9))   # no packet is sent: this only picks the route
        return s.getsockname()[0]


def _credential(payload: dict, munge_socket: str) -> dict:
    return {"credential": wire.encode(json.dumps(payload, sort_keys=True).encode(), socket_path=munge_socket)}


def _check(frame: dict, *, token: str, role: str, munge_socket: str) -> dict:
    cred = frame.get("credential")
    if not isinstance(cred, str):
        raise errors.PermissionDenied(why="the peer sent no MUNGE credential")
    uid, _gid, raw = wire.decode(cred, socket_path=munge_socket)
    try:
        payload = json.loads(raw)
    except ValueError:
        raise errors.PermissionDenied(why="the peer's credential carries no JSON") from None
    if uid != 0:
        raise errors.PermissionDenied(why=f"the peer's credential is uid {uid}'s, not root's")
    if not isinstance(payload, dict) or payload.get("token") != token or payload.get("role") != role:
        raise errors.PermissionDenied(why="the peer's credential is not for this transfer")
    return payload


IDLE_EVERY = 1.0


def receive(backend: Backend, ref: SnapshotRef, *, node: str, token: str, address: str, munge_socket: str,
            on_listening, wait: float, timeout: float, idle=None) -> Moved:
    """Listen at `address` (host), tell `on_listening("host:port")`, take the
    part from the first sender that proves itself within `wait` seconds, and
    make it exist here (at its original's path). Idempotent: a complete copy
    already here is "present". `idle()` is called about every second while
    nobody came: the agent sends what others wait for meanwhile (two nodes
    receiving from each other would otherwise wait for each other)."""
    if backend.exists(ref):
        return Moved("present", 0, 0.0)
    method = method_of(backend)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as lsock:
        lsock.bind((address, 0))
        lsock.listen(4)
        port = lsock.getsockname()[1]
        on_listening(f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}")
        end = time.monotonic() + wait
        refused = []
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise errors.Timeout(what="a sender for the transfer" + (f" (refused: {'; '.join(refused[-3:])})"
                                                                         if refused else ""), seconds=wait)
            lsock.settimeout(min(left, IDLE_EVERY) if idle is not None else left)
            try:
                conn, peer = lsock.accept()
            except socket.timeout:
                if idle is not None:
                    idle()
                continue
            with conn:
                conn.settimeout(HANDSHAKE_TIMEOUT)
                try:
                    frame, _ = wire.recv(conn, limit=1 << 16)
                    _check(frame, token=token, role="sender", munge_socket=munge_socket)
                    wire.send(conn, _credential({"token": token, "role": "receiver", "node": node}, munge_socket))
                except (errors.SnapError, ValueError, OSError) as exc:
                    refused.append(f"{peer[0]}: {exc}")
                    continue
                return _take(backend, ref, method, conn, timeout)


def _take(backend: Backend, ref: SnapshotRef, method: str, conn: socket.socket, timeout: float) -> Moved:
    t0 = time.monotonic()
    argv = backend.receive_argv(ref) if method == "send" else backend.copy_in_argv(ref)
    sink = backend.transport.open(argv, timeout, reads=False, writes=True)
    moved, error = 0, ""
    try:
        conn.settimeout(timeout)
        try:
            while True:
                (n,) = _LEN.unpack(wire.read_exact(conn, _LEN.size))
                if n == 0:
                    break   # the sender's tool finished well: the whole stream is here
                if n > CHUNK:
                    raise ValueError(f"a chunk of {n} bytes (at most {CHUNK})")
                sink.write(wire.read_exact(conn, n))
                moved += n
        except (OSError, ValueError, errors.SnapError) as exc:
            error = f"stream broken after {moved} bytes: {exc}"
            sink.kill()
        sink.close_input()
        res = sink.wait(max(1.0, timeout - (time.monotonic() - t0)))
        if not error and res.status != 0:
            lines = [ln.strip() for ln in res.stderr.decode(errors="replace").splitlines() if ln.strip()]
            error = f"{' '.join(argv[:2])} exited with {res.status}: {' / '.join(lines)[:1000] or '(no stderr)'}"
        if not error and method == "copy":
            backend.finish_copy_in(ref)
        if not error and not backend.exists(ref):
            error = f"{ref.ref} is not complete after the transfer"
    except BaseException as exc:
        error = error or f"{type(exc).__name__}: {exc}"
    if error:
        try:
            backend.discard_partial(ref)
        except errors.SnapError:
            pass
    try:
        wire.send(conn, {"ok": not error, "error": error})
    except OSError:
        pass
    if error:
        raise errors.BackendError(backend=backend.name, why=error)
    return Moved(method, moved, time.monotonic() - t0)


def send(backend: Backend, ref: SnapshotRef, *, address: str, token: str, to_node: str, munge_socket: str,
         parent: SnapshotRef | None, timeout: float) -> Moved:
    """Stream the part to the receiver listening at `address` ("host:port"),
    once it has proven itself root and this transfer's receiver."""
    t0 = time.monotonic()
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise errors.BadValueError(what="receiver address", value=address, why="expected host:port")
    method = method_of(backend)
    with socket.create_connection((host, int(port)), timeout=HANDSHAKE_TIMEOUT) as conn:
        wire.send(conn, _credential({"token": token, "role": "sender", "to": to_node}, munge_socket))
        frame, _ = wire.recv(conn, limit=1 << 16)
        peer = _check(frame, token=token, role="receiver", munge_socket=munge_socket)
        if peer.get("node") != to_node:
            raise errors.PermissionDenied(why=f"the receiver says it is {peer.get('node')!r}, not {to_node}")
        argv = backend.send_argv(ref, parent) if method == "send" else backend.copy_out_argv(ref)
        src = backend.transport.open(argv, timeout, reads=True, writes=False)
        moved = 0
        try:
            conn.settimeout(timeout)
            try:
                while True:
                    chunk = src.read(CHUNK)
                    if not chunk:
                        break
                    conn.sendall(_LEN.pack(len(chunk)) + chunk)
                    moved += len(chunk)
                res = src.wait(max(1.0, timeout - (time.monotonic() - t0)))
                if res.status == 0:
                    conn.sendall(_LEN.pack(0))      # the end: only once the tool said the stream is whole
                conn.shutdown(socket.SHUT_WR)
            except OSError as exc:
                # The receiver stopped taking it: its word says why, if it got one out.
                src.kill()
                verdict = _last_word(conn)
                raise errors.BackendError(backend=backend.name, why=f"the receiver on {to_node}: "
                                          + (verdict.get("error") or f"stream broken after {moved} bytes: {exc}"))
            verdict, _ = wire.recv(conn, limit=1 << 16)
        except BaseException:
            src.kill()
            raise
        if res.status != 0:
            lines = [ln.strip() for ln in res.stderr.decode(errors="replace").splitlines() if ln.strip()]
            raise errors.CommandFailed(argv0=" ".join(argv[:2]), status=res.status,
                                       stderr=" / ".join(lines)[:1000] or "(no stderr)")
        if not verdict.get("ok"):
            raise errors.BackendError(backend=backend.name, why=f"the receiver on {to_node}: {verdict.get('error')}")
    label = "send-incremental" if method == "send" and parent is not None else method
    return Moved(label, moved, time.monotonic() - t0)


def _last_word(conn: socket.socket) -> dict:
    try:
        conn.settimeout(2.0)
        return wire.recv(conn, limit=1 << 16)[0]
    except (OSError, ValueError):
        return {}
