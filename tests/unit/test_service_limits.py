"""The service's bounds, on a real `serve()` with a private munged: a request
that does not arrive whole in time (a slow-loris), one too large, one not
a frame, one past the service's time limit, one user over max_per_user,
everyone over max_connections. Each refusal is a line in the service's log
naming the peer. The served command is a stand-in that sleeps for the
number of seconds it is given (the bounds are the server's, whatever it runs)."""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from realcomponents import require
from slurm_snap import errors
from slurm_snap.service import wire
from test_access_cli import OWNER, OWNER_UID
from test_service import _free_port, munge_socket  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow(15)   # seconds idle: the unit run starts this file early (tests/conftest.py)

SERVER = """
import sys, time
from slurm_snap import config
from slurm_snap.service import server
from slurm_snap.service.server import serve
# A child slow to exit after its reply, as on a loaded controller: what it
# holds until it exits, the next request of the same client must not need.
handle = server.Service.handle
server.Service.handle = lambda self, sock, peer: (handle(self, sock, peer), time.sleep(0.5))
cfg = config.load(sys.argv[1])


def run_cli(argv):
    print("started", flush=True)
    time.sleep(float(argv[-1]))
    print("slept", argv[-1])
    return 0
serve(cfg, listen=cfg.service.listen, pidfile=sys.argv[2], run_cli=run_cli, ops={})
"""

CLIENT = """
import sys
from slurm_snap import config
from slurm_snap.service.client import forward
from slurm_snap.errors import SnapError
cfg = config.load(sys.argv[1])
try:
    for _ in range(int(sys.argv[3]) - 1):   # back to back: each next request as soon as the seal is in
        code = forward(cfg, ["show", sys.argv[2]])
        if code:
            sys.exit(code)
    sys.exit(forward(cfg, ["show", sys.argv[2]]))
except SnapError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)
"""


class Served:
    def __init__(self, d: str, port: int, proc: subprocess.Popen, client: str):
        self.dir, self.port, self.proc, self.client = d, port, proc, client

    def log(self) -> str:
        return Path(self.dir, "serve.log").read_text()

    def wait_log(self, text: str, timeout: float = 10) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.log():
                return self.log()
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the service's log:\n{self.log()}")

    def wait_children(self, n: int, timeout: float = 30) -> None:
        """Until the service has `n` children serving (the clients' interpreters
        start slowly on a loaded machine)."""
        path = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if len(Path(path).read_text().split()) >= n:
                return
            time.sleep(0.02)
        raise AssertionError(f"the service never had {n} children at once")

    def client_run(self, seconds: float, user: str | None = None, times: int = 1) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-c", CLIENT, self.client, str(seconds), str(times)]
        if user is not None:
            argv = ["/usr/sbin/runuser", "-u", user, "--", "/usr/bin/env", "-i", "PATH=/usr/bin:/bin",
                    f"PYTHONPATH={os.pathsep.join(p for p in sys.path if p)}", *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=90)


@pytest.fixture
def served(munge_socket):  # noqa: F811
    require(os.geteuid() == 0, "the service runs as root")
    d = tempfile.mkdtemp(prefix="slurm-snap-limits-", dir="/var/tmp")
    os.chmod(d, 0o755)
    port = _free_port()
    service = (f'[service]\nmunge_socket = "{munge_socket}"\nlisten = "127.0.0.1:{port}"\n'
               "request_timeout = 1.5\ntimeout = 3\nmax_connections = 2\nmax_per_user = 1\n")
    Path(d, "server.toml").write_text(f'[inventory]\nurl = "sqlite:///{d}/inventory.db"\n\n{service}')
    Path(d, "client.toml").write_text(f'[inventory]\nurl = "slurm-snap://127.0.0.1:{port}"\n\n'
                                      f'[service]\nmunge_socket = "{munge_socket}"\n')
    os.chmod(f"{d}/client.toml", 0o644)
    log = open(f"{d}/serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", SERVER, f"{d}/server.toml", f"{d}/serve.pid"], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    for _ in range(200):
        if os.path.exists(f"{d}/serve.pid") or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert os.path.exists(f"{d}/serve.pid"), Path(d, "serve.log").read_text()
    yield Served(d, port, proc, f"{d}/client.toml")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    log.close()
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def _closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed `sock` (fails past `seconds`)."""
    t = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t


def test_a_request_trickling_in_is_cut_off_at_request_timeout_and_logged_with_its_peer(served):
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        me = s.getsockname()[1]
        t = time.monotonic()
        for b in struct.pack(">I", 200) + b'{"cre':   # a byte at a time, 0.2 s apart: never whole
            try:
                s.sendall(bytes([b]))
            except OSError:
                break
            time.sleep(0.2)
        waited = _closed_within(s, 10) + (time.monotonic() - t)
    assert waited < 1.5 + 2.0, waited
    log = served.wait_log(f"refused 127.0.0.1:{me}: frame not complete in time")
    assert "request_timeout" in log


@pytest.mark.parametrize("data, said", [
    (struct.pack(">I", 0xFFFFFFF0), "exceeds the limit of 1048576"),   # claims 4 GiB: nothing allocated
    (struct.pack(">I", 4) + b"\xff\xfe{}", "frame is not JSON"),
    (struct.pack(">I", 2) + b"[]", "frame is not a JSON object"),
    (struct.pack(">I", 40000) + b"[" * 40000, "frame nested too deeply"),
])
def test_a_malformed_first_frame_is_refused_at_once_and_logged(served, data, said):
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        me = s.getsockname()[1]
        s.sendall(data)
        assert _closed_within(s, 5) < 5
    served.wait_log(f"refused 127.0.0.1:{me}: ")
    assert said in served.log()
    assert "Traceback" not in served.log()


def test_a_request_without_a_credential_is_refused_with_a_sealed_reason(served):
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        me = s.getsockname()[1]
        wire.send(s, {"credential": 5})
        first, _ = wire.recv(s)
        last, _ = wire.recv(s)
    assert "without a MUNGE credential" in first["err"] and last["exit"] == errors.USAGE
    served.wait_log(f"refused 127.0.0.1:{me}: request without a MUNGE credential")


def test_a_request_past_the_service_timeout_is_ended_and_the_client_told(served):
    t = time.monotonic()
    r = served.client_run(30)
    took = time.monotonic() - t
    assert r.returncode == errors.TIMEOUT, (r.stdout, r.stderr)
    assert "started" in r.stdout and "slept" not in r.stdout
    assert "ended this request after 3 s" in r.stderr and "Traceback" not in r.stderr
    assert took < 3 + 8, took
    served.wait_log("(uid 0): it ran past 3 s (service.timeout)")


def test_one_user_over_max_per_user_is_refused_and_others_are_not(served):
    out: dict[str, subprocess.CompletedProcess] = {}
    first = threading.Thread(target=lambda: out.update(first=served.client_run(2, OWNER)))
    first.start()
    served.wait_children(1)               # the first one is being served
    second = served.client_run(0, OWNER)
    root = served.client_run(0)           # root (the hooks) counts only against max_connections
    first.join(30)
    assert out["first"].returncode == 0, out["first"].stderr
    assert second.returncode == errors.INVENTORY, (second.stdout, second.stderr)
    assert "already has 1 request(s) in progress" in second.stderr and "max_per_user" in second.stderr
    assert root.returncode == 0, root.stderr
    served.wait_log(f"(uid {OWNER_UID}): uid {OWNER_UID} already has 1 request(s) in progress")


def test_a_user_at_max_per_user_may_send_requests_back_to_back(served):
    r = served.client_run(0, OWNER, times=5)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.count("slept 0") == 5


def test_past_max_connections_the_parent_refuses_busy_and_the_client_tries_again(served):
    hold = [threading.Thread(target=served.client_run, args=(2.5,)) for _ in range(2)]
    for h in hold:
        h.start()
    served.wait_children(2)
    # A raw client sees the refusal itself: one frame, unsealed, before any work.
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        me = s.getsockname()[1]
        wire.send(s, {"credential": "x"})
        frame, _ = wire.recv(s)
    assert set(frame) == {"busy"} and "max_connections" in frame["busy"]
    served.wait_log(f"refused 127.0.0.1:{me}: busy, 2 requests in progress (service.max_connections)")
    t = time.monotonic()
    r = served.client_run(0)              # busy at first; served once a slot frees
    assert r.returncode == 0, r.stderr
    assert "slept 0" in r.stdout
    for h in hold:
        h.join(30)
    assert time.monotonic() - t < 15
