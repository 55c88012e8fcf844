"""Many jobs opting in at once on the dev cluster: 36 small one-node jobs with
--snapshot-volumes=scratch submitted back to back (6 run at a time on 3
nodes x 2 CPUs). Every job must run, every run and its node-local volume
must be recorded and prepared by the hooks, no hook may fail, and no node may
end drained. Kept under about two minutes.
"""
from __future__ import annotations

import json
import os
import pwd
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOBS = 36


def _inventory(cluster):
    from slurm_snap.config import load
    from slurm_snap.inventory.repository import Inventory

    cfg = load(cluster.env["SLURM_SNAP_CONFIG"])
    inv = Inventory.from_config(cfg)
    inv.upgrade()
    return cfg, inv


def _drained(cluster) -> list[str]:
    out = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout.split("\n")
    return [ln for ln in out if ln.strip() and ln.split()[1].startswith(("drain", "drng", "down", "fail"))]


def test_many_jobs_opting_in_at_once(cluster):
    cfg, inv = _inventory(cluster)
    out = cluster.make_user_dir(f"load-{time.monotonic_ns()}")
    t0 = time.monotonic()
    ids = [cluster.sbatch("-N1", "-n1", "--snapshot-volumes=scratch", "-J", f"load{i}", "-o", f"{out}/%j.out",
                          "--wrap", "sleep 2; echo done")
           for i in range(JOBS)]
    submitted = time.monotonic() - t0
    deadline = time.monotonic() + 150
    for jid in ids:
        cluster.wait_state(jid, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"},
                           timeout=max(5, deadline - time.monotonic()))
    wall = time.monotonic() - t0
    print(f"\nload on the cluster: {JOBS} jobs submitted in {submitted:.1f} s, all finished in {wall:.1f} s")

    # every job ran to the end
    not_done = [j for j in ids if not (out / f"{j}.out").exists() or (out / f"{j}.out").read_text().strip() != "done"]
    assert not_done == [], f"jobs without output: {not_done}"
    # every run and its volume is recorded (PrologSlurmctld records in the
    # background: give the last recorders a moment) and prepared, on the node it ran on
    deadline = time.monotonic() + 60
    while True:
        with inv.session() as repo:
            missing = [j for j in ids if repo.find_job_run(j) is None]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    with inv.session() as repo:
        for jid in ids:
            run = repo.job_run(jid)
            vols = repo.volumes(run)
            assert len(run.nodes) == 1 and run.user_name == cluster.user, jid
            assert [(v.volume_class, v.node) for v in vols] == [("scratch", run.nodes[0])], jid
            # prepared by the node Prolog: the job's own subvolume, owned by the user
            st = os.stat(vols[0].path)
            assert st.st_ino == 256 and st.st_uid == pwd.getpwnam(cluster.user).pw_uid, jid
            assert not [e for e in repo.events(job_id=jid) if e.kind == "hook-failed"], jid
    # no hook failed, no node drained
    failed = []
    for line in cluster.hook_log().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("job_id") in ids and rec.get("status") != "ok":
                failed.append(rec)
    assert failed == []
    assert _drained(cluster) == []
    assert wall < 170
