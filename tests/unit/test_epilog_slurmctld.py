"""EpilogSlurmctld must see a preemption (issue 21 item 7).

Measured on Slurm 22.05 (docs/design.md, "What the epilogs see at a
preemption"): the slurmctld hooks run with no SLURM_CONF, so on a cluster
whose slurm.conf is not at Slurm's default path their squeue failed, and the
hook logged "not preempted" 70 ms after slurmctld requeued the job. Here a
squeue that answers only with the cluster's SLURM_CONF (as the real one
does) stands in for slurmctld; tests/integration/test_preempt_load.py runs
the real one.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest

from protocol_fixtures import make_env
from slurm_snap import states as S
from slurm_snap.hooks.run import run_named
from testkit.inventory_helpers import sets_of_job

FAKE_SQUEUE = """#!/bin/sh
# squeue --json as slurmctld answers it, but only through the cluster's slurm.conf
if [ "$SLURM_CONF" != "{conf}" ]; then
    echo "squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host" >&2
    echo "squeue: error: fetch_config: DNS SRV lookup failed" >&2
    exit 1
fi
echo '{json}'
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    env = make_env(tmp_path, nodes=("n1",), shared=False)
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text("# the cluster's slurm.conf\n")
    env.slurm_conf = str(conf)
    env.kill = int(time.time())
    squeue = tmp_path / "squeue"
    squeue.write_text(FAKE_SQUEUE.format(conf=conf, json=json.dumps({"jobs": [
        {"job_id": env.job_id, "job_state": "COMPLETING", "preempt_time": env.kill, "restart_cnt": 1}]})))
    squeue.chmod(0o755)
    monkeypatch.setenv("SLURM_SNAP_SQUEUE", str(squeue))
    # What slurmctld gives EpilogSlurmctld (measured): no SLURM_CONF, no SLURMD_NODENAME.
    # set first, so that the SLURM_CONF the hook adopts is undone after the test too
    monkeypatch.setenv("SLURM_CONF", "")
    monkeypatch.delenv("SLURM_CONF")
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    for k, v in {"SLURM_JOB_ID": str(env.job_id), "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "1000",
                 "SLURM_JOB_USER": "alice", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_PARTITION": "low",
                 "SLURM_JOB_RESTART_COUNT": "1", "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
                 "SPANK_SLURM_SNAP": "1", "SPANK_SLURM_SNAP_ON_PREEMPT": "1",
                 "SPANK_SLURM_SNAP_VOLUMES": "scratch"}.items():
        monkeypatch.setenv(k, v)
    return env


def _config(env, conf: str | None) -> str:
    path = os.path.join(env.tmp, "with-slurm.toml")
    text = open(env.cfg.path).read()
    if conf is not None:
        text += f'[slurm]\nconf = "{conf}"\n'
    with open(path, "w") as f:
        f.write(text)
    return path


def _log(env) -> dict:
    with open(os.path.join(env.cfg.paths.log_dir, "hooks.log")) as f:
        return json.loads(f.read().splitlines()[-1])


def test_with_the_clusters_slurm_conf_it_opens_the_set(env, capsys):
    assert run_named(_config(env, env.slurm_conf), "epilog-slurmctld") == 0
    rec = _log(env)
    assert rec["status"] == "ok" and re.fullmatch(r"preempted at \d+: set \d+ opened", rec["message"]), rec
    with env.inv.session() as repo:
        (st,) = sets_of_job(repo, env.job_id)
        assert (st.epoch, st.trigger, st.state) == ("preempt-0", "preempt", S.QUIESCING)
        assert any("opened at preemption" in e.message for e in repo.events(set_id=st.id))
    assert "SLURM_CONF" in os.environ and os.environ["SLURM_CONF"] == env.slurm_conf


def test_a_squeue_that_fails_is_a_recorded_failure_not_not_preempted(env, capsys):
    """Before the fix: exit 0 and 'not preempted' in hooks.log, nothing recorded."""
    assert run_named(_config(env, None), "epilog-slurmctld") == 0      # policy open: never drains
    rec = _log(env)
    assert rec["status"] == "failed" and "squeue exited with status 1" in rec["message"], rec
    assert "not preempted" not in rec["message"]
    with env.inv.session() as repo:
        assert sets_of_job(repo, env.job_id) == []
        assert any(e.kind == "hook-failed" and "squeue" in e.message for e in repo.events(job_id=env.job_id))


def test_slurmds_own_slurm_conf_wins_over_the_config(env, monkeypatch, capsys):
    """A node's slurmd passes SLURM_CONF to its hooks: that is Slurm's word."""
    monkeypatch.setenv("SLURM_CONF", env.slurm_conf)
    assert run_named(_config(env, "/somewhere/else/slurm.conf"), "epilog-slurmctld") == 0
    assert re.fullmatch(r"preempted at \d+: set \d+ opened", _log(env)["message"])


def test_doctor_names_the_missing_setting():
    from slurm_snap import config
    from slurm_snap.doctor import slurm_checks

    cfg = config.from_dict({})
    bad = [f for f in slurm_checks.check_slurm(cfg, {"SLURM_CONF": "/var/tmp/dev/etc/slurm.conf"}, [], "")
           if "slurmctld hooks reach Slurm" in f.what]
    assert len(bad) == 1 and not bad[0].ok and '[slurm] conf = "/var/tmp/dev/etc/slurm.conf"' in bad[0].fix
    cfg = config.from_dict({"slurm": {"conf": "/var/tmp/dev/etc/slurm.conf"}})
    (good,) = [f for f in slurm_checks.check_slurm(cfg, {"SLURM_CONF": "/var/tmp/dev/etc/slurm.conf"}, [], "")
               if "slurmctld hooks reach Slurm" in f.what]
    assert good.ok


def test_after_the_node_epilogs_finished_the_set_it_says_so(env, capsys):
    """Under load the node Epilogs may open and finalize the set first: then
    EpilogSlurmctld's words say what it found, not "opened"."""
    from slurm_snap.protocol import preempt

    cfg = _config(env, env.slurm_conf)
    assert run_named(cfg, "epilog-slurmctld") == 0
    with env.inv.session() as repo:
        (st,) = sets_of_job(repo, env.job_id)
        repo.transition(st.id, S.CUTTING)
        repo.transition(st.id, S.FAILED, reason="test")
    assert run_named(cfg, "epilog-slurmctld") == 0
    assert re.fullmatch(r"preempted at \d+: set \d+ already FAILED", _log(env)["message"]), _log(env)
    with env.inv.session() as repo:
        last = repo.events(set_id=st.id)[-1].message
    assert "(already FAILED: opened by a node Epilog)" in last
