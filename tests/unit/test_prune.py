"""Prune executor: real deletes through the directory-copy backend, interruptions, reruns."""
from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from slurm_snap import errors
from slurm_snap.backends import factory
from slurm_snap.cli import main
from slurm_snap.inventory.repository import Inventory, SnapshotRecord
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap import states as S
from slurm_snap.restore.parts import backend_resolver
from slurm_snap.retention.prune import Pruner
from slurm_snap.retention.policy import Policy

from test_restore_support import NAME, T0, add_set, copy_tree, world  # noqa: F401  (fixture)



@pytest.fixture(autouse=True)
def _no_job_runs(monkeypatch):
    """No Slurm here: prune asks squeue which jobs run (their newest verified
    set is never pruned); these tests are about jobs that ended.
    test_prune_keeps_a_running_jobs_verified_set and the one after it ask otherwise."""
    monkeypatch.setattr("slurm_snap.slurm.commands.running_jobs", lambda timeout=10.0: {})

def clock():
    return T0 + dt.timedelta(days=1)


def history(inv, w, n=4):
    """n COMPLETE sets of job 42, one hour apart; ids oldest first."""
    return [add_set(inv, w, epoch=f"e{i}", at=T0 + dt.timedelta(hours=i)) for i in range(n)]


def add_second_snapshot(inv, w, set_id):
    """A second volume of job 42 and its snapshot in the set: a set of two parts."""
    live2 = os.path.join(os.path.dirname(os.path.dirname(w.live)), "jobs-b", "42")
    if not os.path.isdir(live2):
        os.makedirs(os.path.dirname(live2), exist_ok=True)
        copy_tree(w.live, live2)
    backend = factory.backend_for_class(w.cfg, w.cfg.volume_class("scratch"), None)
    with inv.session() as repo:
        run = repo.job_run(42)
        (vol,) = repo.add_volumes(run, [VolumeRecord(path=live2, scope="shared", volume_class="scratch",
                                                   backend=NAME)])
        ref = backend.create(live2, f"b-{set_id}")
        repo.record_parts(set_id, [SnapshotRecord(volume_id=vol.id, backend=NAME, name=ref.name, ref=ref.ref,
                                                      path=ref.path, node="", cut_started_at=T0, cut_at=T0)])


def refs(inv, set_id):
    with inv.session() as repo:
        return [s.ref for s in repo.snapshots(set_id, include_deleted=True)]


def states(inv, ids):
    with inv.session() as repo:
        return [repo.get_set(i).state for i in ids]


def snapshot_states(inv, set_id):
    with inv.session() as repo:
        return [s.state for s in repo.snapshots(set_id, include_deleted=True)]


def pruner(inv, w, backend_for=None):
    return Pruner(inv, backend_for or backend_resolver(w.cfg))


def test_dry_run_plan_changes_nothing(inventory, world):
    ids = history(inventory, world)
    decisions, sets = pruner(inventory, world).plan(Policy(keep_last=1), clock)
    assert [(d.set_id, d.action) for d in decisions] == [(ids[0], "delete"), (ids[1], "delete"),
                                                          (ids[2], "delete"), (ids[3], "keep")]
    assert sets[ids[0]].state == S.COMPLETE
    assert states(inventory, ids) == [S.COMPLETE] * 4
    assert all(os.path.isdir(r) for i in ids for r in refs(inventory, i))


def test_apply_deletes_snapshots_and_marks_everything(inventory, world):
    ids = history(inventory, world)
    p = pruner(inventory, world)
    decisions, _ = p.plan(Policy(keep_last=1), clock)
    result = p.apply(decisions)
    assert result.deleted == ids[:3] and result.failed == {}
    assert states(inventory, ids) == [S.DELETED, S.DELETED, S.DELETED, S.COMPLETE]
    for i in ids[:3]:
        assert snapshot_states(inventory, i) == ["DELETED"]
        assert not any(os.path.exists(r) for r in refs(inventory, i))
    assert all(os.path.isdir(r) for r in refs(inventory, ids[3]))
    with inventory.session() as repo:
        assert [e.message for e in repo.events(set_id=ids[0], kind="prune")][-1] == f"set {ids[0]} deleted"
    # Nothing left to do: a second run is a no-op.
    again, _ = p.plan(Policy(keep_last=1), clock)
    assert [(d.set_id, d.action) for d in again] == [(ids[3], "keep")]


class Crash(BaseException):
    """Stands for the process being killed: nothing of ours catches it."""


def crashing(w, *, on_call: int, after_delete: bool):
    """backend_for whose backend dies on its on_call-th delete (before or after really deleting)."""
    real = backend_resolver(w.cfg)
    calls = {"n": 0}

    class Dying:
        def __init__(self, b):
            self.b = b

        def delete(self, ref):
            calls["n"] += 1
            if calls["n"] == on_call:
                if after_delete:
                    self.b.delete(ref)
                raise Crash()
            return self.b.delete(ref)

    return lambda row: Dying(real(row))


@pytest.mark.parametrize("after_delete", [False, True])
def test_interrupted_prune_is_finished_by_a_rerun(inventory, world, after_delete):
    ids = history(inventory, world, n=3)
    for i in ids:
        add_second_snapshot(inventory, world, i)
    # Policy deletes ids[0] and ids[1] (two snapshots each); die on the 3rd delete:
    # ids[0] is done, ids[1] has lost its first snapshot only.
    p = pruner(inventory, world, crashing(world, on_call=3, after_delete=after_delete))
    decisions, _ = p.plan(Policy(keep_last=1), clock)
    with pytest.raises(Crash):
        p.apply(decisions)
    assert states(inventory, ids) == [S.DELETED, S.DELETING, S.COMPLETE]
    assert snapshot_states(inventory, ids[1]) == ["CUT", "CUT"]
    assert os.path.exists(refs(inventory, ids[1])[1])

    p2 = pruner(inventory, world)
    decisions, _ = p2.plan(Policy(keep_last=5), clock)   # even a laxer policy finishes DELETING sets
    assert [(d.set_id, d.action) for d in decisions] == [(ids[1], "delete"), (ids[2], "keep")]
    assert p2.apply(decisions).deleted == [ids[1]]
    assert states(inventory, ids) == [S.DELETED, S.DELETED, S.COMPLETE]
    for i in ids[:2]:
        assert snapshot_states(inventory, i) == ["DELETED", "DELETED"]
        assert not any(os.path.exists(r) for r in refs(inventory, i))
    assert all(os.path.isdir(r) for r in refs(inventory, ids[2]))
    assert snapshot_states(inventory, ids[2]) == ["CUT", "CUT"]


def test_backend_failure_leaves_set_deleting_with_the_error(inventory, world):
    ids = history(inventory, world, n=2)
    real = backend_resolver(world.cfg)

    class Failing:
        def delete(self, ref):
            raise errors.CommandFailed(argv0="rm", status=1, stderr="device busy")

    p = pruner(inventory, world, lambda row: Failing())
    decisions, _ = p.plan(Policy(keep_last=1), clock)
    result = p.apply(decisions)
    assert result.deleted == [] and list(result.failed) == [ids[0]]
    assert "device busy" in result.failed[ids[0]]
    assert states(inventory, ids) == [S.DELETING, S.COMPLETE]
    with inventory.session() as repo:
        (snap,) = repo.snapshots(ids[0])
        assert snap.state == "DELETING" and "device busy" in snap.error

    p = pruner(inventory, world, real)
    assert p.apply(p.plan(Policy(keep_last=1), clock)[0]).deleted == [ids[0]]
    assert states(inventory, ids) == [S.DELETED, S.COMPLETE]


def test_snapshot_already_gone_counts_as_deleted(inventory, world):
    import shutil

    ids = history(inventory, world, n=2)
    shutil.rmtree(refs(inventory, ids[0])[0])
    p = pruner(inventory, world)
    assert p.apply(p.plan(Policy(keep_last=1), clock)[0]).deleted == [ids[0]]
    assert snapshot_states(inventory, ids[0]) == ["DELETED"]


def test_running_drill_protects_its_set(inventory, world):
    ids = history(inventory, world, n=2)
    with inventory.session() as repo:
        rt = repo.start_restore_test(ids[0], "x", target="")
    p = pruner(inventory, world)
    decisions, _ = p.plan(Policy(keep_last=1), clock)
    assert decisions[0].action == "keep" and decisions[0].reasons == (f"restore test {rt.id} is running",)
    with pytest.raises(errors.Busy):
        p.delete_set(ids[0])
    assert states(inventory, ids) == [S.COMPLETE, S.COMPLETE]


def test_shared_snapshot_is_removed_with_its_last_set(inventory, world):
    ids = history(inventory, world, n=3)
    shared_ref = refs(inventory, ids[0])[0]
    with inventory.session() as repo:
        # ids[1] references the same backend object (a whole-filesystem snapshot cut once for both).
        repo.s.execute(type(repo.snapshots(ids[1])[0]).__table__.update()
                       .where(type(repo.snapshots(ids[1])[0]).__table__.c.set_id == ids[1])
                       .values(ref=shared_ref, shared_key="fs1"))
    p = pruner(inventory, world)
    p.delete_set(ids[0])
    assert os.path.isdir(shared_ref)                 # still used by ids[1]
    with inventory.session() as repo:
        assert "still used" in repo.snapshots(ids[0], include_deleted=True)[0].error
    p.delete_set(ids[1])
    assert not os.path.exists(shared_ref)
    assert states(inventory, ids) == [S.DELETED, S.DELETED, S.COMPLETE]


def test_in_flight_set_cannot_be_deleted(inventory, world):
    (set_id,) = [add_set(inventory, world, state=S.CUT)]
    with pytest.raises(errors.InvalidTransition):
        pruner(inventory, world).delete_set(set_id)


def test_only_verified_set_is_kept_unless_forced(inventory, world):
    ids = history(inventory, world, n=3)
    with inventory.session() as repo:
        repo.transition(ids[0], S.VERIFIED)
    p = pruner(inventory, world)
    decisions, _ = p.plan(Policy(keep_last=1, keep_verified=False), clock)
    assert [d.action for d in decisions] == ["keep", "delete", "keep"]
    decisions, _ = p.plan(Policy(keep_last=1, keep_verified=False, force=True), clock)
    assert [d.action for d in decisions] == ["delete", "delete", "keep"]


# ---- the command -------------------------------------------------------------
@pytest.fixture
def cli_world(world):
    import dbtemplates

    dbtemplates.sqlite(world.cfg.inventory.url.removeprefix("sqlite:///"))     # as `db upgrade` leaves it
    inv = Inventory(world.cfg.inventory.url)
    yield world, inv
    inv.dispose()


def test_cli_dry_run_then_apply(cli_world, capsys):
    w, inv = cli_world
    ids = history(inv, w, n=3)
    cfg = str(w.base / "slurm-snap.toml")
    assert main(["--config", cfg, "prune", "--keep-last", "1"]) == 0
    out = capsys.readouterr().out
    assert "would delete 2 set(s), keep 1" in out
    assert f"set {ids[2]}" in out and "last 1 of 1" in out
    assert states(inv, ids) == [S.COMPLETE] * 3

    assert main(["--config", cfg, "prune", "--keep-last", "1", "--apply", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["applied"] and data["deleted"] == ids[:2]
    assert states(inv, ids) == [S.DELETED, S.DELETED, S.COMPLETE]


def test_cli_needs_a_keep_rule(cli_world, capsys):
    w, _ = cli_world
    assert main(["--config", str(w.base / "slurm-snap.toml"), "prune"]) == errors.USAGE
    assert "--keep-last" in capsys.readouterr().err


def test_cli_non_operator_cannot_prune_other_users(cli_world, capsys, monkeypatch):
    w, _ = cli_world
    monkeypatch.setenv("SUDO_UID", "65534")
    code = main(["--config", str(w.base / "slurm-snap.toml"), "prune", "--keep-last", "1", "--user", "root"])
    assert code == errors.PERMISSION


def test_cli_text_prints_local_time_as_report_does(cli_world):
    """One zone rule for every command's text: prune shows a set's time as
    report does (local, sacct's format), where it used to print UTC."""
    from zoneinfo import ZoneInfo

    from click.testing import CliRunner

    from slurm_snap.cli import prune_cmd
    from slurm_snap.cli.context import Ctx
    from slurm_snap.slurm.slurmtime import format_time

    w, inv = cli_world
    ids = history(inv, w, n=2)
    ctx = Ctx(config_path=str(w.base / "slurm-snap.toml"))
    ctx.tz = ZoneInfo("Europe/Berlin")
    result = CliRunner().invoke(prune_cmd.command, ["--keep-last", "1"], obj=ctx)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # the sets were cut at 12:00:01 and 13:00:01 UTC: 13:00:01 and 14:00:01 in Berlin
    assert lines[1].split()[:5] == ["would", "delete", "set", str(ids[0]), "2026-11-30T13:00:01"]
    assert lines[2].split()[:4] == ["keep", "set", str(ids[1]), "2026-11-30T14:00:01"]
    assert "Z " not in result.output
    # the same instant as report's Cut column prints it in that zone
    assert format_time(T0 + dt.timedelta(seconds=1), ctx.tz) == "2026-11-30T13:00:01"


def _verified_history(inv, w):
    """Job 42: sets oldest first, the middle one VERIFIED; the newest COMPLETE."""
    ids = [add_set(inv, w, epoch=f"v{i}", at=T0 + dt.timedelta(hours=i),
                   state=S.VERIFIED if i == 1 else S.COMPLETE) for i in range(3)]
    return ids


def test_prune_keeps_a_running_jobs_verified_set(cli_world, capsys, monkeypatch):
    """Whatever --force and --no-keep-verified say, the newest verified set of a
    job squeue lists as running stays, and the dry run says why."""
    w, inv = cli_world
    ids = _verified_history(inv, w)
    cfg = str(w.base / "slurm-snap.toml")
    args = ["--config", cfg, "prune", "--keep-last", "1", "--no-keep-verified", "--force", "--json"]
    assert main(args) == 0
    ended = {d["set_id"]: d for d in json.loads(capsys.readouterr().out)["decisions"]}
    assert ended[ids[1]]["action"] == "delete"              # the job ended: the rules decide
    monkeypatch.setattr("slurm_snap.slurm.commands.running_jobs", lambda timeout=10.0: {42: 0})
    assert main(args) == 0
    live = {d["set_id"]: d for d in json.loads(capsys.readouterr().out)["decisions"]}
    assert live[ids[1]]["action"] == "keep"
    assert live[ids[1]]["reasons"] == ["newest verified set of a running job: kept whatever the rules say"]
    assert live[ids[0]]["action"] == "delete" and live[ids[2]]["action"] == "keep"


def test_prune_without_slurm_keeps_every_jobs_newest_verified_set(cli_world, capsys, monkeypatch):
    def down(timeout=10.0):
        raise errors.CommandFailed(argv0="squeue", status=1, stderr="slurmctld unreachable")

    w, inv = cli_world
    ids = _verified_history(inv, w)
    monkeypatch.setattr("slurm_snap.slurm.commands.running_jobs", down)
    assert main(["--config", str(w.base / "slurm-snap.toml"), "prune", "--keep-last", "1", "--no-keep-verified",
                 "--force", "--json"]) == 0
    out = capsys.readouterr()
    assert "cannot tell which jobs run" in out.err and "slurmctld unreachable" in out.err
    decisions = {d["set_id"]: d for d in json.loads(out.out)["decisions"]}
    assert decisions[ids[1]]["reasons"] == ["newest verified set: Slurm could not say whether the job runs"]
