"""Issue 17 on the multi-host dev cluster: jobs that ask for --snapshot-every
get a set at least every interval + 20 s from the schedule runner (run on
ctl as an admin's timer would, a pass every few seconds), never two sets of
one job at once, each COMPLETE app-consistent; the runner drills them as the
job's user with the recorded resume command until every set is VERIFIED;
no node is drained."""
from __future__ import annotations

import json
import os
import time

import pytest

from testkit.cluster import REPO

pytestmark = pytest.mark.integration

# The run is 20 jobs; SLURM_SNAP_TEST_SCHEDULE_JOBS scales it.
JOBS = int(os.environ.get("SLURM_SNAP_TEST_SCHEDULE_JOBS", "4"))
EVERY = int(os.environ.get("SLURM_SNAP_TEST_SCHEDULE_EVERY", "20"))      # seconds (--snapshot-every)
RUN_FOR = int(os.environ.get("SLURM_SNAP_TEST_SCHEDULE_RUN_FOR", "75"))  # seconds of passes while the jobs run
BATCH = """#!/bin/bash
srun {python} {train} --steps 100000 --step-time 0.2 --release-timeout 60
"""


# Not in the second Slurm version's CI tier (tests/integration/conftest.py):
ABOVE_SLURM = "the runner's intervals and drill catch-up; its squeue --json listing is test_slurm_api_cluster's"


def _sets(repo, job_ids):
    from slurm_snap.inventory.models import SnapshotSet
    from sqlalchemy import select

    rows = repo.s.scalars(select(SnapshotSet).where(SnapshotSet.job_id.in_(job_ids)).order_by(SnapshotSet.id))
    return [{"id": s.id, "job": s.job_id, "trigger": s.trigger, "state": s.state, "consistency": s.consistency,
             "requested": s.requested_at.timestamp(), "finished": s.finished_at.timestamp() if s.finished_at else None,
             "cut": s.cut_done_at.timestamp() if s.cut_done_at else None,
             "verified": s.verified_at.timestamp() if s.verified_at else None} for s in rows]


def _tests(repo, set_ids):
    """Each set's drills: (Slurm job, result, reason)."""
    from slurm_snap.inventory.models import RestoreTest
    from sqlalchemy import select

    out: dict[int, list] = {}
    for t in repo.s.scalars(select(RestoreTest).where(RestoreTest.set_id.in_(set_ids)).order_by(RestoreTest.id)):
        out.setdefault(t.set_id, []).append((t.slurm_job_id, t.result, t.reason[:300]))
    return out


def _started(repo, job_ids):
    from slurm_snap.inventory.models import JobRun
    from sqlalchemy import select

    return {r.job_id: (r.created_at.timestamp(), r.snapshot_every)
            for r in repo.s.scalars(select(JobRun).where(JobRun.job_id.in_(job_ids)))}


def _pass(cluster):
    proc = cluster.cli("schedule", "--json", host="ctl", timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_periodic_sets_arrive_every_interval_and_every_one_is_drilled(cluster):
    train = cluster.write_user_file("train-schedule.py", (REPO / "examples" / "train.py").read_text(), mode=0o755)
    out = cluster.make_user_dir(f"schedule-{time.monotonic_ns()}")
    resume = f"{cluster.python} {train} --steps 100000"
    jobs = []
    try:
        for i in range(JOBS):
            jobs.append(cluster.sbatch("-N1", "--ntasks-per-node=1", "-c1", "--snapshot-volumes=pfs",
                                       f"--snapshot-every={EVERY}s", f"--snapshot-resume-cmd={resume}",
                                       "-o", f"{out}/slurm-%j.out",
                                       script=BATCH.format(train=train, python=cluster.python)))
        for j in jobs:
            cluster.wait_state(j, "RUNNING", timeout=90)
        started = time.monotonic()
        passes = []
        while time.monotonic() - started < RUN_FOR:
            passes.append(_pass(cluster))
            time.sleep(3)
        sinfo = cluster.run(["sinfo", "-h", "-o", "%t"], timeout=30).stdout.split()
        assert not [s for s in sinfo if s.startswith(("drain", "drng", "down"))], sinfo
        for j in jobs:
            assert cluster.job(j).state == "RUNNING", (j, cluster.job(j))
    finally:
        cluster.cancel(*jobs)
    for j in jobs:
        cluster.wait_state(j, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=90)
    end = time.time()
    runs = cluster.inventory(_started, jobs)
    sets = cluster.inventory(_sets, jobs)
    assert {j: every for j, (_, every) in runs.items()} == {j: EVERY for j in jobs}
    assert not [p for p in passes for t in p["taken"] if t["error"] and not t["error"].startswith("busy")], passes
    assert not [d for p in passes for d in p["drills"] if d["error"] or d["passed"] is False], \
        [d for p in passes for d in p["drills"]]
    worst = 0.0
    for j in jobs:
        mine = [s for s in sets if s["job"] == j]
        assert mine and all(s["trigger"] == "periodic" for s in mine), mine
        assert all(s["state"] in ("COMPLETE", "VERIFIED") and s["consistency"] == "app-consistent"
                   for s in mine), mine
        # at least every interval + 20 s: from the run's start, between sets, and up to the last pass
        times = [runs[j][0]] + [s["requested"] for s in mine]
        gaps = [b - a for a, b in zip(times, times[1:])]
        worst = max(worst, max(gaps))
        assert max(gaps) <= EVERY + 20, (j, gaps)
        assert len(mine) >= RUN_FOR // (EVERY + 20), (j, len(mine))
        # never two sets of one job at once
        for a, b in zip(mine, mine[1:]):
            assert a["finished"] is not None and a["finished"] <= b["requested"], (a, b)
    # The jobs are gone; the runner keeps drilling until no set is left
    # undrilled. Each drill is a Slurm job a pass submits and a later pass
    # collects: caught up once a pass neither submits a drill nor has one to
    # collect (a drill job still queued or running is a collected line too,
    # "Slurm job N is RUNNING"; one abandoned on the queue is drilled again).
    deadline = time.monotonic() + 240 + 10 * JOBS
    collected = [line for p in passes for line in p["collected"]]
    while True:
        p = _pass(cluster)
        assert not [d for d in p["drills"] if d["error"] or d["passed"] is False], p["drills"]
        collected += p["collected"]
        if not p["drills"] and not p["collected"]:
            break
        assert time.monotonic() < deadline, ("scheduled drills did not catch up", p["drills"], p["collected"])
        if not p["drills"]:
            time.sleep(2)   # only drill jobs under way: give them a moment
    # Every verdict a pass collected is a pass.
    assert not [line for line in collected if ": FAILED" in line], collected
    sets = cluster.inventory(_sets, jobs)
    tests = cluster.inventory(_tests, [s["id"] for s in sets])
    assert sets and all(s["state"] == "VERIFIED" for s in sets), \
        [(s["id"], s["state"], tests.get(s["id"])) for s in sets if s["state"] != "VERIFIED"]
    lag = max(s["verified"] - s["cut"] for s in sets)
    print(f"\n{len(sets)} periodic sets of {JOBS} jobs at {EVERY} s; {len(passes)} passes in {RUN_FOR} s; "
          f"longest wait for a set {worst:.1f} s (bound {EVERY + 20} s); "
          f"cut -> VERIFIED at most {lag:.1f} s (the last drills ran after the jobs ended, "
          f"{end - max(s['cut'] for s in sets):.1f} s after the last cut); "
          f"{sum(': aborted:' in line for line in collected)} drill(s) abandoned and drilled again")
    # report: the user sees the verified RPO of their jobs on login
    rep = cluster.cli("report", "-j", ",".join(map(str, jobs)), "--json", host="login", user=cluster.user)
    assert rep.returncode == 0, rep.stderr
    listed = {s["set_id"] for s in json.loads(rep.stdout)["sets"]}
    assert listed == {s["id"] for s in sets}
