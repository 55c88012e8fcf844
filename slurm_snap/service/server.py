"""`slurm-snap serve`: the controller's side of the service.

One forked child per connection: a request's command runs with the
controller's configuration and inventory but as the caller MUNGE vouched
for, exactly as if that user had run it on the controller (the job owner or
an operator may act on a job, nobody else), and a crash or a slow drill
touches no other request. What may be asked:

  kind "cli"  one of USER_COMMANDS with its arguments, any user; the
              command's stdout and stderr come back as they are written
  kind "op"   one of the hook operations (a node's Epilog recording its
              share of a preemption set, the requeued run's resume point,
              a hook's failure, a drill job's Prolog and Epilog asking for
              and reporting on their node's clones), root only: the hooks
              run as root
  kind "ping" who MUNGE said the caller is (doctor's check)

What bounds a request ([service] in the configuration): its first frame
at most MAX_REQUEST bytes, whole within request_timeout seconds (a
slow-loris client is cut off then); at most max_connections served at once
(one more is refused as busy by the parent before any work, and the client
tries again) and max_per_user of one non-root uid; each runs at most
`timeout` seconds, then it is ended and the client told. Every refusal is a
line in the service's log naming the peer (and the uid once MUNGE said it).

Between requests the server runs its sweeper (`sweep`, given by `slurm-snap
serve`: sets left in flight past their deadline, drills left RUNNING) every
[service] sweep_every seconds, in a forked child like a request, so no set
waits for a person and a slow database never stalls the accept loop.

Length: one file for the service's one loop: the request's bounds, its
dispatch and its sealed reply share the per-connection state they guard.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import signal
import socket
import socketserver
import sys
import tempfile
import time
import traceback
from typing import Callable, Mapping

from .. import access, errors
from . import USER_COMMANDS, USER_ENVIRONMENT, wire
from .address import parse_address

log = logging.getLogger(__name__)

MAX_ENV_VALUE = 4096
KINDS = ("cli", "op", "ping")
# A request is one MUNGE credential; the largest slurm-snap sends (a
# preemption set's record for a node) is a few KiB.
MAX_REQUEST = 1 << 20
# How long the parent spends on a busy refusal at most (sending it, then
# reading what the client sent until the client closes).
BUSY_SEND_TIMEOUT = 0.5


class _Deadline(BaseException):
    """The request ran past [service] timeout. A BaseException: the command's
    own `except Exception` must not swallow it."""


def _peer(addr) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"[{addr[0]}]:{addr[1]}" if ":" in str(addr[0]) else f"{addr[0]}:{addr[1]}"
    return str(addr)


def parse_request(payload: bytes) -> dict:
    """A credential's payload as a request of this version, or UsageError
    saying what is wrong with it; the kind's own fields are checked too."""
    try:
        req = json.loads(payload)
    except RecursionError:
        raise errors.UsageError("request payload nested too deeply") from None
    except ValueError:
        raise errors.UsageError("request payload is not JSON") from None
    if not isinstance(req, dict) or type(req.get("v")) is not int or req["v"] != 1:
        raise errors.UsageError("request of an unknown version (this service speaks version 1)")
    kind = req.get("kind")
    if kind not in KINDS:
        raise errors.UsageError(f"unknown request kind {str(kind)[:64]!r}")
    if kind == "cli":
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise errors.UsageError("request without a command")
    if kind == "op" and (not isinstance(req.get("op"), str) or not isinstance(req.get("args"), dict)):
        raise errors.UsageError(f"unknown hook operation {str(req.get('op'))[:64]!r}")
    return req


class _UserSlots:
    """At most `limit` requests of one uid at once, across the forked
    children: a child holds an flock on one of the uid's slot files for as
    long as it serves, and the kernel lets go when it exits, however it ends."""

    def __init__(self, directory: str, limit: int):
        self.directory, self.limit = directory, limit
        self._held: int | None = None

    def take(self, uid: int) -> bool:
        import fcntl

        for i in range(self.limit):
            fd = os.open(os.path.join(self.directory, f"{uid}.{i}"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held = fd
            return True
        return False

    def release(self) -> None:
        """Before the reply's seal: a client sends its next request as soon
        as it has the seal, and this child may not have exited by then (a
        user at the limit was refused 4 times in 64 back-to-back reports)."""
        if self._held is not None:
            os.close(self._held)
            self._held = None


class _Frames(io.TextIOBase):
    """A text stream whose writes go to the client as frames of one kind."""

    def __init__(self, sink: "_Reply", kind: str):
        self._sink, self._kind = sink, kind

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        # click checks it before writing text; without one it writes bytes.
        return "utf-8"

    def write(self, s) -> int:
        if isinstance(s, (bytes, bytearray)):
            s = bytes(s).decode("utf-8", errors="replace")
        if s:
            self._sink.frame({self._kind: s})
        return len(s)

    def isatty(self) -> bool:
        return False


class _Reply:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sent: list[bytes] = []

    def frame(self, obj) -> None:
        self.sent.append(wire.send(self.sock, obj))


class Service:
    def __init__(self, cfg, *, run_cli: Callable[[list[str]], int], ops: Mapping[str, Callable],
                 slots_dir: str | None = None):
        self.cfg = cfg
        self.run_cli = run_cli
        self.ops = ops
        self.slots = _UserSlots(slots_dir, cfg.service.max_per_user) if slots_dir else None

    # -- one connection (in its own forked child) ---------------------------------
    def handle(self, sock: socket.socket, peer) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)   # the parent's flag is not this child's
        where = _peer(peer)
        reply = _Reply(sock)
        credential, code, uid = "", errors.INTERNAL, None
        try:
            try:
                req_frame, _raw = wire.recv(sock, limit=MAX_REQUEST, timeout=self.cfg.service.request_timeout)
            except wire.FrameTimeout as exc:
                log.warning("refused %s: %s within %g s (request_timeout)", where, exc,
                            self.cfg.service.request_timeout)
                return
            except (wire.FrameError, ConnectionError, OSError) as exc:
                log.warning("refused %s: %s", where, exc)
                return
            credential = req_frame.get("credential")
            if not isinstance(credential, str) or not credential:
                credential = ""
                raise errors.UsageError("request without a MUNGE credential")
            uid, gid, payload = wire.decode(credential, socket_path=self.cfg.service.munge_socket)
            where = f"{where} (uid {uid})"
            req = parse_request(payload)
            if uid != 0 and self.slots is not None and not self.slots.take(uid):
                raise errors.ServiceUnavailable(
                    why=f"uid {uid} already has {self.cfg.service.max_per_user} request(s) in progress at the "
                        "slurm-snap service (service.max_per_user); try again when one has finished")
            sock.settimeout(self.cfg.service.timeout)
            signal.signal(signal.SIGALRM, _on_deadline)
            signal.alarm(max(1, math.ceil(self.cfg.service.timeout)))
            try:
                if req["kind"] == "cli":
                    code = self._cli(uid, req, reply)
                elif req["kind"] == "op":
                    code = self._op(uid, req, reply)
                else:
                    # doctor on a node or login host: authenticated, answers who it saw.
                    reply.frame({"result": {"uid": uid}})
                    code = 0
            finally:
                signal.alarm(0)
        except _Deadline:
            log.warning("ended the request of %s: it ran past %g s (service.timeout)", where,
                        self.cfg.service.timeout)
            code = errors.TIMEOUT
            self._safe(reply, {"err": "slurm-snap: the service ended this request after "
                                      f"{self.cfg.service.timeout:g} s (its [service] timeout)\n"})
        except errors.SnapError as exc:
            log.warning("refused %s: %s", where, exc)
            code = exc.exit_code
            self._safe(reply, {"err": f"slurm-snap: {exc}\n"})
        except (ConnectionError, ValueError, socket.timeout, OSError) as exc:
            log.warning("request of %s: %s", where, exc)
            return
        if self.slots is not None:
            self.slots.release()
        self._seal(reply, credential, code)

    def refuse_busy(self, sock: socket.socket, peer, active: int) -> None:
        """In the parent, before any work: the client tries again."""
        log.warning("refused %s: busy, %d requests in progress (service.max_connections)", _peer(peer), active)
        try:
            sock.settimeout(BUSY_SEND_TIMEOUT)
            wire.send(sock, {"busy": f"the slurm-snap service is serving {active} requests "
                                     "(service.max_connections)"})
            # Closing with the request unread would send a reset, which can
            # reach the client before the refusal does: read it, briefly.
            sock.shutdown(socket.SHUT_WR)
            deadline, got = time.monotonic() + BUSY_SEND_TIMEOUT, 0
            while got <= MAX_REQUEST and time.monotonic() < deadline:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                got += len(chunk)
        except OSError:
            pass

    def _cli(self, uid: int, req: dict, reply: _Reply) -> int:
        argv = req["argv"]
        if argv[0] not in USER_COMMANDS:
            raise errors.UsageError(f"{argv[0][:64]!r} is not run through the service (it runs "
                                    f"{', '.join(USER_COMMANDS)}; everything else runs on the controller)")
        if any(a == "--config" or a.startswith("--config=") for a in argv):
            raise errors.UsageError("--config names a file of the client's host: the service uses its own")
        _adopt_environment(req)
        access.act_for(access.Caller(uid=uid, name=access.user_name(uid)))
        out, err = _Frames(reply, "out"), _Frames(reply, "err")
        sys.stdout, sys.stderr = out, err
        # The server's log handler is not the user's stderr.
        logging.root.handlers = []
        try:
            return self.run_cli(["--config", self.cfg.path, *argv])
        except _Deadline:
            raise
        except BaseException:  # a bug: the user sees one line, the server log the traceback
            sys.__stderr__.write(traceback.format_exc())
            err.write("slurm-snap: internal error in the service (see its log on the controller)\n")
            return errors.INTERNAL
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__

    def _op(self, uid: int, req: dict, reply: _Reply) -> int:
        if uid != 0:
            raise errors.PermissionDenied(why=f"hook operations are root's (the hooks run as root); uid {uid} asked")
        name, args = req["op"], req["args"]
        fn = self.ops.get(name)
        if fn is None:
            raise errors.UsageError(f"unknown hook operation {name[:64]!r}")
        try:
            result = fn(self.cfg, **args)
        except errors.SnapError:
            raise
        except Exception:
            log.error("operation %s failed:\n%s", name, traceback.format_exc())
            reply.frame({"err": f"slurm-snap: internal error in the service's {name} (see its log)\n"})
            return errors.INTERNAL
        reply.frame({"result": result})
        return 0

    def _safe(self, reply: _Reply, obj) -> None:
        try:
            reply.frame(obj)
        except OSError:
            pass

    def _seal(self, reply: _Reply, credential: str, code: int) -> None:
        """The last frame: the exit code and root's credential over the digest
        of the request and every frame, so the client knows who answered."""
        body = json.dumps({"exit": code, "digest": wire.digest(reply.sent),
                           "request": hashlib.sha256(credential.encode()).hexdigest()}, sort_keys=True)
        try:
            seal = wire.encode(body.encode(), socket_path=self.cfg.service.munge_socket)
            reply.frame({"exit": code, "seal": seal})
        except (errors.SnapError, OSError) as exc:
            log.error("could not seal the reply: %s", exc)


def _adopt_environment(req: dict) -> None:
    """The user's USER_ENVIRONMENT in this (forked, one-request) child: times
    print in the user's zone and report takes the user's columns, as they
    would locally. A value that is not a short printable string is dropped."""
    sent = req.get("env")
    if not isinstance(sent, dict):
        sent = {"TZ": req.get("tz", "")}     # a client from before "env" sends only its zone
    for name in USER_ENVIRONMENT:
        value = sent.get(name)
        if isinstance(value, str) and value and len(value) < MAX_ENV_VALUE and value.isprintable():
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
    time.tzset()


def _on_deadline(signum, frame):
    raise _Deadline()


class _Server(socketserver.ForkingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    # A burst of Epilogs of a large job waits in the kernel's queue while the
    # parent accepts; the parent refuses (busy) only past max_connections.
    request_queue_size = 256
    # socketserver's own bound blocks the parent in waitpid until a child
    # ends, so nothing is accepted or refused meanwhile: ours refuses instead.
    max_children = 1 << 30
    service: Service
    sweep: Callable | None = None
    sweep_every: float = 15.0
    _next_sweep: float = 0.0
    _sweeper: int | None = None

    def process_request(self, request, client_address):
        self.collect_children()
        active = len(self.active_children or ())
        if active >= self.service.cfg.service.max_connections:
            self.service.refuse_busy(request, client_address, active)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def finish_request(self, request, client_address):
        self.service.handle(request, client_address)

    def service_actions(self):
        """Between requests (serve_forever's poll): reap children, and start
        the sweeper when it is due and the last one has ended."""
        super().service_actions()
        if self.sweep is None:
            return
        if self._sweeper is not None:
            try:
                pid, _status = os.waitpid(self._sweeper, os.WNOHANG)
            except ChildProcessError:
                pid = self._sweeper   # reaped with the request children
            if pid == 0:
                return
            self._sweeper = None
        now = time.monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_every
        pid = os.fork()
        if pid:
            self._sweeper = pid
            return
        status = 1
        try:
            # The child must not take the listening socket's requests.
            self.socket.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            for line in self.sweep(self.service.cfg):
                log.warning("sweeper: %s", line)
            status = 0
        except BaseException:  # noqa: BLE001 - the next sweep tries again
            log.error("sweeper failed:\n%s", traceback.format_exc())
        finally:
            os._exit(status)


def serve(cfg, *, listen: str, pidfile: str | None, run_cli, ops, sweep: Callable | None = None) -> None:
    """`sweep(cfg) -> lines` runs every [service] sweep_every seconds in a
    forked child (None: never)."""
    host, port = parse_address(listen, what="--listen")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(_Server):
        address_family = family

    srv = Server((host, port), None, bind_and_activate=True)
    # The per-user slots: root's, gone with the service.
    slots = tempfile.mkdtemp(prefix="slurm-snap-serve-")
    srv.service = Service(cfg, run_cli=run_cli, ops=ops, slots_dir=slots)
    srv.sweep, srv.sweep_every = sweep, cfg.service.sweep_every
    # Every request runs in a forked child: import the ORM once here, not in
    # each child. Each child importing it cost ~0.5 s of CPU, which a burst of
    # preempted jobs' Epilogs (3 requests each) turned into hooks that ran out
    # of budget on a 2-core controller. Modules only: no engine crosses a fork.
    from ..inventory import repository  # noqa: F401
    if pidfile:
        from ..fsio import atomic_write

        atomic_write(pidfile, f"{os.getpid()}\n".encode(), mode=0o644)

    # A flag, not an exception: raised from the handler, it could land in
    # logging's fork hook ("Exception ignored in _releaseLock") and the
    # service went on serving after SIGTERM (seen in a test's teardown).
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    srv.timeout = 0.5
    log.warning("slurm-snap service listening on %s:%d (pid %d)", host, port, os.getpid())
    try:
        while not stopping:
            srv.handle_request()
    except KeyboardInterrupt:
        pass
    finally:
        if srv._sweeper is not None:
            try:
                os.kill(srv._sweeper, signal.SIGTERM)
            except ProcessLookupError:
                pass
        srv.server_close()
        import shutil

        shutil.rmtree(slots, ignore_errors=True)
        if pidfile:
            try:
                os.unlink(pidfile)
            except OSError:
                pass
