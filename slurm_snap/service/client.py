"""The other hosts' side of the service: forwarding a user's command and
calling a hook operation. Nothing here reads the database or its URL."""
from __future__ import annotations

import hashlib
import json
import os
import socket
import sys

from .. import errors
from . import wire
from .address import service_address

CONNECT_TIMEOUT = 10.0


def _unavailable(host: str, port: int, why: str) -> errors.ServiceUnavailable:
    return errors.ServiceUnavailable(
        why=f"cannot reach the slurm-snap service at {host}:{port} ({why}); this host has no inventory of its own: "
            "the admin must run `slurm-snap serve` on the controller (etc/README.md, \"The service\")")


def _exchange(cfg, request: dict, on_frame) -> int:
    host, port = service_address(cfg.inventory.url)
    payload = json.dumps(request, sort_keys=True).encode()
    credential = wire.encode(payload, socket_path=cfg.service.munge_socket)
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise _unavailable(host, port, exc.strerror or str(exc)) from None
    frames: list[bytes] = []
    with sock:
        try:
            wire.send(sock, {"credential": credential})
            sock.settimeout(cfg.service.timeout + 30)
            while True:
                obj, raw = wire.recv(sock)
                if "exit" in obj:
                    _check_seal(cfg, obj, frames, credential, host, port)
                    return int(obj["exit"])
                frames.append(raw)
                on_frame(obj)
        except (ConnectionError, ValueError, socket.timeout, OSError) as exc:
            raise _unavailable(host, port, f"the connection failed: {exc}") from None


def _check_seal(cfg, final: dict, frames: list[bytes], credential: str, host: str, port: int) -> None:
    """The reply is the controller's: root sealed it over this request."""
    seal = final.get("seal")
    if not isinstance(seal, str):
        raise _unavailable(host, port, "the reply was not sealed")
    try:
        uid, _gid, body = wire.decode(seal, socket_path=cfg.service.munge_socket)
        data = json.loads(body)
    except (errors.PermissionDenied, ValueError) as exc:
        raise _unavailable(host, port, f"the reply's seal was refused: {exc}") from None
    if uid != 0 or data.get("digest") != wire.digest(frames) or data.get("exit") != final.get("exit") \
            or data.get("request") != hashlib.sha256(credential.encode()).hexdigest():
        raise _unavailable(host, port, f"the reply's seal does not match (sealed by uid {uid})")


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


def call(cfg, op: str, **args):
    """A hook operation on the controller; returns its JSON result, raises
    the service's error (its exit code kept) when it failed."""
    out: dict = {}
    messages: list[str] = []

    def keep(obj):
        if "result" in obj:
            out["result"] = obj["result"]
        elif "err" in obj:
            messages.append(obj["err"].strip())

    code = _exchange(cfg, {"v": 1, "kind": "op", "op": op, "args": args}, keep)
    if code != 0:
        exc = errors.SnapError("; ".join(m.removeprefix("slurm-snap: ") for m in messages)
                               or f"service operation {op} failed")
        exc.exit_code = code
        raise exc
    return out.get("result")
