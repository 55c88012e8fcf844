"""The other hosts' side of the service: forwarding a user's command and
calling a hook operation. Nothing here reads the database or its URL."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import sys
import time

from .. import errors
from . import wire
from .address import service_address

# What an admin can check, by what the connection said. Only what is known
# is said: a refused connection means nothing listens there; a timeout only
# that no answer came (a cut network, a firewall dropping packets, or a
# controller too loaded to accept), never a guess at which.
_CHECK = {
    "refused": "nothing listens there: is `slurm-snap serve` running on {host} (systemctl status "
               "slurm-snap-serve), and does its [service] listen name port {port}?",
    "timeout": "check the network path from this host to {host} (ping {host}; a firewall dropping port "
               "{port}), and whether the service on {host} is overloaded (its log)",
    "unreachable": "this host has no route to {host}: check its network link and routes",
    "name": "{host} does not resolve here: check [inventory] url and this host's resolver",
    "reset": "the service on {host} closed the connection: its log says why (a restart, a crash, or a "
             "request it refused)",
}


def _unavailable(host: str, port: int, what: str, kind: str) -> errors.ServiceUnavailable:
    check = _CHECK[kind].format(host=host, port=port)
    return errors.ServiceUnavailable(why=f"cannot reach the slurm-snap service at {host}:{port}: {what} ({check})",
                                     host=host, port=port, cause=kind)


def _kind(exc: OSError) -> str:
    if isinstance(exc, socket.timeout) or exc.errno == errno.ETIMEDOUT:
        return "timeout"
    if isinstance(exc, socket.gaierror):
        return "name"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.EHOSTDOWN):
        return "unreachable"
    return "reset"


def _exchange(cfg, request: dict, on_frame, *, reply_timeout: float | None = None) -> int:
    host, port = service_address(cfg.inventory.url)
    payload = json.dumps(request, sort_keys=True).encode()
    credential = wire.encode(payload, socket_path=cfg.service.munge_socket)
    connect = cfg.service.connect_timeout
    t0 = time.monotonic()
    try:
        sock = socket.create_connection((host, port), timeout=connect)
    except OSError as exc:
        kind = _kind(exc)
        what = f"timed out after {connect:g} s" if kind == "timeout" else (exc.strerror or str(exc)).lower()
        raise _unavailable(host, port, what, kind) from None
    frames: list[bytes] = []
    wait = cfg.service.timeout + 30 if reply_timeout is None else reply_timeout
    with sock:
        try:
            wire.send(sock, {"credential": credential})
            sock.settimeout(wait)
            while True:
                obj, raw = wire.recv(sock)
                if "exit" in obj:
                    _check_seal(cfg, obj, frames, credential, host, port)
                    return int(obj["exit"])
                frames.append(raw)
                on_frame(obj)
        except socket.timeout:
            raise _unavailable(host, port, f"connected, then no answer within {wait:g} s", "timeout") from None
        except (ConnectionError, OSError) as exc:
            took = time.monotonic() - t0
            raise _unavailable(host, port, f"the connection failed after {took:.1f} s: {exc}", _kind(exc)) from None
        except ValueError as exc:
            raise _unavailable(host, port, f"the answer was not understood: {exc}", "reset") from None


def _check_seal(cfg, final: dict, frames: list[bytes], credential: str, host: str, port: int) -> None:
    """The reply is the controller's: root sealed it over this request."""
    seal = final.get("seal")
    if not isinstance(seal, str):
        raise _unsealed(host, port, "the reply was not sealed")
    try:
        uid, _gid, body = wire.decode(seal, socket_path=cfg.service.munge_socket)
        data = json.loads(body)
    except (errors.PermissionDenied, ValueError) as exc:
        raise _unsealed(host, port, f"the reply's seal was refused: {exc}") from None
    if uid != 0 or data.get("digest") != wire.digest(frames) or data.get("exit") != final.get("exit") \
            or data.get("request") != hashlib.sha256(credential.encode()).hexdigest():
        raise _unsealed(host, port, f"the reply's seal does not match (sealed by uid {uid})")


def _unsealed(host: str, port: int, why: str) -> errors.ServiceUnavailable:
    return errors.ServiceUnavailable(why=f"the slurm-snap service at {host}:{port} answered, but {why}: this host "
                                         "does not trust the answer (check that munged on both hosts shares one "
                                         "key)", host=host, port=port, cause="seal")


def forward(cfg, argv: list[str]) -> int:
    """Run a user's command on the controller, as this user; its output is
    written here as it comes. Returns the command's exit status."""
    def show(obj):
        if "out" in obj:
            sys.stdout.write(obj["out"])
            sys.stdout.flush()
        elif "err" in obj:
            sys.stderr.write(obj["err"])
            sys.stderr.flush()

    from .server import USER_ENVIRONMENT

    env = {name: os.environ[name] for name in USER_ENVIRONMENT if name in os.environ}
    # "tz" too, for a service older than "env".
    request = {"v": 1, "kind": "cli", "argv": list(argv), "env": env, "tz": env.get("TZ", "")}
    return _exchange(cfg, request, show)


def ping(cfg) -> int:
    """The uid the service saw for this process (doctor's reachability check)."""
    out: dict = {}
    code = _exchange(cfg, {"v": 1, "kind": "ping"}, lambda obj: out.update(obj))
    if code != 0 or not isinstance(out.get("result"), dict):
        raise errors.ServiceUnavailable(why=f"the slurm-snap service answered the check with status {code}")
    return int(out["result"]["uid"])


def call(cfg, op: str, *, reply_timeout: float | None = None, **args):
    """A hook operation on the controller; returns its JSON result, raises
    the service's error (its exit code kept) when it failed. `reply_timeout`
    bounds the wait for the answer once connected (a hook passes what is
    left of its budget; default: [service] timeout)."""
    out: dict = {}
    messages: list[str] = []

    def keep(obj):
        if "result" in obj:
            out["result"] = obj["result"]
        elif "err" in obj:
            messages.append(obj["err"].strip())

    code = _exchange(cfg, {"v": 1, "kind": "op", "op": op, "args": args}, keep, reply_timeout=reply_timeout)
    if code != 0:
        exc = errors.SnapError("; ".join(m.removeprefix("slurm-snap: ") for m in messages)
                               or f"service operation {op} failed")
        exc.exit_code = code
        raise exc
    return out.get("result")
