"""Processes of a Python script started from a server that has imported
torch already: what the PyTorch tests (test_lockstep.py,
test_example_train.py) start their ranks with.

Importing torch costs ~2.3 s of CPU in every process (torch._C, _prims,
_meta_registrations), and those tests start about thirty ranks: on a 2-core
machine that was most of their time, spent before a rank's first line of
training. The server imports torch (and numpy) once, then forks one child
per rank. A child is set up as a Slurm task's fresh interpreter would be:

  - a session and process group of its own (signals to the group reach its
    DataLoader workers, as slurmstepd's do);
  - its environment, working directory and sys.path (from PYTHONPATH) as
    asked; stdin /dev/null, stdout and stderr the test's pipes;
  - signal dispositions as a fresh interpreter has them (SIGINT raises
    KeyboardInterrupt, SIGPIPE and SIGXFSZ ignored, the rest default), an
    empty signal mask;
  - the script run as __main__ (runpy), then what interpreter exit does:
    non-daemon threads joined, atexit handlers run, streams flushed.
What is not fresh: modules the server imported before forking (torch,
numpy) and what they read from the environment at import. DataLoader
workers started with "spawn" are fresh interpreters as ever.

    server = forkserver.get()                       # one per test session
    proc = server.popen([script, *args], env=env, cwd=cwd)
    proc.pid, proc.stdout, proc.stderr, proc.poll(), proc.wait(timeout), proc.kill()
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading

PRELOAD = ("numpy", "torch", "torch.distributed", "torch.utils.data")

_SERVER = r'''
import io, json, os, runpy, select, signal, socket, sys, traceback
for name in sys.argv[2:]:
    __import__(name)
sock = socket.socket(fileno=int(sys.argv[1]))
wake_r, wake_w = os.pipe()
os.set_blocking(wake_r, False)
os.set_blocking(wake_w, False)
signal.signal(signal.SIGCHLD, lambda *_: None)
signal.set_wakeup_fd(wake_w)
base_path = [p for p in sys.path if p not in ("", os.getcwd())]


def child(req, fds):
    os.setsid()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError, RuntimeError):
            pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in (*fds, sock.fileno(), wake_r, wake_w):
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = os.path.abspath(req["argv"][0])
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script), *extra, *base_path]
    sys.argv = [script, *req["argv"][1:]]
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="backslashreplace")
    code = 0
    try:
        try:
            runpy.run_path(script, run_name="__main__")
        finally:
            import threading
            threading._shutdown()
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


def send(obj):
    sock.send(json.dumps(obj).encode())


while True:
    ready, _, _ = select.select([sock, wake_r], [], [])
    if wake_r in ready:
        try:
            while os.read(wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
    if sock in ready:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:
            break                 # the test process is gone
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            child(req, fds)
        for fd in fds:
            os.close(fd)
        send({"id": req["id"], "pid": pid})
'''


class Child:
    """A forked process, with the part of subprocess.Popen the tests use."""

    def __init__(self, server: "ForkServer", pid: int, stdout, stderr):
        self._server = server
        self.pid = pid
        self.stdout, self.stderr = stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self._server.cond:
            if self.returncode is None and self.pid in self._server.exits:
                self.returncode = self._server.exits[self.pid]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.cond:
            if not self._server.cond.wait_for(lambda: self.pid in self._server.exits, timeout):
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
        return self.poll()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Everything the child writes to stdout and stderr, once it ended."""
        got: dict[str, str] = {}
        readers = [threading.Thread(target=lambda k=k, f=f: got.__setitem__(k, f.read()), daemon=True)
                   for k, f in (("out", self.stdout), ("err", self.stderr))]
        for t in readers:
            t.start()
        self.wait(timeout)
        for t in readers:
            t.join(timeout)
        return got.get("out", ""), got.get("err", "")

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    def __init__(self, preload=PRELOAD):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(theirs.fileno()), *preload],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.cond = threading.Condition()
        self.pids: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self._ids = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.sock.recv(1 << 16)
            except OSError:
                msg = b""
            if not msg:
                with self.cond:
                    self.closed = True
                    self.cond.notify_all()
                return
            obj = json.loads(msg)
            with self.cond:
                if "exit" in obj:
                    self.exits[obj["exit"]] = obj["code"]
                else:
                    self.pids[obj["id"]] = obj["pid"]
                self.cond.notify_all()

    def popen(self, argv: list[str], *, env: dict[str, str], cwd: str, timeout: float = 60) -> Child:
        """Run `argv[0]` (a Python script) with `argv[1:]` in a new forked child."""
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        with self.cond:
            self._ids += 1
            rid = self._ids
        req = {"id": rid, "argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd)}
        try:
            socket.send_fds(self.sock, [json.dumps(req).encode()], [devnull, out_w, err_w])
        finally:
            for fd in (devnull, out_w, err_w):
                os.close(fd)
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self.pids or getattr(self, "closed", False), timeout):
                raise RuntimeError("the fork server did not answer")
            if rid not in self.pids:
                raise RuntimeError(f"the fork server ended (status {self.proc.poll()})")
            pid = self.pids.pop(rid)
        return Child(self, pid, os.fdopen(out_r, "r"), os.fdopen(err_r, "r"))

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_server: ForkServer | None = None


def get() -> ForkServer:
    """The session's server (started on first use, closed at exit)."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
        atexit.register(_server.close)
    return _server
