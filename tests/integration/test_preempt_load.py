"""Twenty opted-in jobs preempted at once on the dev cluster (issue 21 items 7 and 8).

The dev cluster must hold them all running at once (3 nodes x 2 CPUs shared by
4 jobs each on the low partition), and one exclusive job on the high partition
preempts them all. For every job EpilogSlurmctld must see the preemption and
record it on the set (it once answered "not preempted": without SLURM_CONF its
squeue could not reach slurmctld), every node Epilog must cut and record, every set
must end finalized with each job's scratch volume, and no hook may fail nor
any node be drained. Kept under about three minutes.
"""
from __future__ import annotations

import json
import re
import time

import pytest

from testkit.inventory_helpers import sets_of_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOBS = 20
FINISHED = ("COMPLETE", "PARTIAL", "FAILED")


def _sets(repo, ids):
    """job id -> (epoch, state, consistency, reason, parts, EpilogSlurmctld opened it) of its preemption set."""
    out = {}
    for jid in ids:
        for st in sets_of_job(repo, jid):
            if st.trigger != "preempt":
                continue
            opened = any(e.kind == "preempt" and "opened at preemption" in e.message
                         for e in repo.events(set_id=st.id))
            out[jid] = (st.epoch, st.state, st.consistency, st.reason, len(repo.snapshots(st.id)), opened)
    return out


def _wait_all(cluster, ids, predicate, timeout: float, what: str) -> None:
    """Poll one squeue for every job until predicate(job) holds for all of them."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = {j.job_id: j for j in cluster.jobs()}
        if all(i in jobs and predicate(jobs[i]) for i in ids):
            return
        assert time.monotonic() < deadline, \
            f"{what} not reached in {timeout:.0f} s: {sorted((i, jobs[i].state) for i in ids if i in jobs)}"
        time.sleep(0.5)


def _hook_lines(cluster, ids):
    """(hook, job) -> messages, and the records that did not end "ok"."""
    said, failed = {}, []
    for line in cluster.hook_log().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("job_id") in ids:
                said.setdefault((rec["hook"], rec["job_id"]), []).append(rec["message"])
                if rec["status"] != "ok":
                    failed.append(rec)
    return said, failed



def test_twenty_opted_in_jobs_preempted_at_once(cluster):
    out = cluster.make_user_dir(f"preempt-load-{time.monotonic_ns()}")
    ids = [cluster.sbatch("-p", "low", "-N1", "-n1", "--snapshot-on-preempt", "--snapshot-volumes=scratch",
                          "--snapshot-consistency=crash", "-J", f"pl{i}", "-o", f"{out}/%j.out",
                          "--wrap", "for i in $(seq 600); do sleep 0.5 & wait; done")
           for i in range(JOBS)]
    try:
        # all of them run at once: the cluster is sized for it
        _wait_all(cluster, ids, lambda j: j.state == "RUNNING", 90, f"all {JOBS} jobs RUNNING")
        t0 = time.monotonic()
        preemptor = cluster.preempt(nodes=3)
        deadline = time.monotonic() + 150
        while True:
            sets = cluster.inventory(_sets, ids)
            done = {j for j, s in sets.items() if s[1] in FINISHED}
            if len(done) == JOBS or time.monotonic() > deadline:
                break
            time.sleep(1)
        took = time.monotonic() - t0
        print(f"\n{JOBS} jobs preempted at once: every set finished {took:.1f} s after the preemptor's submission")
        assert sorted(done) == sorted(ids), f"sets not finished: {sorted(set(ids) - done)}\n" \
                                            f"{cluster.hook_log()[-4000:]}"
        for jid in ids:
            epoch, state, consistency, reason, parts, _opened = sets[jid]
            # cut and finalized by the node Epilog
            assert (epoch, state, consistency, parts) == ("preempt-0", "COMPLETE", "crash-consistent", 1), \
                (jid, sets[jid])
        # what each hook said, on every host; EpilogSlurmctld may answer after the
        # node Epilogs (on one loaded machine it ran ~6 s after the last of them)
        deadline = time.monotonic() + 90
        while True:
            said, failed = _hook_lines(cluster, ids)
            if all(("epilog-slurmctld", j) in said for j in ids) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert failed == []
        sets = cluster.inventory(_sets, ids)
        for jid in ids:
            # it saw the preemption (squeue's PreemptTime) and recorded so on the set
            lines = said.get(("epilog-slurmctld", jid), [])
            assert lines and all(re.match(r"preempted at \d+: set \d+ (opened|already \w+)$", m) for m in lines), \
                (jid, lines)
            assert sets[jid][5], (jid, sets[jid])
        assert cluster.drained() == []
        # every job was requeued under its own id
        _wait_all(cluster, ids, lambda j: j.restart_count == 1, 60, "all requeued")
        cluster.wait_state(preemptor, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    finally:
        cluster.cancel(*ids)
        for jid in ids:
            cluster.wait_state(jid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
