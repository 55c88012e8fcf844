"""Faults of real components: the inventory's disk fills up (a 2 MB tmpfs
mounted for the test), the SSH peer refuses (closed port) or stalls (a TCP
listener on 127.0.0.1 that accepts and never speaks, or speaks garbage).

Expected: writes fail with InventoryError (exit 9) and hooks follow their
policy, rows already recorded are intact once space is freed; SSH faults
are TransportError (exit 7) or Timeout (exit 8) within the connect timeout,
and a snapshot over such a transport ends FAILED naming the host.
Needs root (mount); the mount is always removed.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_snap import errors
from slurm_snap.cli import main
from slurm_snap.inventory.repository import Inventory
from slurm_snap.jobrecords import VolumeRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from protocol_fixtures import make_env, to_toml  # noqa: E402

pytestmark = pytest.mark.integration

ROOT_NEEDED = os.geteuid() == 0


from fs import require  # noqa: E402  (tests/integration/fs.py: fail under CI, skip locally)


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MB tmpfs: the inventory's disk (schema and WAL fit), small enough to fill in a moment."""
    require(ROOT_NEEDED, "mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["/bin/mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "slurm-snap-test", str(mnt)],
                          capture_output=True, text=True, timeout=30)
    require(proc.returncode == 0, f"cannot mount a tmpfs: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["/bin/umount", "-l", str(mnt)], capture_output=True, timeout=30)
    assert not os.path.ismount(mnt)


def fill(directory: Path) -> Path:
    """Write until ENOSPC; returns the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC
    finally:
        os.close(fd)
    return filler


def record(inv, job_id: int, nvol: int = 3, payload: str = "") -> None:
    with inv.session() as repo:
        run = repo.record_job_run(job_id=job_id, restart_count=0, user_name="root", uid=0, nodes=["n1", "n2"],
                                  options={"volumes": ["scratch"], "note": payload})
        repo.add_volumes(run, [VolumeRecord(path=f"/s/n{i}/jobs/{job_id}", scope="node-local", volume_class="scratch",
                                          backend="btrfs", node=f"n{i}") for i in range(nvol)])
        repo.event("hook", f"recorded job {job_id}", job_id=job_id)


def snapshot_of(inv) -> list[tuple]:
    with inv.session() as repo:
        out = []
        for jid in range(1, 1000):
            run = repo.find_job_run(jid)
            if run is None:
                continue
            out.append((jid, run.options.get("note"), sorted(v.path for v in repo.volumes(run))))
        return out


def test_full_disk_fails_writes_and_keeps_what_was_recorded(small_fs, tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{small_fs}/inventory.db"
    inv = Inventory(url)
    inv.upgrade()
    for jid in range(1, 11):
        record(inv, jid, payload="x" * 200)
    before = snapshot_of(inv)
    assert len(before) == 10
    filler = fill(small_fs)

    # the library: every write is an InventoryError naming the database, exit 9
    failures = 0
    for jid in range(11, 31):
        try:
            record(inv, jid, payload="y" * 100_000)
        except errors.InventoryError as exc:
            failures += 1
            assert exc.exit_code == errors.INVENTORY
            assert "disk is full" in str(exc) or "disk I/O error" in str(exc), str(exc)
            assert str(small_fs) in str(exc)
    assert failures >= 15, f"only {failures} of 20 writes failed on a full disk"

    # the hooks: policy open exits 0, closed exits 1, both say why
    cfg = tmp_path / "c.toml"
    base = {"inventory": {"url": url, "busy_timeout": 2.0}, "paths": {"log_dir": f"{tmp_path}/log",
                                                                      "barrier_dir": f"{tmp_path}/b"}}
    for k, v in {"SLURM_JOB_ID": "500", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
                 "SLURMD_NODENAME": "", "SLURM_JOB_NODELIST": "n[1-64]", "SPANK_SLURM_SNAP": "1",
                 "SPANK_SLURM_SNAP_VOLUMES": ""}.items():
        monkeypatch.setenv(k, v)
    for policy, status in (("open", 0), ("closed", 1)):
        cfg.write_text(to_toml({**base, "hooks": {"failure_policy": policy}}) + "[[volume_class]]\n"
                       "name = 'scratch'\nprefix = '/s/{node}'\nscope = 'node-local'\nbackend = 'btrfs'\n"
                       "default = true\n")
        rc = main(["--config", str(cfg), "hook", "prolog-slurmctld"])
        err = capsys.readouterr().err
        assert rc == status, err
        assert "inventory sqlite:///" in err and ("disk is full" in err or "disk I/O error" in err), err

    # reading still works while full, and shows exactly what was recorded
    inv.dispose()
    inv = Inventory(url)
    during = snapshot_of(inv)
    assert during[:10] == before

    # free space: nothing recorded was lost, the file is sound, writing works again
    filler.unlink()
    inv.dispose()
    inv = Inventory(url)
    with inv.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    after = snapshot_of(inv)
    assert after[:10] == before
    assert all(len(v) == 3 for _j, _n, v in after)  # no half-recorded job: each has all its volumes
    record(inv, 900)
    with inv.session() as repo:
        assert repo.find_job_run(900) is not None
    inv.dispose()


# ---- the hooks' log disk full -----------------------------------------------------------------------
ENTRY = Path(__file__).resolve().parents[2]


def test_hooks_neither_block_nor_fail_on_a_full_log_disk(small_fs, tmp_path):
    """hooks.log on a full filesystem (issue 34): through the real entry
    point, a failing hook (PrologSlurmctld recording in the foreground, its
    inventory not initialised) still ends at once with exit 0 under policy
    open and says why on stderr (what slurmctld logs); the lines it could not
    write are simply missing, and once space is free logging resumes."""
    log_dir = small_fs / "log"
    log_dir.mkdir()
    (log_dir / "hooks.log").write_text("")
    filler = fill(small_fs)
    cfg = tmp_path / "c.toml"
    cfg.write_text(to_toml({"inventory": {"url": f"sqlite:///{tmp_path}/missing/inventory.db"},
                            "paths": {"log_dir": str(log_dir), "barrier_dir": f"{tmp_path}/b"}}))
    helper = Path(sys.executable).with_name("slurm-snap")
    (tmp_path / "defaults").write_text(f"HELPER={helper}\nCONFIG={cfg}\nRECORD=foreground\n")
    entry = tmp_path / "slurm-snap-prolog-slurmctld"
    text = (ENTRY / "prolog" / "slurm-snap-prolog-slurmctld").read_text()
    entry.write_text(text.replace("DEFAULTS=/etc/default/slurm-snap", f"DEFAULTS={tmp_path}/defaults"))
    entry.chmod(0o755)
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
           "SLURM_JOB_NODELIST": "n1", "SPANK_SLURM_SNAP": "1"}
    for _ in range(3):
        t0 = time.monotonic()
        r = subprocess.run([str(entry)], env=env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        assert "slurm-snap: prolog-slurmctld job 77: inventory" in r.stderr and "(policy open)" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert took < 10, f"the hook took {took:.1f} s on a full log disk"
    assert (log_dir / "hooks.log").stat().st_size == 0   # nothing could be written, nothing broke
    filler.unlink()
    r = subprocess.run([str(entry)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    lines = [json.loads(ln) for ln in (log_dir / "hooks.log").read_text().splitlines()]
    assert lines and lines[0]["hook"] == "prolog-slurmctld" and lines[0]["status"] == "failed"
    assert lines[0]["job_id"] == 77


# ---- SSH peer refusing or stalling -----------------------------------------------------------------
def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Listener:
    """Accepts on 127.0.0.1 and then says nothing (or `greeting`), until closed."""

    def __init__(self, greeting: bytes | None = None):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.greeting = greeting
        self.conns = []
        self.accepted = 0
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.sock.settimeout(0.2)
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            self.conns.append(c)
            if self.greeting is not None:
                try:
                    c.sendall(self.greeting)
                except OSError:
                    pass

    def close(self):
        self._stop = True
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def ssh_files(tmp_path):
    kh, key = tmp_path / "known_hosts", tmp_path / "id_ed25519"
    kh.write_text("")
    subprocess.run(["/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                   capture_output=True, timeout=30) if os.path.exists("/usr/bin/ssh-keygen") else key.write_text("")
    return str(kh), str(key)


def transport(ssh_files, port, connect_timeout=2.0):
    from slurm_snap.backends.ssh import SshTransport
    kh, key = ssh_files
    return SshTransport("127.0.0.1", known_hosts=kh, key_file=key, port=port, connect_timeout=connect_timeout)


@pytest.mark.parametrize("peer", ["refusing", "silent", "garbage", "closes"])
def test_ssh_peer_fault_is_a_transport_error_within_the_connect_timeout(ssh_files, peer):
    listener = None
    if peer == "refusing":
        port = free_port()
    else:
        listener = Listener(greeting={"silent": None, "garbage": b"HTTP/1.1 400 Bad Request\r\n\r\n" * 40,
                                      "closes": b""}[peer])
        port = listener.port
        if peer == "closes":
            listener.greeting = None
    try:
        t = transport(ssh_files, port, connect_timeout=2.0)
        t0 = time.monotonic()
        with pytest.raises((errors.TransportError, errors.Timeout)) as ei:
            t.run(["/bin/true"], timeout=30)
        took = time.monotonic() - t0
    finally:
        if listener is not None:
            listener.close()
    assert took < 2.0 + 3.0, f"{peer}: took {took:.1f} s, connect timeout is 2 s"
    assert ei.value.exit_code in (errors.BACKEND, errors.TIMEOUT)
    msg = str(ei.value)
    assert f"root@127.0.0.1:{port}" in msg
    if peer == "refusing":
        assert isinstance(ei.value, errors.TransportError) and f"Unable to connect to port {port}" in msg and took < 1.5
    if peer == "silent":
        assert took >= 1.5  # it did wait for the banner, but no longer than the connect timeout allows
        assert listener.accepted >= 1


def test_snapshot_over_a_refusing_ssh_transport_fails_the_set_naming_the_host(tmp_path, ssh_files, capsys):
    port = free_port()
    kh, key = ssh_files
    env = make_env(tmp_path, nodes=("n1",), shared=False, backend="btrfs")
    text = open(env.cfg.path).read().replace("[[volume_class]]", to_toml({"ssh": {
        "known_hosts": kh, "key": key, "port": port, "connect_timeout": 2.0, "host_template": "127.0.0.1"}})
        + "[[volume_class]]", 1).replace("scope = \"node-local\"", "scope = \"node-local\"\ntransport = \"ssh\"")
    open(env.cfg.path, "w").write(text)
    t0 = time.monotonic()
    rc = main(["--config", env.cfg.path, "snapshot", str(env.job_id), "--consistency", "crash", "--json"])
    cap = capsys.readouterr()
    assert rc == errors.BACKEND, cap.err
    assert time.monotonic() - t0 < 15
    out = json.loads(cap.out)
    assert out["state"] == "FAILED" and f"root@127.0.0.1:{port}" in out["reason"]
    assert f"Unable to connect to port {port} on 127.0.0.1" in out["reason"]
    assert os.path.exists(os.path.join(env.job_dir, "release", out["epoch"]))
