"""Faults of the inventory: unreachable (bad URL, closed port, missing driver,
unwritable directory) and locked (another process holds SQLite's exclusive
lock longer than busy_timeout).

Expected everywhere: InventoryError, exit 9, a message naming the database
(password redacted); hooks exit 0 under policy open and 1 under closed; what
was recorded before the fault is intact afterwards, and a rerun of the hook
(Slurm may run it again) records the job.
(Already covered: test_hook_policy.py::test_hook_cli_inventory_unreachable_open_exits_0
for a closed PostgreSQL port under policy open; test_inventory.py::test_unreachable_inventory_is_inventory_error.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm_snap import errors
from slurm_snap.cli import main
from slurm_snap.inventory.repository import Inventory
from slurm_snap.jobrecords import VolumeRecord
from testkit.inventory_helpers import sets_of_job

import dbtemplates

UNREACHABLE = {
    # url template -> what the message must contain
    "closed-port": ("postgresql+psycopg2://snap:s3cret@127.0.0.1:1/none", "127.0.0.1:1"),
    "no-driver": ("nosuchdb+nodriver://snap:s3cret@127.0.0.1/none", "nosuchdb+nodriver"),
    "not-a-url": ("just some words", "not a database URL"),
    "unwritable-dir": ("sqlite:////proc/1/slurm-snap/inventory.db", "/proc/1/slurm-snap"),
}


def write_cfg(tmp_path, url, policy="open", busy=30.0) -> str:
    p = tmp_path / f"c-{policy}.toml"
    p.write_text(f"[inventory]\nurl = '{url}'\nbusy_timeout = {busy}\n[hooks]\nfailure_policy = '{policy}'\n"
                 f"[paths]\nlog_dir = '{tmp_path}/log'\nbarrier_dir = '{tmp_path}/barriers'\n"
                 f"[timeouts]\nhook_budget = 20\n")
    return str(p)


def hook_env(monkeypatch, job_id=55, volumes=""):
    for k, v in {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
                 "SLURMD_NODENAME": "", "SLURM_JOB_NODELIST": "n1,n2", "SPANK_SLURM_SNAP": "1",
                 "SPANK_SLURM_SNAP_VOLUMES": volumes}.items():
        monkeypatch.setenv(k, v)


def hook_log(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "log" / "hooks.log").read_text().splitlines()]


@pytest.mark.parametrize("case", sorted(UNREACHABLE))
def test_unreachable_inventory_cli_exits_9_naming_it(tmp_path, capsys, case):
    url, named = UNREACHABLE[case]
    rc = main(["--config", write_cfg(tmp_path, url), "db", "upgrade"])
    err = capsys.readouterr().err
    assert rc == errors.INVENTORY, err
    assert named in err and "s3cret" not in err


@pytest.mark.parametrize("policy,status", [("open", 0), ("closed", 1)])
@pytest.mark.parametrize("case", sorted(UNREACHABLE))
def test_unreachable_inventory_hook_follows_policy(tmp_path, monkeypatch, capsys, case, policy, status):
    url, named = UNREACHABLE[case]
    hook_env(monkeypatch)
    t0 = time.monotonic()
    rc = main(["--config", write_cfg(tmp_path, url, policy), "hook", "prolog-slurmctld"])
    err = capsys.readouterr().err
    assert rc == status, err
    assert time.monotonic() - t0 < 15  # connect timeouts, not the hook budget
    assert f"prolog-slurmctld job 55: inventory" in err and named in err and f"(policy {policy})" in err
    assert "s3cret" not in err
    log = hook_log(tmp_path)
    assert log[-1]["status"] == "failed" and named in log[-1]["message"] and "s3cret" not in json.dumps(log)


# ---- locked ---------------------------------------------------------------------------
# Holds the lock for at most argv[2] seconds, or until told to let go (a
# line on stdin): the test ends the hold once what it watches has happened.
LOCKER = """
import select, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
con.execute("BEGIN EXCLUSIVE")
con.execute("INSERT INTO event (at, kind, level, message, node) VALUES ('2020-01-01 00:00:00', 'lock', 'info', 'held', '')")
print("locked", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))
con.execute("ROLLBACK")
"""


@pytest.fixture
def locked_db(tmp_path):
    """A migrated inventory with one job already recorded, and a way to lock it."""
    url = dbtemplates.sqlite(tmp_path / "inv.db")     # migrated, as `db upgrade` leaves it
    inv = Inventory(url)
    with inv.session() as repo:
        run = repo.record_job_run(job_id=10, restart_count=0, user_name="root", uid=0, nodes=["n1"])
        repo.add_volumes(run, [VolumeRecord(path="/x/jobs/10", scope="shared", volume_class="pfs", backend="btrfs")])
    inv.dispose()
    procs = []

    def lock(seconds: float):
        p = subprocess.Popen([sys.executable, "-c", LOCKER, f"{tmp_path}/inv.db", str(seconds)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "locked", p.stderr.read()
        return p

    yield url, lock
    for p in procs:
        release(p)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


def release(holder) -> None:
    """End the hold now (the holder rolls back and exits)."""
    if holder.poll() is None:
        try:
            holder.stdin.write("go\n")
            holder.stdin.close()
        except BrokenPipeError:
            pass


def recorded(url) -> tuple[list[int], list[str]]:
    inv = Inventory(url)
    try:
        with inv.session() as repo:
            jobs = sorted(r.job_id for r in [repo.find_job_run(10), repo.find_job_run(55)] if r is not None)
            vols = [v.path for r in [repo.find_job_run(10)] for v in repo.volumes(r)]
            return jobs, vols
    finally:
        inv.dispose()


@pytest.mark.parametrize("policy,status", [("open", 0), ("closed", 1)])
def test_locked_inventory_hook_fails_after_busy_timeout_and_nothing_is_lost(tmp_path, monkeypatch, capsys,
                                                                             locked_db, policy, status):
    url, lock = locked_db
    cfg = write_cfg(tmp_path, url, policy, busy=0.5)
    hook_env(monkeypatch)
    holder = lock(4.0)
    t0 = time.monotonic()
    rc = main(["--config", cfg, "hook", "prolog-slurmctld"])
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == status, err
    assert 0.4 < took < 3.5, took  # waited busy_timeout, not the holder's 4 s
    assert "database is locked" in err and "inventory sqlite:///" in err
    assert holder.poll() is None     # it still held the lock all that time
    release(holder)
    holder.wait(10)
    # nothing recorded before the fault is lost; the holder's uncommitted row is gone
    assert recorded(url) == ([10], ["/x/jobs/10"])
    # Slurm runs the hook again (or the next job's hook comes): it records now
    assert main(["--config", cfg, "hook", "prolog-slurmctld"]) == 0
    assert recorded(url) == ([10, 55], ["/x/jobs/10"])


def test_locked_inventory_snapshot_cli_exits_9(tmp_path, capsys, locked_db):
    url, lock = locked_db
    cfg = write_cfg(tmp_path, url, busy=0.5)
    holder = lock(4.0)
    rc = main(["--config", cfg, "snapshot", "10", "--consistency", "crash"])
    err = capsys.readouterr().err
    assert rc == errors.INVENTORY and "database is locked" in err
    assert holder.poll() is None
    release(holder)
    holder.wait(10)
    inv = Inventory(url)
    with inv.session() as repo:
        assert sets_of_job(repo, 10) == []  # no half-made set
    inv.dispose()


def test_lock_shorter_than_busy_timeout_is_waited_out(tmp_path, monkeypatch, capsys, locked_db):
    url, lock = locked_db
    cfg = write_cfg(tmp_path, url, busy=10.0)
    hook_env(monkeypatch)
    lock(1.0)
    t0 = time.monotonic()
    assert main(["--config", cfg, "hook", "prolog-slurmctld"]) == 0
    assert 0.5 < time.monotonic() - t0 < 8
    assert recorded(url) == ([10, 55], ["/x/jobs/10"])
    assert hook_log(tmp_path)[-1]["status"] == "ok"


# ---- PrologSlurmctld recording after the launch (RECORD=background, the default) ------------
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPER = os.path.join(os.path.dirname(sys.executable), "slurm-snap")


def _entry_point(tmp_path, cfg: str) -> str:
    """prolog/slurm-snap-prolog-slurmctld as the install step writes it (etc/README.md)."""
    with open(os.path.join(REPO, "prolog", "slurm-snap-prolog-slurmctld")) as f:
        text = f.read()
    for key, value in (("HELPER", HELPER), ("CONFIG", cfg), ("RECORD", "background")):
        text = "\n".join(f"{key}={value}" if line.startswith(f"{key}=") else line for line in text.split("\n"))
    path = tmp_path / "slurm-snap-prolog-slurmctld"
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def _run_entry_point(tmp_path, cfg: str, volumes: str = "") -> list[dict]:
    """Run it as slurmctld would (no PATH); return the background hook's log lines once written."""
    env = {"SLURM_JOB_ID": "55", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
           "SLURM_JOB_NODELIST": "n1,n2", "SPANK_SLURM_SNAP": "1", "SPANK_SLURM_SNAP_VOLUMES": volumes}
    proc = subprocess.run([_entry_point(tmp_path, cfg)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc
    deadline = time.monotonic() + 30
    while True:   # the entry point has returned; the helper records in its own session
        log = hook_log(tmp_path) if (tmp_path / "log" / "hooks.log").exists() else []
        rec = [r for r in log if r["hook"] == "prolog-slurmctld-record"]
        if rec:
            return rec
        assert time.monotonic() < deadline, "the background recording never logged"
        time.sleep(0.05)


def test_background_recording_lands_after_the_hook_returned(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/inv.db"
    cfg = write_cfg(tmp_path, url)
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    rec = _run_entry_point(tmp_path, cfg)
    assert rec[0]["status"] == "ok" and rec[0]["job_id"] == 55
    inv = Inventory(url)
    with inv.session() as repo:
        assert repo.job_run(55).nodes == ["n1", "n2"]
    inv.dispose()


def test_background_recording_failure_is_logged_and_the_hook_still_exits_0(tmp_path):
    url, named = UNREACHABLE["closed-port"]
    rec = _run_entry_point(tmp_path, write_cfg(tmp_path, url))
    assert rec[0]["status"] == "failed" and named in rec[0]["message"] and "s3cret" not in rec[0]["message"]


def test_bad_declaration_in_the_background_is_logged_naming_it(tmp_path):
    rec = _run_entry_point(tmp_path, write_cfg(tmp_path, f"sqlite:///{tmp_path}/inv.db"), volumes="nosuchclass")
    assert rec[0]["status"] == "failed" and "'nosuchclass'" in rec[0]["message"]
