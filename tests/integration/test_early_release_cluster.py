"""Issue 16 on the multi-host dev cluster: a preempted job whose ranks have
all acknowledged gives its nodes back at once (rank 0 requeues it), instead
of holding them until GraceTime ends. The partition's GraceTime is raised to
60 s for the test, so "early" cannot be an accident of a short grace."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from slurm_snap.slurm.version import json_number
from test_lockstep_cluster import SRUN, _one_point, _preempt_sets, _start, _text, _wait

pytestmark = pytest.mark.integration

GRACE = 60


def _grace(cluster, seconds: int) -> None:
    cluster.run(["scontrol", "update", "partitionname=low", f"gracetime={seconds}"], timeout=30, check=True,
                host="ctl")


def _started(cluster, jid: int) -> float | None:
    """When job `jid` started (squeue's start_time, Unix seconds), if it has."""
    job = cluster.job(jid)
    if job is None or job.state not in ("RUNNING", "COMPLETED", "COMPLETING"):
        return None
    return float(json_number(job.raw.get("start_time"))) or None


def _release(repo, set_id: int):
    st = repo.get_set(set_id)
    return (st.release, st.requested_at.timestamp(), st.barrier_at and st.barrier_at.timestamp(),
            st.released_at and st.released_at.timestamp())


def test_preempted_job_is_released_early_requeued_once_with_one_set_and_resumes(cluster):
    _grace(cluster, GRACE)
    jid = None
    try:
        jid, log, _train = _start(cluster, "early", SRUN, "-p", "low", "--requeue", "--open-mode=append",
                                  "--snapshot-on-preempt")
        t_preempt = time.time()
        preemptor = cluster.preempt()
        started = _wait(lambda: _started(cluster, preemptor), GRACE + 60,
                        lambda: f"the preemptor did not start; job log:\n{_text(log)[-3000:]}", every=0.2)
        found = _wait(lambda: [s for s in cluster.inventory(_preempt_sets, jid)
                               if s[1] not in ("PENDING", "QUIESCING", "CUTTING", "CUT")], 120,
                      lambda: f"no finished preemption set; hook log:\n{cluster.hook_log()[-4000:]}")
        assert len(found) == 1, found
        set_id, state, consistency, reason, step, epoch = found[0]
        assert (state, consistency, epoch) == ("COMPLETE", "app-consistent", "preempt-0"), reason
        assert _one_point(cluster, set_id) == step
        # Released early: the preemptor ran long before the 60 s grace was up.
        assert started - t_preempt < GRACE / 2, (started - t_preempt)
        decision = json.loads((Path(cluster.env["SLURM_SNAP_PFS"]) / ".slurm-snap" / "barriers" / str(jid) / "ack"
                               / "early-preempt-0.decision").read_text())
        # "requeueing" is written before the call and stays when the requeue
        # killed rank 0 before it could write "requeued" (docs/contracts.md).
        assert decision["decision"] in ("requeued", "requeueing"), decision
        # The set says so, with the numbers GraceTime is tuned with: first
        # signal -> last acknowledgement -> rank 0's requeue, in that order.
        release, requested, barrier, released = cluster.inventory(_release, set_id)
        assert release == "early" and requested <= barrier <= released, (requested, barrier, released)
        assert abs(released - decision["at"]) < 1e-3 and released - requested < GRACE / 2
        shown = cluster.cli("show", f"set:{set_id}", host="login", user=cluster.user)
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"^  preemption: last acknowledgement [\d.]+ s after the first signal, nodes given back "
                         r"after [\d.]+ s \(early\)$", shown.stdout, re.M), shown.stdout
        # Requeued once (the same job id, restart count 1), and it resumes from the set.
        _wait(lambda: len(re.findall(r"^resumed from step (\d+)", _text(log), re.M)) >= 6, 180,
              lambda: f"the requeued run did not resume:\n{_text(log)[-3000:]}")
        resumed = {int(s) for s in re.findall(r"^resumed from step (\d+)", _text(log), re.M)}
        assert resumed == {step}
        job = cluster.job(jid)
        assert job is not None and job.restart_count == 1, job
    finally:
        if jid is not None:
            cluster.cancel(jid)
        _grace(cluster, int(cluster.env.get("SLURM_SNAP_GRACE", "10")))
