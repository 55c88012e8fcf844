"""Many jobs opting in at once on the dev cluster: 36 small one-node jobs with
--snapshot-volumes=scratch submitted back to back (24 run at a time: 3
nodes x 2 CPUs, each shared by 4 jobs on the low partition). Every job must run, every run and its node-local volume
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


def _missing(repo, ids):
    return [j for j in ids if repo.find_job_run(j) is None]


def _records(repo, ids):
    """job id -> (nodes, user, [(class, node, path)], hook-failed events)."""
    out = {}
    for jid in ids:
        run = repo.job_run(jid)
        out[jid] = (list(run.nodes), run.user_name, [(v.volume_class, v.node, v.path) for v in repo.volumes(run)],
                    [e.kind for e in repo.events(job_id=jid) if e.kind == "hook-failed"])
    return out


def _drained(cluster) -> list[str]:
    out = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout.split("\n")
    return [ln for ln in out if ln.strip() and ln.split()[1].startswith(("drain", "drng", "down", "fail"))]


def test_many_jobs_opting_in_at_once(cluster):
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
        missing = cluster.inventory(_missing, ids)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    uid = pwd.getpwnam(cluster.user).pw_uid
    for jid, (nodes, user, vols, failed_events) in cluster.inventory(_records, ids).items():
        assert len(nodes) == 1 and user == cluster.user, jid
        assert [(c, n) for c, n, _p in vols] == [("scratch", nodes[0])], jid
        # prepared by the node Prolog: the job's own subvolume, owned by the user,
        # on the disk of the node it ran on and on no other
        st = os.stat(cluster.root_path(vols[0][2], nodes[0]))
        assert st.st_ino == 256 and st.st_uid == uid, jid
        assert [n for n in cluster.nodes if cluster.root_path(vols[0][2], n).exists()] == nodes, jid
        assert not failed_events, jid
    # no hook failed, no node drained
    failed = []
    for line in cluster.hook_log().splitlines():   # every host's hooks.log
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("job_id") in ids and rec.get("status") != "ok":
                failed.append(rec)
    assert failed == []
    assert _drained(cluster) == []
    assert wall < 170
