"""The other hosts' side of the service: forwarding a user's command and
calling a hook operation. Nothing here reads the database or its URL."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import socket
import sys
import time

from .. import errors
from . import USER_ENVIRONMENT, wire
from .address import service_address

# A busy service (service.max_connections) is asked again, with growing
# pauses, for this long (never past the caller's own wait: a hook's budget):
# the Epilogs of a large job arrive at once.
BUSY_RETRY_FOR = 30.0
# A ping is answered at once; a port that accepts and stays silent is not the service.
PING_TIMEOUT = 10.0
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
    "busy": "the service on {host} is serving its [service] max_connections at once; its log names the "
            "refusals",
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


def _exchange(cfg, request: dict, on_frame, address: tuple[str, int] | None = None,
              reply_timeout: float | None = None) -> int:
    host, port = address or service_address(cfg.inventory.url)
    payload = json.dumps(request, sort_keys=True).encode()
    credential = wire.encode(payload, socket_path=cfg.service.munge_socket)
    connect = cfg.service.connect_timeout
    wait = cfg.service.timeout + 30 if reply_timeout is None else reply_timeout
    t0 = time.monotonic()
    give_up, pause = t0 + min(BUSY_RETRY_FOR, wait), 0.1
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=connect)
        except OSError as exc:
            kind = _kind(exc)
            what = f"timed out after {connect:g} s" if kind == "timeout" else (exc.strerror or str(exc)).lower()
            raise _unavailable(host, port, what, kind) from None
        with sock:
            try:
                wire.send(sock, {"credential": credential})
                sock.settimeout(wait)
                outcome = receive(sock, on_frame)
            except socket.timeout:
                raise _unavailable(host, port, f"connected, then no answer within {wait:g} s", "timeout") from None
            except (ConnectionError, OSError) as exc:
                took = time.monotonic() - t0
                raise _unavailable(host, port, f"the connection failed after {took:.1f} s: {exc}",
                                   _kind(exc)) from None
            except ValueError as exc:
                raise _unavailable(host, port, f"the answer was not understood: {exc}", "reset") from None
        if isinstance(outcome, Busy):
            # Refused before MUNGE read the credential: the same one serves again.
            if time.monotonic() + pause > give_up:
                raise _unavailable(host, port, f"{outcome.why}; still busy after {time.monotonic() - t0:.0f} s",
                                   "busy")
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 2.0)
            continue
        final, frames = outcome
        _check_seal(cfg, final, frames, credential, host, port)
        return int(final["exit"])


class Busy:
    """The service refused before any work (service.max_connections)."""

    def __init__(self, why: str):
        self.why = why


def receive(sock, on_frame) -> "Busy | tuple[dict, list[bytes]]":
    """A reply's frames, each handed to `on_frame` as it comes: a busy
    refusal, or (the final frame, every frame before it as sent). A frame of
    another shape is a wire.FrameError: the stream is not a service's."""
    frames: list[bytes] = []
    while True:
        obj, raw = wire.recv(sock)
        if not frames and set(obj) == {"busy"} and isinstance(obj["busy"], str):
            return Busy(obj["busy"][:500])
        if "exit" in obj:
            if set(obj) != {"exit", "seal"} or type(obj["exit"]) is not int or not isinstance(obj["seal"], str):
                raise wire.FrameError("the reply's last frame is not {exit, seal}")
            return obj, frames
        if len(obj) != 1 or not (isinstance(obj.get("out"), str) or isinstance(obj.get("err"), str)
                                 or "result" in obj):
            raise wire.FrameError(f"a reply frame of an unknown shape ({', '.join(sorted(obj))[:100]})")
        frames.append(raw)
        on_frame(obj)


def _check_seal(cfg, final: dict, frames: list[bytes], credential: str, host: str, port: int) -> None:
    """The reply is the controller's: root sealed it over this request."""
    try:
        uid, _gid, body = wire.decode(final["seal"], socket_path=cfg.service.munge_socket)
        data = json.loads(body)
    except (errors.PermissionDenied, ValueError) as exc:
        raise _unsealed(host, port, f"the reply's seal was refused: {exc}") from None
    if uid != 0 or not isinstance(data, dict) or data.get("digest") != wire.digest(frames) \
            or data.get("exit") != final["exit"] \
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

    env = {name: os.environ[name] for name in USER_ENVIRONMENT if name in os.environ}
    # "tz" too, for a service older than "env".
    request = {"v": 1, "kind": "cli", "argv": list(argv), "env": env, "tz": env.get("TZ", "")}
    return _exchange(cfg, request, show)


def ping(cfg, address: tuple[str, int] | None = None) -> int:
    """The uid the service saw for this process (doctor's reachability check);
    `address`: the service there instead of the one the inventory URL names."""
    out: dict = {}
    code = _exchange(cfg, {"v": 1, "kind": "ping"}, lambda obj: out.update(obj), address, reply_timeout=PING_TIMEOUT)
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
