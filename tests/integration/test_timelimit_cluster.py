"""Issue 33 item 1 on the multi-host dev cluster: a job that asked to be
snapshot before its time limit (--snapshot-before-timelimit=60s, --time=2)
gets Slurm's signal from the cli_filter's --signal=USR1@60, every rank
checkpoints at one step, rank 0 writes the time-limit record and requeues
the job before its limit, the node Epilogs cut a set whose trigger is
`timelimit` (report says so), and the requeued run resumes every rank from
the set at its step + 1 with identical parameters.

Slurm 22.05 measured here: the signal reaches the tasks 57-63 s into a
2-minute job (it may come up to 60 s before the time asked); a job left to
its limit is killed ~27 s after it (slurmctld's periodic check)."""
from __future__ import annotations

import json
import re
import time

import pytest

from test_lockstep_cluster import PARAMS, RESUMED, _text, _wait

from testkit.inventory_helpers import sets_of_job

pytestmark = pytest.mark.integration

TRAIN = """#!/bin/bash
srun {python} {train} --steps 100000 --step-time 0.25 --release-timeout 150
"""


def _sets(repo, jid: int):
    return [(s.id, s.trigger, s.state, s.consistency, s.reason, s.checkpoint_step, s.epoch, s.release)
            for s in sets_of_job(repo, jid)]


def test_a_job_is_checkpointed_snapshot_and_requeued_before_its_time_limit_and_resumes(cluster):
    from pathlib import Path

    repo_root = Path(__file__).resolve().parents[2]
    train = cluster.write_user_file("timelimit-train.py", (repo_root / "examples" / "train.py").read_text(),
                                    mode=0o755)
    out = cluster.make_user_dir(f"timelimit-{time.monotonic_ns()}")
    jid = cluster.sbatch("-N3", "--ntasks-per-node=1", "-c1", "--time=2", "--requeue", "--open-mode=append",
                         "--snapshot-before-timelimit=60s", "--snapshot-volumes=scratch,pfs",
                         "-o", f"{out}/slurm-%j.out", script=TRAIN.format(python=cluster.python, train=train))
    log = out / f"slurm-{jid}.out"
    try:
        started = time.monotonic()
        cluster.wait_state(jid, "RUNNING", timeout=90)
        # The cli_filter turned the option into Slurm's signal, at the margin.
        shown = cluster.run(["scontrol", "show", "job", "-o", str(jid)], host="ctl").stdout
        assert "Requeue=1" in shown and "TimeLimit=00:02:00" in shown, shown

        def finished():
            return [s for s in cluster.inventory(_sets, jid) if s[2] not in ("PENDING", "QUIESCING", "CUTTING", "CUT")]
        done = _wait(finished, 240, lambda: f"no finished time-limit set; hook log:\n{cluster.hook_log()[-4000:]}"
                     f"\njob output:\n{_text(log)[-3000:]}")
        assert len(done) == 1, done
        set_id, trigger, state, consistency, reason, step, epoch, release = done[0]
        assert (trigger, state, consistency, epoch) == ("timelimit", "COMPLETE", "app-consistent", "preempt-0"), reason
        # Rank 0 requeued it once every rank had acknowledged: before the limit.
        assert release == "early", done
        assert time.monotonic() - started < 120 + 30, "the set came only after the time limit"
        acks = cluster.inventory(lambda repo, sid: [(a.rank, a.step) for a in repo.acks(sid)], set_id)
        assert sorted(r for r, _s in acks) == [0, 1, 2] and {s for _r, s in acks} == {step}, acks

        # The report row says why the set was taken.
        proc = cluster.cli("report", "-j", str(jid), "--json")
        assert proc.returncode == 0, proc.stderr
        rows = json.loads(proc.stdout)["sets"]
        assert [(r["set_id"], r["trigger"]) for r in rows] == [(set_id, "timelimit")], proc.stdout[:3000]
        table = cluster.cli("report", "-j", str(jid), "-p", "-o", "JobID,SetID,Trigger,Step").stdout
        assert f"|{set_id}|timelimit|{step}|" in table, table

        # The requeued run resumes every rank from the set, at step + 1, as one model.
        def resumed():
            text = _text(log)
            after = text[text.find("resumed from step"):] if "resumed from step" in text else ""
            return len(RESUMED.findall(text)) >= 3 and \
                len({r for s, r, _h in PARAMS.findall(after) if int(s) == step + 1}) == 3
        _wait(resumed, 180, lambda: f"the requeued run did not resume:\n{_text(log)[-4000:]}")
        text = _text(log)
        assert {int(s) for s, _src in RESUMED.findall(text)} == {step}
        assert all("/.snapshots/" in src for _s, src in RESUMED.findall(text))
        first = {h for s, _r, h in PARAMS.findall(text[text.find("resumed from step"):]) if int(s) == step + 1}
        assert len(first) == 1, first
        job = cluster.job(jid)
        assert job is not None and job.restart_count == 1, job
        # One requeue: the job did not reach its limit (no TIMEOUT kill line).
        assert "DUE TO TIME LIMIT" not in text
        show = cluster.cli("show", str(jid)).stdout
        assert "time limit: last acknowledgement" in show and re.search(r"trigger timelimit", show), show
    finally:
        cluster.cancel(jid)
