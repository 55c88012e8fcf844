"""--snapshot-before-timelimit (issue 33 item 1) without a cluster: rank 0
tells the time limit's signal from a preemption's and a cancellation's by
what `scontrol show job` prints, writes the time-limit record before it
requeues; a job that reached its limit is snapshot and requeued by
EpilogSlurmctld; the option is checked at submit time. What Slurm 22.05
printed is quoted from a dev-cluster run (docs/design.md, "Time limits");
tests/integration/test_timelimit_cluster.py runs the real thing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import datetime, timezone
from functools import partial

import pytest
import signal_delivery

from protocol_fixtures import make_env
from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.cli import main
from slurm_snap.client import Checkpointer, early, reason
from slurm_snap.hooks.run import run_named
from slurm_snap.jobdir import JobDir, is_ack_name
from slurm_snap.jobrecords import SIGNAL_SLACK, Ack, JobRecord, TimeLimitRecord
from testkit.inventory_helpers import sets_of_job

JOB = "88"


def show(left: float, *, preempt: str = "None", requeue: str = "1", now: float | None = None) -> str:
    """`scontrol show job -o` as 22.05 prints it, with EndTime `left` s away (local time)."""
    end = datetime.fromtimestamp((now or time.time()) + left).strftime("%Y-%m-%dT%H:%M:%S")
    return (f"JobId={JOB} JobName=train JobState=RUNNING Reason=None Requeue={requeue} Restarts=0 "
            f"RunTime=00:01:00 TimeLimit=00:02:00 EndTime={end} PreemptTime={preempt} ")


def fields(text: str) -> dict[str, str]:
    return early.job_state(JOB, lambda args: subprocess.CompletedProcess(args, 0, text, ""))


# Each scontrol text is made when its test runs (EndTime is relative to now):
# a loaded or parallel run may reach a case minutes after collecting it.
@pytest.mark.parametrize("text, early_release, margin, want", [
    # The time limit's signal: up to 60 s before the margin, and some checkpoint time.
    (partial(show, 63), False, 60, (True, "timelimit")),
    (partial(show, 175), False, 60, (True, "timelimit")),
    # Far from the limit: a cancellation's SIGTERM (or a hand-sent signal), never a requeue.
    (partial(show, 400), True, 60, (False, "")),
    # A preemption is requeued early only where the site allows it, time limit or not.
    (partial(show, 63, preempt="2026-12-03T10:05:00"), True, 60, (True, "preempt")),
    (partial(show, 63, preempt="2026-12-03T10:05:00"), False, 60, (False, "preempt")),
    # Without the option a job near its limit is left alone.
    (partial(show, 63), True, None, (False, "")),
    # Slurm may not requeue it: nothing.
    (partial(show, 63, requeue="0"), False, 60, (False, "timelimit")),
])
def test_rank_0_tells_the_time_limit_from_a_preemption_and_a_cancellation(text, early_release, margin, want):
    verdict = early.judge(fields(text()), early_release=early_release, margin=margin)
    assert (verdict.requeue, verdict.trigger) == want, verdict


def test_a_job_without_end_time_is_no_time_limit():
    text = show(63).replace(show(63).split("EndTime=")[1].split()[0], "Unknown")
    verdict = early.judge(fields(text), early_release=False, margin=60)
    assert not verdict.requeue and "no EndTime" in verdict.why


# --- a rank's question: is this USR1 a reason to checkpoint? --------------------
# Main's stray-signal rule (client/reason.py) checkpoints only for a request
# or a PreemptTime; the time limit's --signal=USR1@MARGIN has neither, so a
# job that asked for --snapshot-before-timelimit must be let through by its
# EndTime, and a job that did not must still see it as stray.

NOW = 1_800_000_000   # a whole second: EndTime has one-second resolution


def _says(text: str):
    return lambda args: subprocess.CompletedProcess(args, 0, text, "")


@pytest.mark.parametrize("left, margin, want", [
    (63, 60, reason.TIMELIMIT),                  # the signal at the margin
    (60 + SIGNAL_SLACK, 60, reason.TIMELIMIT),   # as early as Slurm and the slack allow
    (61 + SIGNAL_SLACK, 60, reason.STRAY),       # one second further: not the limit's
    (400, 60, reason.STRAY),                     # a hand-sent USR1 mid-run
    (63, None, reason.STRAY),                    # a job that did not ask: its own --signal is stray
])
def test_a_rank_checkpoints_for_the_time_limit_only_when_the_job_asked_and_it_is_near(tmp_path, left, margin, want):
    got = reason.checkpoint_reason(JobDir(str(tmp_path), JOB), _says(show(left, now=NOW)), margin=margin, now=NOW)
    assert got == want


def test_an_end_time_slurm_does_not_show_is_no_reason_to_skip_the_time_limit(tmp_path):
    text = show(63, now=NOW).replace(show(63, now=NOW).split("EndTime=")[1].split()[0], "Unknown")
    jd = JobDir(str(tmp_path), JOB)
    assert reason.checkpoint_reason(jd, _says(text), margin=60, now=NOW) == reason.TIMELIMIT
    assert reason.checkpoint_reason(jd, _says(text), margin=None, now=NOW) == reason.STRAY


def test_a_preemption_stays_a_preemption_for_a_job_that_asked(tmp_path):
    text = show(4000, preempt="2026-12-03T10:05:00", now=NOW)
    assert reason.checkpoint_reason(JobDir(str(tmp_path), JOB), _says(text), margin=60, now=NOW) \
        == reason.PREEMPTION


@pytest.fixture
def handlers():
    with signal_delivery.handlers_restored() as made:
        yield made


@pytest.mark.parametrize("margin, left, checkpoints", [("60", 100, True), ("60", 1000, False), ("", 100, False)])
def test_the_time_limits_usr1_is_a_checkpoint_and_nothing_else_is(tmp_path, monkeypatch, handlers, margin, left,
                                                                  checkpoints):
    """Through the Checkpointer, with a stand-in scontrol where the client looks."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho '{show(left)}'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("SLURM_SNAP_SLURM_BIN", str(bin_dir))
    (tmp_path / "barrier" / JOB).mkdir(parents=True)
    ckpt = Checkpointer(barrier_dir=str(tmp_path / "barrier"), job_id=JOB, node="n1", rank=0, local_rank=0,
                        local_size=1, env={"SLURM_SNAP_TIMELIMIT_MARGIN": margin}).install()
    handlers.append(ckpt)
    signal_delivery.deliver(signal.SIGUSR1, ckpt)
    assert ckpt.decide(1).checkpoint is checkpoints
    assert ckpt.ignored_signals == (0 if checkpoints else 1)
    if checkpoints:
        assert ckpt.epoch() == "preempt-0"


class Scontrol:
    def __init__(self, text):
        self.text, self.calls = text, []

    def __call__(self, args):
        self.calls.append(args)
        if args[:2] == ["show", "job"]:
            return subprocess.CompletedProcess(args, 0, self.text, "")
        return subprocess.CompletedProcess(args, 0, "", "")


def acked(tmp_path, world=3, epoch="preempt-0") -> JobDir:
    jd = JobDir(str(tmp_path), JOB)
    jd.ensure(os.getuid())
    for rank in range(world):
        with open(jd.ack_path(f"n{rank}", rank), "wb") as f:
            f.write(Ack(job_id=JOB, epoch=epoch, node=f"n{rank}", rank=rank, local_rank=0, local_size=1, step=9,
                        written_at=datetime.now(timezone.utc), manifest=[], world_size=world).to_bytes())
    return jd


def test_rank_0_writes_the_time_limit_record_then_requeues(tmp_path):
    jd = acked(tmp_path)
    seen = {}

    class Recording(Scontrol):
        def __call__(self, args):
            if args[0] == "requeue":
                seen["record"] = jd.read_timelimit("preempt-0")   # on disk before the call
            return super().__call__(args)
    sc = Recording(show(70))
    w = early.EarlyRelease(jd, "preempt-0", 3, deadline=time.monotonic() + 5, run=sc, early_release=False,
                           margin=60).start()
    w.join(5)
    assert sc.calls == [["show", "job", "-o", JOB], ["requeue", JOB]] and w.outcome == "requeued"
    record = seen["record"]
    assert (record.epoch, record.by, record.margin) == ("preempt-0", "rank 0", 60) and 0 < record.left <= 70
    assert jd.read_early("preempt-0").decision == "requeued"
    # Not an acknowledgement to anyone listing ack/.
    assert not is_ack_name(os.path.basename(jd.timelimit_path("preempt-0")))


def test_without_scontrol_rank_0_asks_the_node_hook_which_requeues(tmp_path, monkeypatch):
    """A container with no Slurm commands: rank 0 writes `asked`; the node's
    hook outside the container (the SPANK plugin starts it) decides with
    Slurm's answer and requeues, before the time limit as rank 0 would."""
    jd = acked(tmp_path)
    monkeypatch.setattr(early, "scontrol", lambda: None)
    w = early.EarlyRelease(jd, "preempt-0", 3, deadline=time.monotonic() + 5, early_release=True,
                           margin=60).start()
    w.join(5)
    assert w.outcome == "asked" and "no scontrol" in jd.read_early("preempt-0").why
    assert jd.read_timelimit("preempt-0") is None
    sc = Scontrol(show(70))
    out = early.watch_for_asked(jd, "preempt-0", parent=os.getpid(), early_release=False, margin=60, run=sc)
    assert out == "requeued" and sc.calls[-1] == ["requeue", JOB]
    assert jd.read_timelimit("preempt-0").by == "node hook" and jd.read_early("preempt-0").decision == "requeued"


def test_the_node_hook_leaves_when_its_step_ends_and_ignores_rank_0s_own_decisions(tmp_path):
    jd = acked(tmp_path)
    sc = Scontrol(show(70))
    # Its slurmstepd is gone: nothing to do.
    assert early.watch_for_asked(jd, "preempt-0", parent=-1, early_release=True, margin=60, run=sc) == ""
    # Rank 0 had scontrol and decided itself: nothing to do either.
    early.EarlyRelease(jd, "preempt-0", 3, deadline=0, run=Scontrol(show(70)), margin=60).requeue_now(
        time.time(), by="rank 0")
    assert early.watch_for_asked(jd, "preempt-0", parent=os.getpid(), early_release=True, margin=60, run=sc) == ""
    assert sc.calls == []


def test_the_margin_reaches_rank_0_even_where_early_release_is_off(tmp_path):
    jd = JobDir(str(tmp_path), JOB)
    jd.ensure(os.getuid())
    f = tmp_path / "ckpt.pt"
    f.write_bytes(b"x")
    env = {"SLURM_JOB_ID": JOB, "SLURM_SNAP_BARRIER_DIR": str(tmp_path), "SLURMD_NODENAME": "n1",
           "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_SNAP_EARLY_RELEASE": "0",
           "SLURM_SNAP_TIMELIMIT_MARGIN": "60"}
    k = Checkpointer(env=env)
    k.commit(5, [f])
    assert k._early is not None and k._early.margin == 60 and not k._early.early_release
    k._early.stop()
    assert Checkpointer(env={**env, "SLURM_SNAP_TIMELIMIT_MARGIN": ""}).timelimit_margin is None
    with pytest.raises(errors.BadValueError, match="SLURM_SNAP_TIMELIMIT_MARGIN"):
        Checkpointer(env={**env, "SLURM_SNAP_TIMELIMIT_MARGIN": "1m"})


RECORD = TimeLimitRecord(epoch="preempt-2", at=1.8e9, by="epilog-slurmctld", margin=60, left=None, why="x")


def test_the_record_round_trips_and_names_what_is_wrong():
    assert TimeLimitRecord.parse(json.loads(json.dumps(RECORD.to_json()))) == RECORD
    for field, value in (("by", "rank 1"), ("margin", 0), ("margin", 70000), ("epoch", "../x"), ("at", "soon"),
                         ("left", "a lot")):
        doc = {**RECORD.to_json(), field: value}
        with pytest.raises(errors.BadValueError, match=f"time-limit record field '{field}'"):
            TimeLimitRecord.parse(doc)
    with pytest.raises(errors.BadValueError, match="unknown key"):
        TimeLimitRecord.parse({**RECORD.to_json(), "extra": 1})


# --- the hooks ------------------------------------------------------------------

SQUEUE = """#!/bin/sh
echo '{json}'
"""
SCONTROL = """#!/bin/sh
echo "$@" >> {calls}
"""


@pytest.fixture
def hook_env(tmp_path, monkeypatch):
    env = make_env(tmp_path, nodes=("n1",), shared=False)
    now = int(time.time())
    squeue = tmp_path / "squeue"
    squeue.write_text(SQUEUE.format(json=json.dumps({"jobs": [
        # What 22.05's squeue showed of a job killed at its limit, during its epilogs.
        {"job_id": env.job_id, "job_state": "COMPLETING", "state_reason": "TimeLimit", "preempt_time": 0,
         "restart_cnt": 0, "end_time": now - 2}]})))
    scontrol = tmp_path / "scontrol"
    env.calls = tmp_path / "scontrol.calls"
    scontrol.write_text(SCONTROL.format(calls=env.calls))
    for p in (squeue, scontrol):
        p.chmod(0o755)
    monkeypatch.setenv("SLURM_SNAP_SQUEUE", str(squeue))
    monkeypatch.setenv("SLURM_SNAP_SCONTROL", str(scontrol))
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    for k, v in {"SLURM_JOB_ID": str(env.job_id), "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GID": "0",
                 "SLURM_JOB_USER": "alice", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_PARTITION": "low",
                 "SLURM_JOB_RESTART_COUNT": "0", "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
                 "SPANK_SLURM_SNAP": "1", "SPANK_SLURM_SNAP_TIMELIMIT": "1m",
                 "SPANK_SLURM_SNAP_VOLUMES": "scratch"}.items():
        monkeypatch.setenv(k, v)
    jd = JobDir(env.cfg.paths.barrier_dir, env.job_id)
    jd.ensure(os.getuid())
    jd.write_job(JobRecord(job_id=env.job_id, restart_count=0, user="alice", nodes=("n1",), signal="USR1",
                           volumes=()))
    env.jd = jd
    return env


def _ack_all(env, world=2):
    for rank in range(world):
        with open(env.jd.ack_path("n1", rank), "wb") as f:
            f.write(Ack(job_id=str(env.job_id), epoch="preempt-0", node="n1", rank=rank, local_rank=rank,
                        local_size=world, step=9, written_at=datetime.now(timezone.utc), manifest=[],
                        world_size=world).to_bytes())


def _log(env) -> dict:
    with open(os.path.join(env.cfg.paths.log_dir, "hooks.log")) as f:
        return json.loads(f.read().splitlines()[-1])


def test_epilogslurmctld_requeues_a_job_that_reached_its_limit_after_recording_why(hook_env):
    _ack_all(hook_env)
    assert run_named(hook_env.cfg.path, "epilog-slurmctld") == 0
    rec = _log(hook_env)
    assert rec["status"] == "ok" and "stopped for its time limit" in rec["message"] \
        and rec["message"].endswith("; requeued"), rec
    assert hook_env.calls.read_text().split() == ["requeue", str(hook_env.job_id)]
    record = hook_env.jd.read_timelimit("preempt-0")
    assert (record.by, record.margin) == ("epilog-slurmctld", 60)
    with hook_env.inv.session() as repo:
        (st,) = sets_of_job(repo, hook_env.job_id)
        assert (st.epoch, st.trigger, st.state) == ("preempt-0", "timelimit", S.QUIESCING)
        assert any("opened at its time limit" in e.message for e in repo.events(set_id=st.id))


def test_a_run_whose_ranks_did_not_all_checkpoint_is_not_requeued(hook_env):
    """It would come back to the same point, and again at its next limit."""
    with open(hook_env.jd.ack_path("n1", 0), "wb") as f:
        f.write(Ack(job_id=str(hook_env.job_id), epoch="preempt-0", node="n1", rank=0, local_rank=0, local_size=2,
                    step=9, written_at=datetime.now(timezone.utc), manifest=[], world_size=2).to_bytes())
    assert run_named(hook_env.cfg.path, "epilog-slurmctld") == 0
    assert "not requeued: not every rank acknowledged" in _log(hook_env)["message"]
    assert not hook_env.calls.exists() and hook_env.jd.read_timelimit("preempt-0") is None


def test_a_requeued_run_is_known_by_its_record_when_squeue_no_longer_says_timelimit(hook_env, monkeypatch):
    """The node Epilogs after rank 0's requeue: no PreemptTime, no TimeLimit reason."""
    squeue = os.environ["SLURM_SNAP_SQUEUE"]
    with open(squeue, "w") as f:
        f.write(SQUEUE.format(json=json.dumps({"jobs": [
            {"job_id": hook_env.job_id, "job_state": "COMPLETING", "state_reason": "None", "preempt_time": 0,
             "restart_cnt": 1}]})))
    monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", "1")
    assert run_named(hook_env.cfg.path, "epilog-slurmctld") == 0
    assert _log(hook_env)["message"] == "neither preempted nor stopped for its time limit"
    hook_env.jd.write_timelimit(TimeLimitRecord(epoch="preempt-0", at=time.time(), by="rank 0", margin=60))
    assert run_named(hook_env.cfg.path, "epilog-slurmctld") == 0
    assert "stopped for its time limit" in _log(hook_env)["message"] and not hook_env.calls.exists()
    with hook_env.inv.session() as repo:
        assert [s.trigger for s in sets_of_job(repo, hook_env.job_id)] == ["timelimit"]


@pytest.mark.parametrize("on_preempt, record, want", [
    ("", True, "timelimit"), ("", False, "timelimit"), ("1", True, "timelimit"), ("1", False, "preempt")])
def test_a_node_epilog_that_cannot_ask_squeue_tells_the_time_limit_by_the_files(hook_env, monkeypatch, on_preempt,
                                                                                record, want):
    """slurmctld away at the node Epilog: every local rank acknowledged the
    run's epoch, so it stopped for a snapshot (main's offline path); the
    time-limit record says it was the limit, and without one the job's
    options (a job that asked only for the time limit checkpoints for
    nothing else)."""
    with open(os.environ["SLURM_SNAP_SQUEUE"], "w") as f:
        f.write("#!/bin/sh\necho 'squeue: error: Unable to contact slurm controller' >&2\nexit 1\n")
    monkeypatch.setenv("SLURM_SCRIPT_CONTEXT", "epilog")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    if on_preempt:
        monkeypatch.setenv("SPANK_SLURM_SNAP_ON_PREEMPT", "1")
    _ack_all(hook_env)
    if record:
        hook_env.jd.write_timelimit(TimeLimitRecord(epoch="preempt-0", at=time.time() - 5, by="rank 0", margin=60))
    assert run_named(hook_env.cfg.path, "epilog") == 0
    rec = _log(hook_env)
    assert rec["status"] == "ok" and "squeue failed" in rec["message"] \
        and "every local rank of n1 acknowledged preempt-0" in rec["message"], rec
    with hook_env.inv.session() as repo:
        (st,) = sets_of_job(repo, hook_env.job_id)
        assert st.trigger == want


def test_the_margin_is_checked_at_submit_time(write_config, capsys):
    path = write_config('[inventory]\nurl = "sqlite:////tmp/x.db"\n')
    assert main(["--config", path, "hook", "validate-options", "--before-timelimit", "5m"]) == 0
    assert "SLURM_SNAP_TIMELIMIT_MARGIN=300\n" in capsys.readouterr().out
    for bad, why in (("60", "bare number"), ("5s", "10 s to 65535 s"), ("1d", "10 s to 65535 s"),
                     ("soon", "not a duration")):
        assert main(["--config", path, "hook", "validate-options", "--before-timelimit", bad]) == errors.USAGE
        err = capsys.readouterr().err
        assert "--snapshot-before-timelimit" in err and bad in err, err
