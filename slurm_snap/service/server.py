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
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import signal
import socket
import socketserver
import sys
import time
import traceback
from typing import Callable, Mapping

from .. import access, errors
from . import wire
from .address import parse_address

log = logging.getLogger(__name__)

USER_COMMANDS = ("report", "show", "snapshot", "restore-test")
MAX_REQUEST = 1 << 20


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
    def __init__(self, cfg, *, run_cli: Callable[[list[str]], int], ops: Mapping[str, Callable]):
        self.cfg = cfg
        self.run_cli = run_cli
        self.ops = ops

    # -- one connection (in its own forked child) ---------------------------------
    def handle(self, sock: socket.socket, peer) -> None:
        sock.settimeout(30)
        reply = _Reply(sock)
        credential = ""
        try:
            req_frame, _raw = wire.recv(sock, limit=MAX_REQUEST)
            credential = req_frame.get("credential")
            if not isinstance(credential, str) or not credential:
                raise errors.UsageError("request without a MUNGE credential")
            uid, gid, payload = wire.decode(credential, socket_path=self.cfg.service.munge_socket)
            try:
                req = json.loads(payload)
            except ValueError:
                raise errors.UsageError("request payload is not JSON") from None
            if not isinstance(req, dict) or req.get("v") != 1:
                raise errors.UsageError("request of an unknown version (this service speaks version 1)")
            sock.settimeout(self.cfg.service.timeout)
            if req.get("kind") == "cli":
                code = self._cli(uid, req, reply)
            elif req.get("kind") == "op":
                code = self._op(uid, req, reply)
            elif req.get("kind") == "ping":
                # doctor on a node or login host: authenticated, answers who it saw.
                reply.frame({"result": {"uid": uid}})
                code = 0
            else:
                raise errors.UsageError(f"unknown request kind {req.get('kind')!r}")
        except errors.SnapError as exc:
            log.warning("request from %s refused: %s", peer, exc)
            code = exc.exit_code
            self._safe(reply, {"err": f"slurm-snap: {exc}\n"})
        except (ConnectionError, ValueError, socket.timeout) as exc:
            log.warning("request from %s: %s", peer, exc)
            return
        self._seal(reply, credential, code)

    def _cli(self, uid: int, req: dict, reply: _Reply) -> int:
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise errors.UsageError("request without a command")
        if argv[0] not in USER_COMMANDS:
            raise errors.UsageError(f"{argv[0]!r} is not run through the service (it runs {', '.join(USER_COMMANDS)}"
                                    "; everything else runs on the controller)")
        if any(a == "--config" or a.startswith("--config=") for a in argv):
            raise errors.UsageError("--config names a file of the client's host: the service uses its own")
        tz = req.get("tz", "")
        if isinstance(tz, str) and tz and len(tz) < 256 and tz.isprintable():
            os.environ["TZ"] = tz          # times print in the user's zone, as they would locally
            time.tzset()
        access.act_for(access.Caller(uid=uid, name=access.user_name(uid)))
        out, err = _Frames(reply, "out"), _Frames(reply, "err")
        sys.stdout, sys.stderr = out, err
        # The server's log handler is not the user's stderr.
        logging.root.handlers = []
        try:
            return self.run_cli(["--config", self.cfg.path, *argv])
        except BaseException:  # a bug: the user sees one line, the server log the traceback
            sys.__stderr__.write(traceback.format_exc())
            err.write("slurm-snap: internal error in the service (see its log on the controller)\n")
            return errors.INTERNAL
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__

    def _op(self, uid: int, req: dict, reply: _Reply) -> int:
        if uid != 0:
            raise errors.PermissionDenied(why=f"hook operations are root's (the hooks run as root); uid {uid} asked")
        name, args = req.get("op"), req.get("args")
        fn = self.ops.get(name) if isinstance(name, str) else None
        if fn is None or not isinstance(args, dict):
            raise errors.UsageError(f"unknown hook operation {name!r}")
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


class _Server(socketserver.ForkingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    # A burst of Epilogs of a large job: queue them, do not refuse them.
    request_queue_size = 256
    max_children = 64
    service: Service

    def finish_request(self, request, client_address):
        self.service.handle(request, client_address)


def serve(cfg, *, listen: str, pidfile: str | None, run_cli, ops) -> None:
    host, port = parse_address(listen, what="--listen")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(_Server):
        address_family = family

    srv = Server((host, port), None, bind_and_activate=True)
    srv.service = Service(cfg, run_cli=run_cli, ops=ops)
    # Every request runs in a forked child: import the ORM once here, not in
    # each child. Each child importing it cost ~0.5 s of CPU, which a burst of
    # preempted jobs' Epilogs (3 requests each) turned into hooks that ran out
    # of budget on a 2-core controller. Modules only: no engine crosses a fork.
    from ..inventory import repository  # noqa: F401
    if pidfile:
        from ..fsio import atomic_write

        atomic_write(pidfile, f"{os.getpid()}\n".encode(), mode=0o644)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    log.warning("slurm-snap service listening on %s:%d (pid %d)", host, port, os.getpid())
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
        if pidfile:
            try:
                os.unlink(pidfile)
            except OSError:
                pass
