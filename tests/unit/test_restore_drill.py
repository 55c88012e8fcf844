"""Restore drills against the directory-copy test backend, run for real as `nobody`."""
from __future__ import annotations

import json
import os

import pytest

from slurm_snap import errors
from slurm_snap.access import Caller
from slurm_snap import states as S
from slurm_snap.restore import drill as drill_mod
from slurm_snap.restore.drill import Drill

from test_restore_support import OWNER, add_set, tree_digest, world  # noqa: F401  (fixture)
from testkit.inventory_helpers import restore_tests, sets_of_job

pytestmark = pytest.mark.slow(20)   # seconds idle: the unit run starts this file early (tests/conftest.py)


@pytest.fixture(autouse=True)
def _needs_root():
    from realcomponents import require

    require(os.geteuid() == 0, "drills switch to the job owner's uid: needs root")

ROOT = Caller(uid=0, name="root")


def drill(inv, w, caller=ROOT, **kw):
    return Drill(w.cfg, inv, caller=caller, **kw)


def seen(w) -> dict:
    with open(os.path.join(w.report, "seen.json")) as f:
        return json.load(f)


def leftovers(w) -> list[str]:
    return sorted(os.listdir(w.restore_root)) if os.path.isdir(w.restore_root) else []


def test_passing_drill_verifies_the_set_and_leaves_live_data_alone(inventory, world):
    set_id = add_set(inventory, world)
    before = tree_digest(world.live)
    out = drill(inventory, world).run("42", command=world.command("ok"), deadline=60)

    assert out.passed, out.reason
    assert out.first_step == 101
    assert 0 < out.time_to_first_step < 60
    assert tree_digest(world.live) == before
    assert leftovers(world) == []                      # clones and namespace gone
    info = seen(world)
    assert info["uid"] == world.uid and info["uid"] != 0
    assert info["map"] == {world.live: os.path.join(world.restore_root, f"{set_id}-{out.test_id}", "scratch")}
    assert info["env"]["SLURM_SNAP_RESTORE"] == "1"
    assert info["env"]["SLURM_SNAP_RESTORE_STEP"] == "100"
    assert info["env"]["SLURM_SNAP_RESTORE_MARKER"].startswith(out.namespace)
    with inventory.session() as repo:
        st = repo.get_set(set_id)
        assert st.state == S.VERIFIED and st.verified_at is not None
        (rt,) = restore_tests(repo, set_id)
        assert (rt.result, rt.first_step) == ("PASSED", 101)
        assert rt.time_to_first_step == pytest.approx(out.time_to_first_step)
        assert rt.target == out.namespace and rt.finished_at is not None
        assert 42 in repo.newest_verified_by_job([42])


def test_marker_file_counts_as_first_step(inventory, world):
    add_set(inventory, world)
    out = drill(inventory, world).run("42", command=world.command("marker-file"), deadline=60)
    assert out.passed, out.reason
    assert out.first_step == 101


def test_broken_set_fails_and_stops_counting_for_rpo(inventory, world):
    set_id = add_set(inventory, world)
    d = drill(inventory, world)
    assert d.run(f"set:{set_id}", command=world.command("ok"), deadline=60).passed
    with inventory.session() as repo:
        assert 42 in repo.newest_verified_by_job([42])
        snap_dir = repo.snapshots(set_id)[0].ref
    os.unlink(os.path.join(snap_dir, "ckpt", "latest"))   # the snapshot lost its checkpoint

    out = d.run(f"set:{set_id}", command=world.command("ok"), deadline=60)
    assert not out.passed
    assert "exit status 3" in out.reason and "checkpoint" in out.reason
    assert leftovers(world) == []
    with inventory.session() as repo:
        st = repo.get_set(set_id)
        assert st.state == S.FAILED_RESTORE
        assert st.verified_at is None
        assert "exit status 3" in st.reason
        assert [t.result for t in restore_tests(repo, set_id)] == ["PASSED", "FAILED"]
        assert repo.newest_verified_by_job([42]) == {}


def test_deadline_kills_the_program_and_fails_the_set(inventory, world):
    set_id = add_set(inventory, world)
    out = drill(inventory, world).run("42", command=world.command("hang"), deadline=1.5)
    assert not out.passed
    assert out.reason.startswith("deadline")
    pid = seen(world)["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert leftovers(world) == []
    with inventory.session() as repo:
        assert repo.get_set(set_id).state == S.FAILED_RESTORE
        assert restore_tests(repo, set_id)[0].reason.startswith("deadline")


@pytest.mark.parametrize("mode, words", [("stale", "did not resume from the snapshot"),
                                         ("exit0", "without reporting a first step")])
def test_program_that_does_not_resume_fails(inventory, world, mode, words):
    set_id = add_set(inventory, world)
    out = drill(inventory, world).run("42", command=world.command(mode), deadline=60)
    assert not out.passed and words in out.reason
    with inventory.session() as repo:
        assert repo.get_set(set_id).state == S.FAILED_RESTORE


def test_command_comes_from_the_job_options(inventory, world):
    add_set(inventory, world, options={"resume_cmd": world.command("ok")})
    out = drill(inventory, world).run("42", deadline=60)
    assert out.passed, out.reason


def test_no_command_anywhere_is_a_bad_value(inventory, world):
    add_set(inventory, world)
    with pytest.raises(errors.BadValueError, match="resume command"):
        drill(inventory, world).run("42")


def test_refuses_target_inside_or_around_a_live_volume(inventory, world):
    set_id = add_set(inventory, world)
    d = drill(inventory, world)
    for target in (world.live, os.path.join(world.live, "ckpt"), str(world.base)):
        with pytest.raises(errors.BadValueError) as exc:
            d.run("42", command=world.command("ok"), target=target)
        assert target in str(exc.value) and world.live in str(exc.value)
    # The per-job tree where future jobs' volumes appear is live too.
    with pytest.raises(errors.BadValueError, match="jobs"):
        d.run("42", command=world.command("ok"), target=os.path.join(world.base, "scratch", "jobs", "999"))
    with inventory.session() as repo:
        assert restore_tests(repo, set_id) == []
        assert repo.get_set(set_id).state == S.COMPLETE


def test_refuses_target_through_a_symlink_into_a_live_volume(inventory, world):
    add_set(inventory, world)
    link = os.path.join(world.base, "innocent")
    os.symlink(world.live, link)
    with pytest.raises(errors.BadValueError, match="live volume"):
        drill(inventory, world).run("42", command=world.command("ok"), target=link)


def test_non_owner_is_refused_owner_is_allowed(inventory, world):
    add_set(inventory, world)
    with pytest.raises(errors.PermissionDenied):
        drill(inventory, world, caller=Caller(uid=4242, name="someoneelse")).plan("42", command="true")
    owner = Caller(uid=world.uid, name=OWNER, via_sudo=True)
    assert drill(inventory, world, caller=owner).plan("42", command="/bin/true").set_id


def test_only_restorable_labelled_sets_are_drillable(inventory, world):
    partial = add_set(inventory, world, epoch="p", state=S.PARTIAL)
    unlabelled = add_set(inventory, world, epoch="n", consistency=S.NONE)
    in_flight = add_set(inventory, world, epoch="c", state=S.CUT)
    d = drill(inventory, world)
    for set_id in (partial, unlabelled, in_flight):
        with pytest.raises(errors.Conflict):
            d.plan(f"set:{set_id}", command="/bin/true")
    with pytest.raises(errors.NotFound):
        d.plan("42", command="/bin/true")      # no drillable set of job 42 at all


def test_never_runs_as_root(inventory, world):
    add_set(inventory, world, uid=0, user="root")
    with pytest.raises(errors.BadValueError, match="never runs a command as root"):
        drill(inventory, world).plan("42", command="/bin/true")


def test_residency_is_enforced(inventory, world):
    import dataclasses

    add_set(inventory, world)
    with inventory.session() as repo:
        snap = repo.snapshots(sets_of_job(repo, 42)[0].id)[0]
        repo.s.execute(type(snap).__table__.update().values(site="eu-1"))
    cfg = dataclasses.replace(world.cfg, restore=dataclasses.replace(world.cfg.restore, enforce_residency=True,
                                                                     site="us-1"))
    with pytest.raises(errors.BadValueError, match="eu-1"):
        Drill(cfg, inventory, caller=ROOT).plan("42", command="/bin/true")
    cfg_ok = dataclasses.replace(cfg, restore=dataclasses.replace(cfg.restore, site="eu-1"))
    assert Drill(cfg_ok, inventory, caller=ROOT).plan("42", command="/bin/true")


def test_missing_snapshot_fails_the_drill_at_clone(inventory, world):
    import shutil

    set_id = add_set(inventory, world)
    with inventory.session() as repo:
        shutil.rmtree(repo.snapshots(set_id)[0].ref)
    out = drill(inventory, world).run("42", command=world.command("ok"), deadline=30)
    assert not out.passed and out.reason.startswith("clone of")
    assert leftovers(world) == []
    with inventory.session() as repo:
        assert repo.get_set(set_id).state == S.FAILED_RESTORE


def test_keep_leaves_clones_until_cleanup(inventory, world):
    add_set(inventory, world)
    d = drill(inventory, world)
    out = d.run("42", command=world.command("ok"), deadline=60, keep=True)
    assert out.passed and os.path.isdir(os.path.join(out.namespace, "scratch"))
    assert any("removed" in m for m in d.sweeper.sweep(include_kept=True))
    assert leftovers(world) == []


def test_interrupted_drill_is_cleaned_up_by_the_next_one(inventory, world, monkeypatch):
    set_id = add_set(inventory, world)
    d = drill(inventory, world)

    class Killed(BaseException):
        """Stands for SIGKILL: no handler of ours runs."""

    def die(*a, **kw):
        raise Killed()

    monkeypatch.setattr(drill_mod, "run_program", die)
    monkeypatch.setattr(Drill, "_abandon", lambda *a, **kw: None)
    with pytest.raises(Killed):
        d.run("42", command=world.command("ok"), deadline=60)
    (ns,) = leftovers(world)
    assert os.path.isdir(os.path.join(world.restore_root, ns, "scratch"))   # the clone was left behind
    with inventory.session() as repo:
        assert restore_tests(repo, set_id)[0].result == "RUNNING"

    monkeypatch.undo()
    out = drill(inventory, world).run("42", command=world.command("ok"), deadline=60)
    assert out.passed, out.reason
    assert leftovers(world) == []
    with inventory.session() as repo:
        first, second = restore_tests(repo, set_id)
        assert first.result == "FAILED" and first.reason.startswith("interrupted")
        assert second.result == "PASSED"
        assert repo.get_set(set_id).state == S.VERIFIED


def test_exception_during_drill_cleans_up_and_leaves_set_state(inventory, world, monkeypatch):
    set_id = add_set(inventory, world)

    def boom(*a, **kw):
        raise KeyboardInterrupt()

    monkeypatch.setattr(drill_mod, "run_program", boom)
    with pytest.raises(KeyboardInterrupt):
        drill(inventory, world).run("42", command=world.command("ok"), deadline=60)
    assert leftovers(world) == []
    with inventory.session() as repo:
        assert repo.get_set(set_id).state == S.COMPLETE
        (rt,) = restore_tests(repo, set_id)
        assert rt.result == "FAILED" and rt.reason.startswith("interrupted")


def test_busy_while_another_drill_of_the_set_runs(inventory, world):
    set_id = add_set(inventory, world)
    with inventory.session() as repo:
        rt = repo.start_restore_test(set_id, "x", target="")
        repo.set_restore_test_target(rt.id, os.path.join(world.restore_root, "elsewhere"))
    with pytest.raises(errors.Busy):
        drill(inventory, world).run("42", command=world.command("ok"), deadline=60)


def test_command_is_not_run_by_a_shell(inventory, world):
    add_set(inventory, world)
    out = drill(inventory, world).run("42", command=f"{world.command('ok')} ; touch /tmp/pwned-by-shell",
                                      deadline=30)
    # The ';' and the rest are argv words for the program, which ignores them.
    assert not os.path.exists("/tmp/pwned-by-shell")
    assert out.passed


# ---- the command -------------------------------------------------------------
@pytest.fixture
def cli_world(world):
    from slurm_snap.inventory.repository import Inventory

    import dbtemplates

    dbtemplates.sqlite(world.cfg.inventory.url.removeprefix("sqlite:///"))     # as `db upgrade` leaves it
    inv = Inventory(world.cfg.inventory.url)
    yield world, inv, str(world.base / "slurm-snap.toml")
    inv.dispose()


def test_cli_passed_and_failed_exit_codes(cli_world, capsys):
    from slurm_snap.cli import main

    w, inv, cfg = cli_world
    set_id = add_set(inv, w)
    assert main(["--config", cfg, "restore-test", "42", "--command", w.command("ok"), "--deadline", "60"]) == 0
    assert f"set {set_id} is VERIFIED" in capsys.readouterr().out

    code = main(["--config", cfg, "restore-test", f"set:{set_id}", "--command", w.command("hang"),
                 "--deadline", "1", "--json"])
    captured = capsys.readouterr()
    assert code == errors.CONFLICT
    assert json.loads(captured.out)["result"] == "FAILED"
    assert "deadline" in captured.err
    with inv.session() as repo:
        assert repo.get_set(set_id).state == S.FAILED_RESTORE


def test_cli_bad_selector_and_non_owner(cli_world, capsys, monkeypatch):
    from slurm_snap.cli import main

    w, inv, cfg = cli_world
    add_set(inv, w)
    assert main(["--config", cfg, "restore-test", "set:x", "--command", "/bin/true"]) == errors.USAGE
    assert "set:x" in capsys.readouterr().err
    monkeypatch.setenv("SUDO_UID", "1")   # daemon: neither owner nor operator
    assert main(["--config", cfg, "restore-test", "42", "--command", "/bin/true"]) == errors.PERMISSION
    assert main(["--config", cfg, "restore-test", "--cleanup"]) == errors.PERMISSION


def test_infrastructure_errors_abort_without_blaming_the_set(inventory, world):
    set_id = add_set(inventory, world)

    def no_tool(row):
        raise errors.ToolMissing("btrfs", "btrfs")

    with pytest.raises(errors.ToolMissing):
        drill(inventory, world, backend_for=no_tool).run("42", command=world.command("ok"), deadline=30)
    assert leftovers(world) == []
    with inventory.session() as repo:
        assert repo.get_set(set_id).state == S.COMPLETE
        (rt,) = restore_tests(repo, set_id)
        assert rt.result == "FAILED" and rt.reason.startswith("drill aborted")
