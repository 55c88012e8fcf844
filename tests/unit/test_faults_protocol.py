"""Faults during a snapshot: a backend tool that hangs, fails or is missing;
the coordinator SIGKILLed at the phases test_protocol_repair.py does not
cover; a rank that dies right after acknowledging; a requeue while the
preempted run's set is still being finalized; clocks of ranks that disagree
with the coordinator's.

Expected for each: the command exits as documented, the set ends in an
honest state with the reason, `repair` leaves no orphan snapshot, ranks are
released, and nothing already recorded is lost.
(Covered elsewhere, not repeated: SIGKILL at signalled/barrier/cut-part/
record/recorded -- test_protocol_repair.py; one node's backend failing --
test_protocol_coordinator.py::test_backend_failure_on_one_node_is_partial;
signal failure -- ...::test_signal_failure_is_recorded_and_the_set_labelled_honestly;
epilogs that never ran -- test_protocol_preempt.py.)
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from protocol_fixtures import ROOT, make_env
from slurm_snap import errors
from slurm_snap.cli import main
from slurm_snap.jobrecords import Ack
from slurm_snap.protocol import preempt
from slurm_snap import states as S
from slurm_snap.protocol.coordinator import Coordinator
from slurm_snap.protocol.repair import repair
from test_protocol_repair import run_and_kill, snapshot_dirs
from testkit.inventory_helpers import sets_of_job

HERE = os.path.dirname(os.path.abspath(__file__))


def now():
    return dt.datetime.now(dt.timezone.utc)


def load(env, set_id=None):
    with env.inv.session() as repo:
        sets = sets_of_job(repo, env.job_id)
        st = sets[-1] if set_id is None else repo.get_set(set_id)
        return st, repo.snapshots(st.id, include_deleted=True), repo.acks(st.id), repo.events(set_id=st.id)


# ---- backend tools that hang, fail or are missing ---------------------------------------
def fake_tool_dir(tmp_path, kind: str) -> tuple[str, str]:
    """A tool_dir for the cephfs backend (tools: mkdir, rmdir) whose mkdir hangs or fails."""
    d = tmp_path / f"tools-{kind}"
    d.mkdir()
    pids = tmp_path / f"pids-{kind}"
    scripts = {
        "hang": f"#!/bin/sh\necho $$ >> {pids}\nexec /bin/sleep 600\n",
        "fail": "#!/bin/sh\necho 'mkdir: cannot create directory: Read-only file system' >&2\nexit 1\n",
    }
    for tool in ("mkdir", "rmdir"):
        if kind == "missing" and tool == "mkdir":
            continue
        body = scripts.get(kind) if tool == "mkdir" else None
        p = d / tool
        p.write_text(body or f"#!/bin/sh\nexec /bin/{tool} \"$@\"\n")
        p.chmod(0o755)
    return str(d), str(pids)


BACKEND_FAULTS = {
    # kind -> (what the backend raises, its exit code, text in the set's reason)
    "hang": (errors.Timeout, errors.TIMEOUT, "did not finish within 1 s"),
    "fail": (errors.CommandFailed, errors.BACKEND, "mkdir exited with status 1: mkdir: cannot create directory: "
                                                   "Read-only file system"),
    "missing": (errors.ToolMissing, errors.CONFIG, "cephfs: required tool 'mkdir' not found on localhost"),
}


@pytest.mark.parametrize("kind", sorted(BACKEND_FAULTS))
def test_backend_fault_raises_its_error_and_exit_code(tmp_path, kind):
    from slurm_snap.backends.registry import get_backend
    from slurm_snap.backends.transport import LocalTransport

    cls, code, text = BACKEND_FAULTS[kind]
    tool_dir, pids = fake_tool_dir(tmp_path, kind)
    (tmp_path / "vol").mkdir()
    t0 = time.monotonic()
    with pytest.raises(cls) as ei:
        get_backend("cephfs", {"tool_dir": tool_dir, "timeout": 1.0}, LocalTransport()).create(
            str(tmp_path / "vol"), "s1")
    assert time.monotonic() - t0 < 5
    assert ei.value.exit_code == code
    want = {"hang": "did not finish within 1 s", "fail": "Read-only file system",
            "missing": "required tool 'mkdir' not found"}[kind]
    assert want in str(ei.value)
    if kind == "hang":
        _assert_killed(pids)


def _assert_killed(pidfile: str) -> None:
    pids = [int(x) for x in open(pidfile).read().split()]
    assert pids
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), f"hung tool still running: {pids}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.parametrize("kind", sorted(BACKEND_FAULTS))
def test_backend_fault_during_snapshot_is_an_honest_failed_set(tmp_path, capsys, kind):
    _cls, _code, text = BACKEND_FAULTS[kind]
    tool_dir, pids = fake_tool_dir(tmp_path, kind)
    env = make_env(tmp_path, backend="cephfs", options={"tool_dir": tool_dir, "timeout": 1.0})
    t0 = time.monotonic()
    rc = main(["--config", env.cfg.path, "snapshot", str(env.job_id), "--consistency", "crash"])
    took = time.monotonic() - t0
    cap = capsys.readouterr()
    assert rc == errors.BACKEND, cap.err   # SetIncomplete: the set ended FAILED
    assert took < 10
    st, parts, _acks, events = load(env)
    assert (st.state, st.consistency) == (S.FAILED, S.NONE)
    assert st.reason.startswith("no volume was cut; missing 3 of 3 volumes")
    assert text in st.reason and text in cap.err
    assert sorted(p.state for p in parts) == ["MISSING"] * 3 and all(text in p.error for p in parts)
    assert os.path.exists(os.path.join(env.job_dir, "release", st.epoch))
    assert snapshot_dirs(env) == []
    assert repair(env.cfg, env.inv) == []  # terminal: nothing for repair to do
    if kind == "hang":
        _assert_killed(pids)


def test_backend_fault_at_preemption_epilog_exits_0_and_the_set_says_why(tmp_path, monkeypatch, capsys):
    """The Epilog hook with a failing tool: exit 0 (the set records the failure), even under closed."""
    tool_dir, _ = fake_tool_dir(tmp_path, "fail")
    env = make_env(tmp_path, nodes=("n1",), shared=False, backend="cephfs",
                   options={"tool_dir": tool_dir, "timeout": 1.0})
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\necho '" + json.dumps({"jobs": [{"job_id": env.job_id, "preempt_time": int(
        time.time()) - 5}]}) + "'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("SLURM_SNAP_SQUEUE", str(squeue))
    for k, v in {"SLURM_JOB_ID": str(env.job_id), "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
                 "SLURM_JOB_USER": "root", "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n1",
                 "SLURM_JOB_RESTART_COUNT": "1", "SPANK_SLURM_SNAP": "1", "SPANK_SLURM_SNAP_ON_PREEMPT": "1",
                 "SPANK_SLURM_SNAP_VOLUMES": "scratch"}.items():
        monkeypatch.setenv(k, v)
    closed = tmp_path / "closed.toml"
    closed.write_text(open(env.cfg.path).read() + "[hooks]\nfailure_policy = 'closed'\n")
    assert main(["--config", str(closed), "hook", "epilog"]) == 0
    out = capsys.readouterr()
    st, parts, _a, _e = load(env)
    assert (st.state, st.trigger) == (S.FAILED, "preempt")
    assert "Read-only file system" in st.reason and [p.state for p in parts] == ["MISSING"]
    assert os.path.exists(os.path.join(env.job_dir, "release", "preempt-0"))


# ---- the coordinator killed at the phases not covered by test_protocol_repair ------------------
KILL_CASES = {
    # phase -> (states it may be left in, state after repair, orphans removed)
    "created": ({S.PENDING}, S.FAILED, False),
    "cutting": ({S.QUIESCING}, S.FAILED, False),
    "cut": ({S.CUTTING}, S.ROLLED_BACK, True),
}


@pytest.mark.parametrize("phase", sorted(KILL_CASES))
def test_sigkill_then_repair_leaves_an_honest_set_and_no_orphan(tmp_path, phase):
    env = make_env(tmp_path)
    left, after, orphans = KILL_CASES[phase]
    set_id, state, epoch, own, pid = run_and_kill(env, phase)
    assert state in left
    assert bool(snapshot_dirs(env)) == orphans
    (action,) = repair(env.cfg, env.inv)
    assert (action.old_state, action.new_state) == (state, after)
    st, parts, _a, events = load(env, set_id)
    assert st.state == after and st.consistency == S.NONE
    assert f"owner {own} is gone" in st.reason and f"during {state}" in st.reason
    assert ("cut but never recorded were removed" in st.reason) == orphans
    assert snapshot_dirs(env) == []  # no orphan survives repair
    assert parts == [] and any(e.kind == "repair" for e in events)
    assert os.path.exists(os.path.join(env.job_dir, "release", epoch))
    # the job's recorded volumes are untouched, and the job can be snapshotted again
    with env.inv.session() as repo:
        assert len(repo.volumes(repo.job_run(env.job_id))) == 3
    assert _snapshot_now(env).state == S.COMPLETE


def _snapshot_now(env):
    def ranks(job_id):
        def go():
            epoch = env.request_epoch()
            for i, node in enumerate(env.nodes):
                env.ack(node, i, epoch, manifest=[env.write_checkpoint(node, i)])
        threading.Thread(target=go, daemon=True).start()
    return Coordinator(env.cfg, env.inv, signaller=ranks, caller=ROOT).snapshot(env.job_id, deadline=10)


# ---- a rank that dies right after acknowledging -------------------------------------------------
RANK = """
import datetime as dt, json, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from slurm_snap.jobrecords import Ack, ManifestEntry
from slurm_snap.jobdir import ack_filename
job_dir, job_id, node, rank, ckpt = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
while not os.path.exists(os.path.join(job_dir, "request.json")):
    time.sleep(0.01)
epoch = json.load(open(os.path.join(job_dir, "request.json")))["epoch"]
with open(ckpt, "wb") as f:
    f.write(b"c" * 64); f.flush(); os.fsync(f.fileno())
data = Ack(job_id=job_id, epoch=epoch, node=node, rank=rank, local_rank=0, local_size=1, step=5,
           written_at=dt.datetime.now(dt.timezone.utc), manifest=[ManifestEntry(ckpt, 64)]).to_bytes()
tmp = os.path.join(job_dir, "ack", "." + ack_filename(node, rank) + ".tmp")
with open(tmp, "wb") as f:
    f.write(data); f.flush(); os.fsync(f.fileno())
os.rename(tmp, os.path.join(job_dir, "ack", ack_filename(node, rank)))
os.kill(os.getpid(), signal.SIGKILL)   # dies before it could wait for the release
"""


def test_rank_killed_after_acknowledging_still_counts(tmp_path):
    env = make_env(tmp_path)
    repo_root = os.path.dirname(os.path.dirname(HERE))
    procs = []

    def signaller(job_id):
        for i, node in enumerate(env.nodes):
            ckpt = os.path.join(env.local_paths[node], f"rank{i}.pt")
            procs.append(subprocess.Popen([sys.executable, "-c", RANK, repo_root, env.job_dir, str(job_id),
                                           node, str(i), ckpt]))

    out = Coordinator(env.cfg, env.inv, signaller=signaller, caller=ROOT).snapshot(env.job_id, deadline=15)
    rcs = [p.wait(10) for p in procs]
    assert rcs == [-signal.SIGKILL] * 2
    assert (out.state, out.consistency, out.checkpoint_step) == (S.COMPLETE, S.APP, 5), out.reason
    st, parts, acks, _ = load(env, out.set_id)
    assert len(acks) == 2 and all(a.manifest for a in acks) and len(parts) == 3
    # the release is there for ranks that did not die; a dead one leaves nothing behind
    assert os.path.exists(os.path.join(env.job_dir, "release", out.epoch))


# ---- a requeue while the preempted run's set is still being finalized ------------------------------
class Job:
    def __init__(self, env, node, restart_count):
        self.job_id, self.restart_count, self.node, self.nodes = env.job_id, restart_count, node, env.nodes
        self.uid, self.user = 1000, "alice"


def _preempted_then_requeued(env):
    """Run 0 preempted; n1's Epilog cut its share, n2's has not run; run 1 recorded by its PrologSlurmctld."""
    t_pre = now() - dt.timedelta(seconds=2)
    for i, node in enumerate(env.nodes):
        env.ack(node, i, "preempt-0", step=9, manifest=[env.write_checkpoint(node, i, step=9)])
    set_id = preempt.epilogslurmctld_mark(env.cfg, env.inv, Job(env, "", 1), t_pre.timestamp()).set_id
    preempt.epilog_cut(env.cfg, env.inv, Job(env, "n1", 1), preempt_time=t_pre.timestamp())
    st, parts, _a, _e = load(env, set_id)
    assert st.state == S.CUTTING and len(parts) == 2          # n2's Epilog has not run yet
    from slurm_snap.jobrecords import VolumeRecord
    with env.inv.session() as repo:
        old = repo.job_run(env.job_id, 0)
        run1 = repo.record_job_run(job_id=env.job_id, restart_count=1, user_name="alice", uid=1000,
                                   nodes=list(env.nodes), options=dict(old.options))
        repo.add_volumes(run1, [VolumeRecord(path=v.path, scope=v.scope, volume_class=v.volume_class,
                                           backend=v.backend, node=v.node) for v in repo.volumes(old)])
    return set_id, t_pre


def test_requeue_while_the_preempted_set_is_still_cutting(tmp_path, capsys):
    # The Prolog waits half its hook budget for the set in flight before it
    # gives up on it: 2 s here (with the default 20, 10 s of the unit suite).
    env = make_env(tmp_path, nodes=("n1", "n2"),
                   extra={"timeouts": {"barrier": 5.0, "backend_call": 5.0, "hook_budget": 4.0}})
    set_id, _t = _preempted_then_requeued(env)
    # the requeued run's Prolog finds no finished app-consistent set: no resume.json from a half-made set
    assert preempt.prepare_resume(env.cfg, env.inv, Job(env, "n1", 1)) is None
    assert not os.path.exists(os.path.join(env.job_dir, "resume.json"))
    # an on-demand snapshot of the new run must not cut the shared volume under the unfinished set
    rc = main(["--config", env.cfg.path, "snapshot", str(env.job_id), "--consistency", "crash"])
    err = capsys.readouterr().err
    assert rc == errors.CONFLICT and f"snapshot set {set_id} (preempt, CUTTING" in err
    # if n2's Epilog never comes, repair (the set's deadline passes) labels it honestly; the parts already cut stay recorded
    later = lambda: now() + dt.timedelta(hours=1)  # noqa: E731
    (a,) = repair(env.cfg, env.inv, clock=later)
    st, parts, acks, _e = load(env, set_id)
    assert (a.set_id, st.state) == (set_id, S.PARTIAL)
    assert "scratch@n2 (not cut)" in st.reason and "deadline" in st.reason
    assert sorted((p.node, p.state) for p in parts) == [("", "CUT"), ("n1", "CUT")] and len(acks) == 2


def test_late_epilog_after_requeue_finishes_the_preempted_runs_set(tmp_path):
    env = make_env(tmp_path, nodes=("n1", "n2"))
    set_id, t_pre = _preempted_then_requeued(env)
    r = preempt.epilog_cut(env.cfg, env.inv, Job(env, "n2", 1), preempt_time=t_pre.timestamp())
    with env.inv.session() as repo:
        assert [s.id for s in sets_of_job(repo, env.job_id)] == [set_id]  # no second set
    assert r == f"set {set_id} COMPLETE app-consistent"
    st, parts, acks, _e = load(env, set_id)
    assert (st.state, st.checkpoint_step, len(parts), len(acks)) == (S.COMPLETE, 9, 3, 2)


# ---- clock skew between the ranks' nodes and the coordinator ---------------------------------------
@pytest.mark.parametrize("skew,state,consistency,reason", [
    (3600, S.COMPLETE, S.APP, ""),                   # rank clock ahead: order is taken from what we saw
    (-0.5, S.COMPLETE, S.APP, ""),                   # within the slack
    (-3600, S.COMPLETE, S.CRASH, "acknowledgements written before the request on n2"),
    (-30 * 86400, S.COMPLETE, S.CRASH, "acknowledgements written before the request on n2"),
])
def test_clock_skew_of_one_node(tmp_path, skew, state, consistency, reason):
    env = make_env(tmp_path)

    def ranks(job_id):
        def go():
            epoch = env.request_epoch()
            for i, node in enumerate(env.nodes):
                written = now() + dt.timedelta(seconds=skew if node == "n2" else 0)
                env.ack(node, i, epoch, manifest=[env.write_checkpoint(node, i)], written_at=written)
        threading.Thread(target=go, daemon=True).start()

    out = Coordinator(env.cfg, env.inv, signaller=ranks, caller=ROOT).snapshot(env.job_id, deadline=10)
    assert (out.state, out.consistency) == (state, consistency)
    assert reason in out.reason
    st, parts, acks, _ = load(env, out.set_id)
    n2 = [a for a in acks if a.node == "n2"][0]
    # the rank's own time is recorded as it said, beside the coordinator's receipt time
    assert abs((n2.written_at - n2.received_at).total_seconds() - skew) < 5
    assert len(parts) == 3 and st.reason == out.reason


def test_clock_skew_at_preemption_is_judged_against_preempt_time(tmp_path):
    env = make_env(tmp_path, nodes=("n1", "n2"))
    t_pre = now() - dt.timedelta(seconds=2)
    env.ack("n1", 0, "preempt-0", manifest=[env.write_checkpoint("n1", 0)])
    env.ack("n2", 1, "preempt-0", manifest=[env.write_checkpoint("n2", 1)],
            written_at=t_pre - dt.timedelta(hours=2))   # n2's clock is 2 h behind
    preempt.epilogslurmctld_mark(env.cfg, env.inv, Job(env, "", 1), t_pre.timestamp())
    for node in env.nodes:
        r = preempt.epilog_cut(env.cfg, env.inv, Job(env, node, 1), preempt_time=t_pre.timestamp())
    assert r.endswith("COMPLETE crash-consistent")
    st, parts, acks, _ = load(env)
    assert "acknowledgements written before the request on n2" in st.reason and "n2" in st.failed_nodes
    assert len(parts) == 3 and len(acks) == 2
