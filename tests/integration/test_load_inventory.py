"""Load on one SQLite inventory: 20 processes at once, each registering jobs
through the real hook entry point (PrologSlurmctld, then each node's
Prolog) and taking an on-demand snapshot set of each through the
coordinator, on the copying test backend.

Expected: every job ends with its run, its volumes (prepared), its set
COMPLETE with every part, and its hook events recorded; no row is lost; no
writer fails with a lock error (the hooks log would say so). Separate
processes, not threads: that is how Slurm runs hooks.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.inventory_helpers import sets_of_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PROCS = 20
JOBS_PER_PROC = 5
NODES = ("n1", "n2")

WORKER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from testkit.doubles import register_test_backends
register_test_backends()
from slurm_snap.cli import main
from slurm_snap import access, config
from slurm_snap.inventory.repository import Inventory
from slurm_snap.protocol.coordinator import Coordinator

cfg_path, worker, jobs = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
nodes = sys.argv[5].split(",")
base = {"SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
        "SLURM_JOB_NODELIST": ",".join(nodes), "SPANK_SLURM_SNAP": "1", "SPANK_SLURM_SNAP_VOLUMES": "scratch,pfs"}
result = {"worker": worker, "hooks": [], "sets": [], "errors": []}
t0 = time.monotonic()
for j in range(jobs):
    job_id = 1000 + worker * 100 + j
    os.environ.update(base, SLURM_JOB_ID=str(job_id))
    for hook, node in [("prolog-slurmctld", "")] + [("prolog", n) for n in nodes]:
        os.environ["SLURMD_NODENAME"] = node
        result["hooks"].append(main(["--config", cfg_path, "hook", hook]))
    cfg = config.load(cfg_path)
    inv = Inventory.from_config(cfg)
    try:
        out = Coordinator(cfg, inv, caller=access.Caller(uid=0, name="root")).snapshot(job_id, consistency="crash")
        result["sets"].append([job_id, out.state, out.reason])
    except Exception as exc:
        result["errors"].append(f"{job_id}: {type(exc).__name__}: {exc}")
    finally:
        inv.dispose()
result["seconds"] = time.monotonic() - t0
print(json.dumps(result))
"""


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "root"
    for n in NODES:
        (root / "scratch" / n).mkdir(parents=True)
    (root / "pfs").mkdir()
    cfg = tmp_path / "slurm-snap.toml"
    cfg.write_text(f"""
[inventory]
url = "sqlite:///{tmp_path}/inventory.db"
[paths]
allowed_roots = ["{root}"]
barrier_dir = "{tmp_path}/barriers"
log_dir = "{tmp_path}/log"
restore_root = "{tmp_path}/restore"
[timeouts]
hook_budget = 60
[[volume_class]]
name = "scratch"
prefix = "{root}/scratch/{{node}}"
scope = "node-local"
backend = "test-copy"
[[volume_class]]
name = "pfs"
prefix = "{root}/pfs"
scope = "shared"
backend = "test-copy"
""")
    from slurm_snap.inventory.repository import Inventory
    inv = Inventory(f"sqlite:///{tmp_path}/inventory.db")
    inv.upgrade()
    inv.dispose()
    return tmp_path, str(cfg)


def test_twenty_processes_register_and_snapshot_without_losing_a_row(site):
    tmp, cfg = site
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(REPO), cfg, str(w), str(JOBS_PER_PROC),
                               ",".join(NODES)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(PROCS)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    wall = time.monotonic() - t0
    jobs = PROCS * JOBS_PER_PROC
    print(f"\nload: {PROCS} processes, {jobs} jobs, {jobs * (1 + len(NODES))} hook runs, {jobs} snapshot sets "
          f"in {wall:.1f} s (slowest worker {max(r['seconds'] for r in results):.1f} s)")

    # every hook exited 0 and none failed (a lock error would be logged as failed)
    assert all(rc == 0 for r in results for rc in r["hooks"])
    assert [e for r in results for e in r["errors"]] == []
    log = [json.loads(x) for x in (tmp / "log" / "hooks.log").read_text().splitlines()]
    assert [x for x in log if x["status"] != "ok"] == []
    assert len(log) == jobs * (1 + len(NODES))
    assert all(s[1] == "COMPLETE" for r in results for s in r["sets"]), [s for r in results for s in r["sets"]]

    # and the inventory holds every row
    from slurm_snap.inventory.repository import Inventory
    inv = Inventory(f"sqlite:///{tmp}/inventory.db")
    try:
        with inv.session() as repo:
            for r in results:
                for j in range(JOBS_PER_PROC):
                    job_id = 1000 + r["worker"] * 100 + j
                    run = repo.job_run(job_id)
                    vols = repo.volumes(run)
                    assert sorted((v.volume_class, v.node) for v in vols) == \
                        [("pfs", "")] + [("scratch", n) for n in NODES]
                    # prepared by the node Prologs: every volume exists on disk
                    assert all(os.path.isdir(v.path) for v in vols), job_id
                    (st,) = sets_of_job(repo, job_id)
                    assert st.state == "COMPLETE" and len(repo.snapshots(st.id)) == len(vols)
                    # PrologSlurmctld's record; node Prologs leave theirs in hooks.log (checked above)
                    assert len(repo.events(job_id=job_id, kind="hook")) == 1
        with inv.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM job_run").scalar() == jobs
            assert conn.exec_driver_sql("SELECT count(*) FROM volume").scalar() == jobs * (1 + len(NODES))
            assert conn.exec_driver_sql("SELECT count(*) FROM snapshot").scalar() == jobs * (1 + len(NODES))
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    finally:
        inv.dispose()
    assert wall < 120
