"""The slurm-snap service for real: a `slurm-snap serve` process (root) with
a private munged, and clients run as real unprivileged users through
runuser, with a config that names only the service (no database URL, no
credentials). Users get their own answers, are refused on other users'
jobs, and hook operations are root's; a missing service or munged is one
sentence, never a traceback."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from protocol_fixtures import ROOT, make_env
from realcomponents import require
from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.protocol.coordinator import Coordinator
from slurm_snap.service import wire

from test_access_cli import OTHER, OTHER_UID, OWNER, OWNER_UID

MUNGED = "/usr/sbin/munged"


pytestmark = pytest.mark.slow(14)   # seconds idle: the unit run starts this file early (tests/conftest.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def munge_socket():
    require(os.path.exists(MUNGED) and shutil.which("munge") is not None, "munge is not installed")
    require(os.geteuid() == 0, "the service test runs munged as the munge user (needs root)")
    d = tempfile.mkdtemp(prefix="slurm-snap-munge-", dir="/var/tmp")
    os.chmod(d, 0o755)
    shutil.chown(d, "munge", "munge")
    sock = f"{d}/munge.socket"
    r = subprocess.run(["/usr/sbin/runuser", "-u", "munge", "--", MUNGED, "--force", "--socket", sock,
                        "--pid-file", f"{d}/munged.pid", "--seed-file", f"{d}/munged.seed",
                        "--log-file", f"{d}/munged.log"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    for _ in range(100):
        if os.path.exists(f"{d}/munged.pid") and os.path.exists(sock):
            break
        time.sleep(0.05)
    pid = int(Path(f"{d}/munged.pid").read_text())
    yield sock
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}"):
            break
        time.sleep(0.05)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def service(tmp_path, munge_socket):
    """A job of OWNER with one COMPLETE set; the server on loopback; a
    client config any user can read."""
    port = _free_port()
    env = make_env(tmp_path, user=OWNER, uid=OWNER_UID,
                   extra={"service": {"listen": f"127.0.0.1:{port}", "munge_socket": munge_socket}})
    out = Coordinator(env.cfg, env.inv, caller=ROOT).snapshot(env.job_id, consistency="crash")
    assert out.state == S.COMPLETE
    env.set_id = out.set_id
    pidfile = f"{env.tmp}/serve.pid"
    log = open(f"{env.tmp}/serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "slurm_snap", "--config", env.cfg.path, "serve",
                             "--pidfile", pidfile], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    for _ in range(200):
        if os.path.exists(pidfile) or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert os.path.exists(pidfile), Path(f"{env.tmp}/serve.log").read_text()
    client_dir = tempfile.mkdtemp(prefix="slurm-snap-client-", dir="/var/tmp")
    os.chmod(client_dir, 0o755)
    client = f"{client_dir}/slurm-snap.toml"
    Path(client).write_text(f'[inventory]\nurl = "slurm-snap://127.0.0.1:{port}"\n\n'
                            f'[service]\nmunge_socket = "{munge_socket}"\n')
    os.chmod(client, 0o644)
    env.client, env.port, env.proc = client, port, proc
    yield env
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)
    log.close()
    shutil.rmtree(client_dir, ignore_errors=True)


def run_as(user: str | None, env, *args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "slurm_snap", "--config", env.client, *args]
    if user is not None:
        argv = ["/usr/sbin/runuser", "-u", user, "--", "/usr/bin/env", "-i", "PATH=/usr/bin:/bin",
                f"PYTHONPATH={os.pathsep.join(p for p in sys.path if p)}", "TZ=UTC",
                *(f"{k}={v}" for k, v in (extra_env or {}).items()), *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_owner_reads_their_job_through_the_service_without_database_credentials(service):
    assert "sqlite" not in Path(service.client).read_text()
    r = run_as(OWNER, service, "report", "-j", str(service.job_id), "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["sets"]
    assert [row["set_id"] for row in rows] == [service.set_id] and rows[0]["user"] == OWNER
    r = run_as(OWNER, service, "show", f"set:{service.set_id}")
    assert r.returncode == 0, r.stderr
    assert f"set {service.set_id}" in r.stdout.lower() or str(service.job_id) in r.stdout


@pytest.fixture
def service_own_format(monkeypatch):
    """The service's own environment names report columns: they must never
    answer for a user (requested before `service`, so the server inherits it)."""
    monkeypatch.setenv("SLURM_SNAP_REPORT_FORMAT", "State")


def test_report_takes_the_users_report_format_through_the_service(service_own_format, service):
    from slurm_snap.cli.report_cmd import FORMAT_ENV
    from slurm_snap.service.server import USER_ENVIRONMENT

    assert FORMAT_ENV in USER_ENVIRONMENT
    r = run_as(OWNER, service, "report", "-j", str(service.job_id),
               extra_env={"SLURM_SNAP_REPORT_FORMAT": "SetID,JobID%-9"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["SetID", "JobID"], r.stdout
    assert r.stdout.splitlines()[2].split() == [str(service.set_id), str(service.job_id)], r.stdout
    # Without it, the built-in columns: not the service's own variable.
    r = run_as(OWNER, service, "report", "-j", str(service.job_id))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:2] == ["JobID", "User"], r.stdout


def test_another_user_is_refused_on_the_owners_job(service):
    require(OTHER_UID != OWNER_UID, "needs two accounts")
    r = run_as(OTHER, service, "show", f"set:{service.set_id}")
    assert r.returncode == errors.PERMISSION, (r.stdout, r.stderr)
    assert "permission denied" in r.stderr and OTHER in r.stderr
    r = run_as(OTHER, service, "snapshot", str(service.job_id))
    assert r.returncode == errors.PERMISSION, (r.stdout, r.stderr)
    # report shows a user their own jobs only: the owner's set is not listed.
    r = run_as(OTHER, service, "report", "-j", str(service.job_id), "--json")
    assert r.returncode in (0, errors.PERMISSION, errors.NOT_FOUND), r.stderr
    listed = json.loads(r.stdout)["sets"] if r.returncode == 0 else []
    assert service.set_id not in [row["set_id"] for row in listed], r.stdout


def test_commands_not_run_by_the_service_say_where_to_run_them(service):
    for user in (None, OWNER):   # root and an ordinary user alike: one refusal, one code
        r = run_as(user, service, "repair")
        assert r.returncode == errors.CONTROLLER and "Traceback" not in r.stderr, r.stderr
        assert "through the slurm-snap service" in r.stderr and "run `slurm-snap repair` on the controller" in r.stderr


def test_hook_operations_are_roots_alone(service):
    from slurm_snap import config
    from slurm_snap.service.client import call

    cfg = config.load(service.client)
    found = call(cfg, "resume-point", job_id=service.job_id)
    assert found is None  # the set is crash-consistent: no resume point
    r = run_as(OWNER, service, "--version")  # the account works at all
    assert r.returncode == 0
    code = ("from slurm_snap import config; from slurm_snap.service.client import call; "
            f"call(config.load({service.client!r}), 'resume-point', job_id={service.job_id})")
    r = subprocess.run(["/usr/sbin/runuser", "-u", OWNER, "--", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PATH": "/usr/bin:/bin"})
    assert r.returncode != 0 and "hook operations are root's" in r.stderr


def test_a_replayed_or_forged_credential_is_refused(service, munge_socket):
    payload = json.dumps({"v": 1, "kind": "op", "op": "resume-point", "args": {"job_id": service.job_id}}).encode()
    cred = wire.encode(payload, socket_path=munge_socket)

    def send(credential):
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
            wire.send(s, {"credential": credential})
            frames = []
            while True:
                obj, _raw = wire.recv(s)
                frames.append(obj)
                if "exit" in obj:
                    return frames

    first = send(cred)
    assert first[-1]["exit"] == 0 and first[0] == {"result": None}
    again = send(cred)
    assert again[-1]["exit"] == errors.PERMISSION and "credential refused" in again[0]["err"].lower()
    forged = send(cred[:-8] + "AAAAAAA:")
    assert forged[-1]["exit"] == errors.PERMISSION


def test_no_service_is_one_sentence_naming_what_to_install(service):
    service.proc.send_signal(signal.SIGTERM)
    service.proc.wait(timeout=20)
    r = run_as(OWNER, service, "report")
    assert r.returncode == errors.INVENTORY and "Traceback" not in r.stderr
    assert f"cannot reach the slurm-snap service at 127.0.0.1:{service.port}" in r.stderr
    assert "slurm-snap serve" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_no_munged_is_one_sentence(service, tmp_path):
    cfg = Path(service.client).read_text().replace(service.cfg.service.munge_socket, "/nonexistent/munge.socket")
    bad = Path(service.client).with_name("nomunge.toml")
    bad.write_text(cfg)
    os.chmod(bad, 0o644)
    service.client = str(bad)
    r = run_as(OWNER, service, "report")
    assert r.returncode == errors.INVENTORY and "Traceback" not in r.stderr
    assert "munge" in r.stderr and "munged" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_doctor_finds_the_service_answering_its_sealed_ping(service):
    from slurm_snap.doctor import probes

    assert probes.service(service.cfg) == ""
    service.proc.send_signal(signal.SIGTERM)
    service.proc.wait(timeout=20)
    assert "cannot reach the slurm-snap service" in probes.service(service.cfg)
