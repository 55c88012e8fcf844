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
import re
import time

import pytest

from testkit.cluster import TERMINAL_STATES
from test_lockstep_cluster import _text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Not in the second Slurm version's CI tier (tests/integration/conftest.py):
ABOVE_SLURM = "the hooks' and the inventory's load; each hook's Slurm environment is test_hooks'"


JOBS = 36
PROLOG_HUNG = re.compile(r"slurmstepd-n\d+: error: Prolog hung on node n\d+")


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



def _busy(cluster) -> list[str]:
    return [f"{j.job_id} {j.state} {j.nodes}" for j in cluster.jobs() if j.state not in TERMINAL_STATES]


def test_many_jobs_opting_in_at_once(cluster):
    # The session's cluster is shared: start from an idle one, so that what
    # an earlier test left (a drained node, a job still ending) is named as
    # such instead of failing this test's own counts.
    assert cluster.drained() == [], "a node was left drained by an earlier test"
    deadline = time.monotonic() + 60
    while (busy := _busy(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert busy == [], f"jobs of earlier tests still in the queue after 60 s: {busy}"
    out = cluster.make_user_dir(f"load-{time.monotonic_ns()}")
    t0 = time.monotonic()
    ids = [cluster.sbatch("-N1", "-n1", "--snapshot-volumes=scratch", "-J", f"load{i}", "-o", f"{out}/%j.out",
                          "--wrap", "sleep 2; echo done")
           for i in range(JOBS)]
    submitted = time.monotonic() - t0
    deadline = time.monotonic() + 150
    ended = {}
    for jid in ids:
        job = cluster.wait_state(jid, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"},
                                 timeout=max(5, deadline - time.monotonic()))
        ended[jid] = job.state if job else "gone"
    wall = time.monotonic() - t0
    print(f"\nload on the cluster: {JOBS} jobs submitted in {submitted:.1f} s, all finished in {wall:.1f} s")

    # Every job ran to the end: its output is its script's one line, and
    # nothing else but Slurm's own notice that a Prolog ran past
    # MessageTimeout - 2 s (slurmd sends it by the clock, measured here when
    # the 3 nodes and the controller share 2 cores with 24 starting jobs;
    # counted and printed, never a reason to pass a job that did not finish).
    # Any slurm-snap notice in a job's output fails it.
    hung = 0
    not_done = []
    for j in ids:
        lines = _text(out / f"{j}.out").splitlines()
        slurm = [ln for ln in lines if PROLOG_HUNG.fullmatch(ln)]
        hung += len(slurm)
        if [ln for ln in lines if ln not in slurm] != ["done"]:
            not_done.append(j)
    print(f"Slurm's 'Prolog hung' notice in {hung} of {JOBS} jobs' output")
    assert not_done == [], (f"jobs without output: {[(j, ended[j], _text(out / f'{j}.out')) for j in not_done]}\n"
                            + "\n".join(ln for ln in cluster.daemon_log().splitlines() + cluster.hook_log().splitlines()
                                         if any(f"JobId={j} " in ln or f'"job_id": {j},' in ln
                                                for j in not_done))[-6000:])
    # every run and its volume is recorded (PrologSlurmctld records in the
    # background: give the last recorders a moment) and prepared, on the node it ran on
    deadline = time.monotonic() + 60
    while True:
        missing = cluster.inventory(_missing, ids)
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert missing == [], f"runs never recorded: {missing}"
    uid = pwd.getpwnam(cluster.user).pw_uid
    for jid, (nodes, user, vols, failed_events) in cluster.inventory(_records, ids).items():
        assert len(nodes) == 1 and user == cluster.user, (jid, nodes, user)
        assert [(c, n) for c, n, _p in vols] == [("scratch", nodes[0])], (jid, vols)
        # prepared by the node Prolog: the job's own subvolume, owned by the user,
        # on the disk of the node it ran on and on no other
        st = os.stat(cluster.root_path(vols[0][2], nodes[0]))
        assert st.st_ino == 256 and st.st_uid == uid, (jid, st.st_ino, st.st_uid)
        assert [n for n in cluster.nodes if cluster.root_path(vols[0][2], n).exists()] == nodes, jid
        assert not failed_events, (jid, failed_events)
    # no hook failed, no node drained
    failed = []
    for line in cluster.hook_log().splitlines():   # every host's hooks.log
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("job_id") in ids and rec.get("status") != "ok":
                failed.append(rec)
    assert failed == []
    assert cluster.drained() == []
    assert wall < 170, wall
