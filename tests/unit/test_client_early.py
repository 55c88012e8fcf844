"""Early release at preemption (issue 16), rank 0's side: requeue only when
every rank acknowledged a preemption epoch and Slurm says the job is being
preempted and may be requeued. The scontrol calls are injected here (what
`scontrol show job -o` prints is its documented one-line KEY=VALUE form);
tests/integration/test_early_release_cluster.py runs the real one."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest

from slurm_snap.client import Checkpointer, early
from slurm_snap.jobrecords import Ack
from slurm_snap.errors import BadValueError
from slurm_snap.fsio import write_json
from slurm_snap.jobdir import JobDir

JOB = "88"
PREEMPTED = ("JobId=88 JobName=train UserId=u(1000) JobState=RUNNING Reason=None Requeue=1 Restarts=0 "
             "PreemptEligibleTime=2026-12-01T10:00:00 PreemptTime=2026-12-01T10:05:00 ")


class Scontrol:
    """Records the argv it was called with and answers like scontrol."""

    def __init__(self, show=PREEMPTED, requeue_rc=0):
        self.show, self.requeue_rc, self.calls = show, requeue_rc, []

    def __call__(self, args):
        self.calls.append(args)
        if args[:2] == ["show", "job"]:
            return subprocess.CompletedProcess(args, 0, self.show, "")
        return subprocess.CompletedProcess(args, self.requeue_rc, "", "" if not self.requeue_rc else "denied")


def jobdir(tmp_path) -> JobDir:
    jd = JobDir(str(tmp_path), JOB)
    jd.ensure(0)
    return jd


def ack(jd: JobDir, rank: int, epoch="preempt-0", node="n1"):
    data = Ack(job_id=JOB, epoch=epoch, node=node, rank=rank, local_rank=0, local_size=1, step=5,
               written_at=datetime.now(timezone.utc), manifest=[], world_size=3).to_bytes()
    with open(jd.ack_path(f"n{rank}", rank), "wb") as f:
        f.write(data)


def watch(jd, run, epoch="preempt-0", world=3, seconds=5.0):
    w = early.EarlyRelease(jd, epoch, world, deadline=time.monotonic() + seconds, run=run).start()
    return w


def test_requeues_once_every_rank_acknowledged(tmp_path):
    jd, sc = jobdir(tmp_path), Scontrol()
    ack(jd, 0)
    w = watch(jd, sc)
    time.sleep(0.3)
    assert sc.calls == []                 # two ranks still writing: nothing yet
    ack(jd, 1)
    ack(jd, 2)
    w.join(5)
    assert sc.calls == [["show", "job", "-o", JOB], ["requeue", JOB]]
    assert w.outcome == "requeued"
    decision = jd.read_early("preempt-0")
    assert decision.decision == "requeued" and decision.all_acknowledged_at <= decision.at


@pytest.mark.parametrize("show,why", [
    (PREEMPTED.replace("PreemptTime=2026-12-01T10:05:00", "PreemptTime=None"), "no PreemptTime"),
    (PREEMPTED.replace("Requeue=1", "Requeue=0"), "Requeue=0"),
])
def test_a_cancellation_or_a_job_without_requeue_is_left_to_slurm(tmp_path, show, why):
    """A plain scancel's first SIGTERM is a checkpoint request too: it must
    stay a cancellation, and a --no-requeue job must not come back."""
    jd, sc = jobdir(tmp_path), Scontrol(show=show)
    for r in range(3):
        ack(jd, r)
    w = watch(jd, sc)
    w.join(5)
    assert sc.calls == [["show", "job", "-o", JOB]]
    assert w.outcome == "kept" and why in jd.read_early("preempt-0").why


def test_acknowledgements_of_another_epoch_do_not_count(tmp_path):
    jd, sc = jobdir(tmp_path), Scontrol()
    ack(jd, 0)
    ack(jd, 1, epoch="s123")
    ack(jd, 2, epoch="s123")
    w = watch(jd, sc, seconds=0.5)
    w.join(5)
    assert sc.calls == [] and w.outcome == "waited"


def test_a_failing_requeue_is_recorded_not_raised(tmp_path):
    jd, sc = jobdir(tmp_path), Scontrol(requeue_rc=1)
    for r in range(3):
        ack(jd, r)
    w = watch(jd, sc)
    w.join(5)
    assert w.outcome == "failed" and "denied" in jd.read_early("preempt-0").why


def test_only_rank_0_of_a_preemption_epoch_watches_and_only_when_allowed(tmp_path):
    jd = jobdir(tmp_path)
    f = tmp_path / "ckpt.pt"
    f.write_bytes(b"x")
    env = {"SLURM_JOB_ID": JOB, "SLURM_SNAP_BARRIER_DIR": str(tmp_path), "SLURMD_NODENAME": "n1",
           "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_SNAP_EARLY_RELEASE": "1"}
    on = Checkpointer(env=env)
    on.commit(5, [f])
    assert on._early is not None and on._early.epoch == "preempt-0"
    on._early.stop()
    # Not allowed by the site, another rank, or an on-demand epoch: no watcher.
    assert Checkpointer(env={**env, "SLURM_SNAP_EARLY_RELEASE": "0"})._early is None
    other = Checkpointer(env={**env, "SLURM_PROCID": "1"})
    other.commit(5, [f])
    assert other._early is None
    write_json(jd.file("request.json"), {"job_id": JOB, "epoch": "s9", "requested_at": time.time(),
                                         "deadline": time.time() + 60})
    demand = Checkpointer(env=env)
    demand._flag.requests = 1        # an on-demand request being served
    demand.commit(5, [f])
    assert demand._early is None
    # The decision file is no acknowledgement to anyone who lists ack/.
    from slurm_snap.jobdir import is_ack_name

    assert not is_ack_name(jd.early_path("preempt-0").rsplit("/", 1)[1])



class KilledInRequeue(Scontrol):
    """scontrol whose requeue does not return while the test looks (Slurm's
    ends the calling process): what rank 0 wrote before the call is all the
    Epilog would find."""

    def __init__(self, jd):
        super().__init__()
        self.jd, self.on_disk, self.inside, self.done = jd, None, threading.Event(), threading.Event()

    def __call__(self, args):
        if args[0] == "requeue":
            self.calls.append(args)
            self.on_disk = self.jd.read_early("preempt-0")
            self.inside.set()
            self.done.wait(10)
            return subprocess.CompletedProcess(args, 0, "", "")
        return super().__call__(args)


def test_the_intent_is_on_disk_before_the_requeue_ends_the_job(tmp_path):
    from slurm_snap.protocol.preemptset import release_of

    jd = jobdir(tmp_path)
    sc = KilledInRequeue(jd)
    for r in range(3):
        ack(jd, r)
    w = watch(jd, sc)
    try:
        assert sc.inside.wait(5)
        # Written before the call, with the moment the request went out; while
        # the call has not returned, that is what the Epilog reads.
        assert sc.on_disk.decision == "requeueing" and sc.on_disk.all_acknowledged_at <= sc.on_disk.at
        assert jd.read_early("preempt-0") == sc.on_disk
        # ... and counts as the early release it is, at that moment.
        when, how = release_of(sc.on_disk, None)
        assert how == "early" and abs(when.timestamp() - sc.on_disk.at) < 1e-5
    finally:
        sc.done.set()
        w.join(5)
    # Had the process lived, the outcome replaces it, keeping the moment.
    final = jd.read_early("preempt-0")
    assert (final.decision, final.at) == ("requeued", sc.on_disk.at) and w.outcome == "requeued"


def test_a_scontrol_killed_by_the_requeue_it_made_leaves_the_intent(tmp_path):
    """scontrol runs inside the job, so the requeue's own kill can end it
    before it exits 0: that is not a failed requeue."""
    class KilledScontrol(Scontrol):
        def __call__(self, args):
            if args[0] == "requeue":
                self.calls.append(args)
                return subprocess.CompletedProcess(args, -15, "", "")
            return super().__call__(args)

    jd, sc = jobdir(tmp_path), KilledScontrol()
    for r in range(3):
        ack(jd, r)
    watch(jd, sc).join(5)
    assert sc.calls[-1] == ["requeue", JOB]
    assert jd.read_early("preempt-0").decision == "requeueing"


def test_epilog_reads_the_decision_without_following_what_the_user_planted(tmp_path):
    """ack/ is the job user's: the Epilog (root) reads rank 0's decision with
    the owner's uid, so a symbolic link, a FIFO or a hard link planted under
    the decision's name is refused with its reason, never followed."""
    jd = jobdir(tmp_path)
    me = os.getuid()
    path = jd.early_path("preempt-0")
    secret = tmp_path / "secret.json"
    secret.write_text('{"not": "a decision"}')
    os.symlink(secret, path)
    with pytest.raises(BadValueError, match="symbolic link"):
        jd.read_early("preempt-0", me)
    os.unlink(path)
    os.mkfifo(path)
    with pytest.raises(BadValueError, match="not a regular file"):
        jd.read_early("preempt-0", me)
    os.unlink(path)
    os.link(secret, path)
    with pytest.raises(BadValueError, match="hard links"):
        jd.read_early("preempt-0", me)
    os.unlink(path)
    assert jd.read_early("preempt-0", me) is None        # nothing written: no decision
    secret.rename(path)
    if me == 0:
        os.chown(path, 12345, -1)                        # root's own files always pass: another user's
    with pytest.raises(BadValueError, match="owned by uid"):
        jd.read_early("preempt-0", 4242)
