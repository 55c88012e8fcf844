"""Crash safety: SIGKILL a real coordinator process at each phase, check that
no set is wrongly COMPLETE, and that repair labels it and removes orphans."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from protocol_fixtures import make_env
from slurm_snap import errors
from slurm_snap.cli import main
from slurm_snap.protocol import owner
from slurm_snap import states as S
from slurm_snap.protocol.repair import repair
from testkit.inventory_helpers import sets_of_job

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def snapshot_dirs(env) -> list[str]:
    """Complete snapshots on the copying backend, on every volume."""
    out = []
    for base in [os.path.join(env.tmp, "scratch", n, "jobs") for n in env.nodes] + [os.path.join(env.tmp, "pfs", "jobs")]:
        d = os.path.join(base, ".snapshots")
        if os.path.isdir(d):
            out += [os.path.join(d, n) for n in os.listdir(d) if not n.startswith(".") and not n.endswith(".volume")]
    return sorted(out)


def run_and_kill(env, phase: str):
    marker = os.path.join(env.tmp, f"paused-{phase}")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "protocol_killee.py"), env.tmp, phase, marker],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(marker):
            if proc.poll() is not None:
                pytest.fail(f"coordinator exited before {phase}: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"coordinator never reached {phase}")
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with env.inv.session() as repo:
        (st,) = sets_of_job(repo, env.job_id)
        return st.id, st.state, st.epoch, st.owner, proc.pid


# phase -> (state left behind, state after repair, orphans expected)
CASES = {
    "signalled": (S.QUIESCING, S.FAILED, False),
    "barrier": (S.QUIESCING, S.FAILED, False),
    "cut-part": (S.CUTTING, S.ROLLED_BACK, True),
    "record": (S.CUTTING, S.ROLLED_BACK, True),
    "recorded": (S.CUT, S.COMPLETE, False),
}


@pytest.mark.parametrize("phase", list(CASES))
def test_sigkill_at_each_phase_then_repair(tmp_path, phase):
    env = make_env(tmp_path)
    left, after, orphans = CASES[phase]
    set_id, state, epoch, own, pid = run_and_kill(env, phase)
    if phase == "cut-part":  # CUTTING is committed while the volumes are cut: either state is possible
        assert state in (S.QUIESCING, S.CUTTING)
        left = state
    assert state == left and state != S.COMPLETE  # never COMPLETE without finalize
    assert own.split(":")[1] == str(pid) and owner.alive(own) is False
    before = snapshot_dirs(env)
    assert bool(before) == (orphans or phase == "recorded")

    # dry run: says what it would do, changes nothing
    (dry,) = repair(env.cfg, env.inv, dry_run=True)
    assert dry.new_state == after and dry.dry_run and snapshot_dirs(env) == before
    with env.inv.session() as repo:
        assert repo.get_set(set_id).state == left

    (action,) = repair(env.cfg, env.inv)
    assert (action.set_id, action.old_state, action.new_state) == (set_id, left, after)
    assert f"owner {own} is gone" in action.reason and action.errors == []
    with env.inv.session() as repo:
        st = repo.get_set(set_id)
        parts = repo.snapshots(set_id)
        assert st.state == after and st.finished_at is not None
        assert any(e.kind == "repair" for e in repo.events(set_id=set_id))
    if orphans:
        assert len(action.orphans) == len(before) >= 1
        assert snapshot_dirs(env) == [] and parts == []
        assert "cut but never recorded were removed" in st.reason
    elif phase == "recorded":
        # every part was recorded before the kill: repair runs the same finalizer
        assert st.consistency == S.APP and len(parts) == 3 and snapshot_dirs(env) == before
        assert "finalized by repair" in st.reason
    else:
        assert st.consistency == S.NONE and "nothing was cut" in st.reason
    # ranks waiting on this epoch are released
    assert os.path.exists(os.path.join(env.job_dir, "release", epoch))
    assert repair(env.cfg, env.inv) == []  # idempotent: nothing left to do


def test_live_owner_before_its_deadline_is_left_alone(tmp_path):
    env = make_env(tmp_path)
    with env.inv.session() as repo:
        run = repo.job_run(env.job_id)
        st, _ = repo.create_set(run, epoch="slive", trigger="manual", owner=owner.token(),
                                deadline=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
    assert repair(env.cfg, env.inv) == []
    later = lambda: dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)  # noqa: E731
    (a,) = repair(env.cfg, env.inv, clock=later)
    assert a.new_state == S.FAILED and "deadline" in a.reason


def test_older_than_protects_young_sets(tmp_path):
    env = make_env(tmp_path)
    with env.inv.session() as repo:
        run = repo.job_run(env.job_id)
        repo.create_set(run, epoch="sdead", trigger="manual", owner=f"{owner.token().split(':')[0]}:999999999:1")
    assert repair(env.cfg, env.inv, older_than=3600) == []
    (a,) = repair(env.cfg, env.inv, older_than=0)
    assert a.new_state == S.FAILED


def test_rolled_back_set_loses_its_recorded_snapshots(tmp_path):
    """A CUTTING set with nothing recorded but orphans on two volumes."""
    from slurm_snap.backends.registry import get_backend
    from slurm_snap.protocol.cutter import snapshot_name

    env = make_env(tmp_path)
    with env.inv.session() as repo:
        run = repo.job_run(env.job_id)
        st, _ = repo.create_set(run, epoch="sx", trigger="manual", owner="gone-host:1:1",
                                deadline=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))
        repo.transition(st.id, S.CUTTING)
        vols = repo.volumes(run)
    b = get_backend("test-copy", {})
    for v in vols[:2]:
        b.create(v.path, snapshot_name(env.job_id, st.id, v.id))
    b.create(vols[2].path, "slurm-snap-4242-999-1")  # another set's name: not ours to delete
    (a,) = repair(env.cfg, env.inv)
    assert a.new_state == S.ROLLED_BACK and len(a.orphans) == 2
    assert [os.path.basename(p) for p in snapshot_dirs(env)] == ["slurm-snap-4242-999-1"]


def test_cli_repair_json_and_operator_only(tmp_path, capsys, monkeypatch):
    env = make_env(tmp_path)
    with env.inv.session() as repo:
        run = repo.job_run(env.job_id)
        repo.create_set(run, epoch="sdead", trigger="manual", owner=f"{owner.token().split(':')[0]}:999999999:1")
    monkeypatch.setenv("SUDO_UID", "54321")  # root via sudo acts as that user
    assert main(["--config", env.cfg.path, "repair"]) == errors.PERMISSION
    assert "repair is for operators" in capsys.readouterr().err
    monkeypatch.delenv("SUDO_UID")
    # No Slurm here: the node check (tests/unit/test_protocol_nodeloss.py) is off.
    assert main(["--config", env.cfg.path, "repair", "--dry-run", "--json", "--no-node-check"]) == 0
    (a,) = json.loads(capsys.readouterr().out)
    assert a["dry_run"] and a["new_state"] == S.FAILED
    assert main(["--config", env.cfg.path, "repair", "--no-node-check"]) == 0
    assert "PENDING -> FAILED" in capsys.readouterr().out
    assert main(["--config", env.cfg.path, "repair", "--no-node-check"]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_a_set_finished_by_another_process_meanwhile_is_reported_as_left_alone(tmp_path, capsys):
    """Two repairs (two runs sharing a cluster) can pick the same abandoned set.
    The one that loses the race must say that it changed nothing and what the
    other left, never "labelled OLD -> NEW" for a label it did not write, nor
    "deleted" for orphans it did not delete."""
    from slurm_snap.backends.registry import get_backend
    from slurm_snap.protocol.cutter import snapshot_name

    env = make_env(tmp_path)
    with env.inv.session() as repo:
        run = repo.job_run(env.job_id)
        st, _ = repo.create_set(run, epoch="srace", trigger="manual", owner="gone-host:1:1",
                                deadline=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))
        repo.transition(st.id, S.CUTTING)
        vols = repo.volumes(run)
        set_id = st.id
    real = get_backend("test-copy", {})
    real.create(vols[0].path, snapshot_name(env.job_id, set_id, vols[0].id))

    class OtherRepairWinsWhileWeList:
        """The backend as the losing repair sees it: while it lists orphans,
        the other repair labels the set and removes the orphan."""
        def __init__(self):
            self.raced = False

        def __call__(self, v):
            return self

        def list(self, path):
            refs = real.list(path)
            if not self.raced:
                self.raced = True
                with env.inv.session() as repo:
                    repo.transition(set_id, S.ROLLED_BACK, reason="repair: its owner is gone during CUTTING; "
                                                                  "1 snapshot(s) cut but never recorded were removed")
                for r in refs:
                    real.delete(r)
            return refs

        def delete(self, ref):
            raise AssertionError("the losing repair must delete nothing")

    (a,) = repair(env.cfg, env.inv, backend_for=OtherRepairWinsWhileWeList())
    assert (a.old_state, a.new_state, a.acted) == (S.CUTTING, S.ROLLED_BACK, False)
    assert a.orphans == [] and a.errors == []
    assert "1 snapshot(s) cut but never recorded were removed" in a.reason
    with env.inv.session() as repo:
        assert [e.kind for e in repo.events(set_id=set_id)] == []   # nothing written by the loser
    from slurm_snap.cli.repair_cmd import describe
    (line,) = describe(a)
    assert line.startswith(f"set {set_id} job {env.job_id}: left alone: ")
    assert "labelled" not in line and "CUTTING when repair looked" in line and "now ROLLED_BACK" in line


def test_an_orphan_that_cannot_be_removed_is_not_reported_as_deleted(tmp_path, capsys):
    from slurm_snap.backends.registry import get_backend
    from slurm_snap.protocol.cutter import snapshot_name

    env = make_env(tmp_path)
    with env.inv.session() as repo:
        run = repo.job_run(env.job_id)
        st, _ = repo.create_set(run, epoch="sstuck", trigger="manual", owner="gone-host:1:1",
                                deadline=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))
        repo.transition(st.id, S.CUTTING)
        vols = repo.volumes(run)
        set_id = st.id
    real = get_backend("test-copy", {})
    ref = real.create(vols[0].path, snapshot_name(env.job_id, set_id, vols[0].id))

    class Stuck:
        def __call__(self, v):
            return self

        def list(self, path):
            return real.list(path)

        def delete(self, r):
            raise errors.BackendError(backend="test-copy", why="device busy")

    (a,) = repair(env.cfg, env.inv, backend_for=Stuck())
    assert a.new_state == S.ROLLED_BACK and a.acted and a.orphans == []
    assert a.errors == [f"cannot delete {ref.ref}: test-copy: device busy"]
    assert f"1 of them could not be removed: {ref.ref}" in a.reason
    with env.inv.session() as repo:
        assert repo.get_set(set_id).reason == a.reason
    from slurm_snap.cli.repair_cmd import describe
    assert not any("deleted" in line for line in describe(a))
