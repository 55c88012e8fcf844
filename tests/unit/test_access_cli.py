"""Who may act: through the sudo rule (root with SUDO_UID), an unprivileged
user cannot snapshot, show, report, restore-test or prune another user's
job, cannot point a restore somewhere they could not write themselves, and
cannot make root write through a symlink they control. Root's own files
(inventory, hooks.log, the barrier directory) are not world-readable.

The callers are real accounts when the machine has them (the dev cluster's
snapuser/snapother), so pwd lookups behave as on a site. Real-uid processes
(fork + setuid) are in tests/integration/test_security_uids.py.
(Covered elsewhere: Coordinator with a foreign Caller -- test_protocol_coordinator.py::
test_only_owner_or_operator_may_snapshot; `repair` operators only -- test_protocol_repair.py;
report's -u/-a rules -- test_report.py.)
"""
from __future__ import annotations

import os
import pwd
import stat

import pytest

from protocol_fixtures import ROOT, make_env
from slurm_snap import access, errors
from slurm_snap.cli import main
from slurm_snap import states as S
from slurm_snap.protocol.coordinator import Coordinator
from testkit.inventory_helpers import restore_tests, sets_of_job


def _account(names, fallback_uid):
    for n in names:
        try:
            pw = pwd.getpwnam(n)
            return pw.pw_uid, pw.pw_name
        except KeyError:
            continue
    return fallback_uid, str(fallback_uid)


OWNER_UID, OWNER = _account(["snapuser", "nobody"], 65534)
OTHER_UID, OTHER = _account(["snapother", "daemon"], 1)


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A job of OWNER with one COMPLETE crash-consistent set, as root ran it;
    owners may name drill targets (restore.user_targets, off by default)."""
    env = make_env(tmp_path, user=OWNER, uid=OWNER_UID, extra={"restore": {"user_targets": True}})
    out = Coordinator(env.cfg, env.inv, caller=ROOT).snapshot(env.job_id, consistency="crash")
    assert out.state == S.COMPLETE
    env.set_id = out.set_id
    monkeypatch.delenv("SUDO_UID", raising=False)
    return env


def as_user(monkeypatch, uid):
    monkeypatch.setenv("SUDO_UID", str(uid))


def state_of(env):
    with env.inv.session() as repo:
        return [(s.id, s.state) for s in sets_of_job(repo, env.job_id)]


COMMANDS = {
    "snapshot": lambda e: ["snapshot", str(e.job_id), "--consistency", "crash"],
    "show-job": lambda e: ["show", str(e.job_id)],
    "show-set": lambda e: ["show", f"set:{e.set_id}"],
    "show-json": lambda e: ["show", "--json", "--set", str(e.set_id)],
    "report-job": lambda e: ["report", "-j", str(e.job_id)],
    "report-user": lambda e: ["report", "-u", OWNER, "-S", "2000-01-01"],
    "report-all": lambda e: ["report", "-a"],
    "restore-test-job": lambda e: ["restore-test", str(e.job_id), "--command", "/bin/true"],
    "restore-test-set": lambda e: ["restore-test", f"set:{e.set_id}", "--command", "/bin/true"],
    "restore-test-cleanup": lambda e: ["restore-test", "--cleanup"],
    "prune-user": lambda e: ["prune", "--user", OWNER, "--keep-last", "0", "--keep-within", "1s", "--apply"],
    "repair": lambda e: ["repair"],
    # Every other form that names the job or its set (issue 21 item 2).
    "snapshot-json": lambda e: ["snapshot", str(e.job_id), "--json", "--consistency", "crash"],
    "show-job-restart": lambda e: ["show", f"{e.job_id}.0"],
    "show-job-json": lambda e: ["show", "--json", str(e.job_id)],
    "report-job-restart": lambda e: ["report", "-j", f"{e.job_id}.0"],
    "report-job-json": lambda e: ["report", "-j", str(e.job_id), "--json"],
    "report-job-snapshots": lambda e: ["report", "-j", str(e.job_id), "--snapshots"],
    "report-job-by-user": lambda e: ["report", "-j", str(e.job_id), "--rpo-by-user"],
    "report-state-all": lambda e: ["report", "-a", "-s", "COMPLETE"],
    "restore-test-submit": lambda e: ["restore-test", str(e.job_id), "--command", "/bin/true", "--submit"],
    "restore-test-json": lambda e: ["restore-test", f"set:{e.set_id}", "--command", "/bin/true", "--json"],
    # Placed on other nodes (issue 23 part 4): refused before any node is chosen or reached.
    "restore-test-other-nodes": lambda e: ["restore-test", str(e.job_id), "--command", "/bin/true",
                                           "--other-nodes"],
    "restore-test-nodelist": lambda e: ["restore-test", f"set:{e.set_id}", "--command", "/bin/true",
                                        "--nodelist", "n[3-4]"],
    "prune-job": lambda e: ["prune", "--job", str(e.job_id), "--keep-last", "1", "--apply"],
    "prune-job-dry": lambda e: ["prune", "--job", str(e.job_id), "--keep-within", "1s"],
    "prune-job-json": lambda e: ["prune", "--job", str(e.job_id), "--keep-within", "1s", "--json"],
    "prune-job-and-own-user": lambda e: ["prune", "--job", str(e.job_id), "--user", OTHER, "--keep-within", "1s"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_other_user_is_refused_with_exit_4(world, monkeypatch, capsys, name):
    before = state_of(world)
    as_user(monkeypatch, OTHER_UID)
    rc = main(["--config", world.cfg.path, *COMMANDS[name](world)])
    err = capsys.readouterr().err
    assert rc == errors.PERMISSION, err
    assert "permission denied" in err
    assert (OTHER in err) if name != "restore-test-cleanup" else ("operators only" in err)
    assert state_of(world) == before  # no set created, labelled or deleted
    restore_root = os.path.join(world.tmp, "restore")
    assert not os.path.isdir(restore_root) or os.listdir(restore_root) == []


def test_prune_without_a_job_or_user_touches_only_the_callers_own_sets(world, monkeypatch, capsys):
    """A bare prune names nobody's job: a non-operator's selects only their own sets."""
    before = state_of(world)
    as_user(monkeypatch, OTHER_UID)
    rc = main(["--config", world.cfg.path, "prune", "--keep-within", "1s", "--apply"])
    out = capsys.readouterr().out
    assert rc == 0 and "deleted 0 set(s)" in out
    assert state_of(world) == before


@pytest.mark.parametrize("name", ["show-job", "restore-test-job"])
def test_another_users_job_without_a_set_is_refused_not_not_found(world, monkeypatch, capsys, name):
    """Whether a job has a set yet is the owner's business: 4, never 5, for anyone else."""
    with world.inv.session() as repo:
        run = repo.record_job_run(job_id=4343, restart_count=0, user_name=OWNER, uid=OWNER_UID, nodes=["n1"])
    as_user(monkeypatch, OTHER_UID)
    argv = ["show", "4343"] if name == "show-job" else ["restore-test", "4343", "--command", "/bin/true"]
    rc = main(["--config", world.cfg.path, *argv])
    err = capsys.readouterr().err
    assert rc == errors.PERMISSION, err
    assert f"job 4343 belongs to {OWNER}" in err and OTHER in err


@pytest.mark.parametrize("name", ["show-job", "show-set", "report-job", "report-user"])
def test_the_owner_through_sudo_may(world, monkeypatch, capsys, name):
    as_user(monkeypatch, OWNER_UID)
    rc = main(["--config", world.cfg.path, *COMMANDS[name](world)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert str(world.job_id) in cap.out


def test_sudo_uid_of_root_is_still_an_operator(world, monkeypatch, capsys):
    as_user(monkeypatch, 0)
    assert main(["--config", world.cfg.path, "show", f"set:{world.set_id}"]) == 0
    assert access.current_caller().via_sudo and access.is_operator(world.cfg, access.current_caller())


@pytest.mark.parametrize("value", ["abc", "", "-1", "1 2", "١٢"])
def test_garbage_sudo_uid_never_names_someone_else(monkeypatch, value):
    """Only sudo sets SUDO_UID for root; garbage in it is ignored (root stays root), never parsed loosely."""
    monkeypatch.setenv("SUDO_UID", value)
    c = access.current_caller()
    assert (c.uid, c.via_sudo) == (os.getuid(), False)


# ---- restore targets --------------------------------------------------------------------
@pytest.fixture
def owner_dir(world):
    d = os.path.join(world.tmp, "home-owner")
    os.mkdir(d, 0o755)
    os.chown(d, OWNER_UID, OWNER_UID)
    return d


@pytest.mark.parametrize("target", ["/etc", "/root", "/var/lib", "{tmp}/rootonly/sub/dir"])
def test_owner_cannot_restore_where_they_could_not_write(world, owner_dir, monkeypatch, capsys, target):
    target = target.format(tmp=world.tmp)
    if "rootonly" in target:
        os.makedirs(os.path.join(world.tmp, "rootonly"), mode=0o755)
    before = sorted(os.listdir(os.path.dirname(target))) if os.path.isdir(os.path.dirname(target)) else None
    as_user(monkeypatch, OWNER_UID)
    rc = main(["--config", world.cfg.path, "restore-test", str(world.job_id), "--command", "/bin/true",
               "--target", target])
    err = capsys.readouterr().err
    assert rc == errors.PERMISSION, err
    assert repr(target) in err and f"{OWNER} may not write" in err
    if before is not None:
        assert sorted(os.listdir(os.path.dirname(target))) == before
    with world.inv.session() as repo:
        assert restore_tests(repo, world.set_id) == []


def test_owner_symlink_to_a_root_directory_is_resolved_and_refused(world, owner_dir, monkeypatch, capsys):
    """The user controls the link; root must judge (and would write) its target, /root."""
    link = os.path.join(owner_dir, "out")
    os.symlink("/root", link)
    os.lchown(link, OWNER_UID, OWNER_UID)
    as_user(monkeypatch, OWNER_UID)
    rc = main(["--config", world.cfg.path, "restore-test", str(world.job_id), "--command", "/bin/true",
               "--target", link])
    err = capsys.readouterr().err
    assert rc == errors.PERMISSION and "may not write /root" in err
    assert not any(n.startswith(f"{world.set_id}-") for n in os.listdir("/root"))


def test_owner_target_is_refused_unless_the_site_allows_it(tmp_path, monkeypatch, capsys):
    env = make_env(tmp_path, user=OWNER, uid=OWNER_UID)
    Coordinator(env.cfg, env.inv, caller=ROOT).snapshot(env.job_id, consistency="crash")
    d = os.path.join(env.tmp, "mine")
    os.mkdir(d, 0o755)
    os.chown(d, OWNER_UID, OWNER_UID)
    as_user(monkeypatch, OWNER_UID)
    rc = main(["--config", env.cfg.path, "restore-test", str(env.job_id), "--command", "/bin/true", "--target", d])
    err = capsys.readouterr().err
    assert rc == errors.PERMISSION and "restore.user_targets = false" in err and repr(d) in err
    assert os.listdir(d) == []


def test_owner_may_restore_into_their_own_directory(world, owner_dir):
    from slurm_snap.restore.drill import Drill
    caller = access.Caller(uid=OWNER_UID, name=OWNER, via_sudo=True)
    plan = Drill(world.cfg, world.inv, caller=caller).plan(str(world.job_id), command="/bin/true",
                                                           target=owner_dir)
    assert plan.base == os.path.realpath(owner_dir) and plan.set_id == world.set_id


def test_operator_may_restore_anywhere_not_live(world, tmp_path):
    from slurm_snap.restore.drill import Drill
    d = tmp_path / "ops-restore"
    d.mkdir(mode=0o700)
    plan = Drill(world.cfg, world.inv, caller=ROOT).plan(str(world.job_id), command="/bin/true", target=str(d))
    assert plan.base == str(d)


# ---- root's files are not world-readable ----------------------------------------------------
def test_inventory_files_and_logs_are_private(tmp_path, monkeypatch):
    env = make_env(tmp_path, user=OWNER, uid=OWNER_UID)
    out = Coordinator(env.cfg, env.inv, caller=ROOT).snapshot(env.job_id, consistency="crash")
    assert out.state == S.COMPLETE
    db = os.path.join(env.tmp, "inventory.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            mode = stat.S_IMODE(os.stat(db + suffix).st_mode)
            assert mode & 0o077 == 0, f"{db + suffix} is {oct(mode)}"
    assert os.path.exists(db + "-wal")
    # a hook's log
    from slurm_snap.hooks.policy import run_hook
    run_hook("prolog", lambda: "ok", cfg=env.cfg, job_id=1)
    log = os.path.join(env.cfg.paths.log_dir, "hooks.log")
    assert stat.S_IMODE(os.stat(log).st_mode) & 0o007 == 0
    assert stat.S_IMODE(os.stat(env.cfg.paths.log_dir).st_mode) & 0o007 == 0


def test_inventory_created_by_root_under_a_permissive_umask_is_still_0600(tmp_path):
    from slurm_snap.inventory.repository import Inventory
    old = os.umask(0)
    try:
        inv = Inventory(f"sqlite:///{tmp_path}/new/inv.db")
        inv.upgrade()
        with inv.session() as repo:
            repo.event("x", "y")
        inv.dispose()
    finally:
        os.umask(old)
    for name in os.listdir(tmp_path / "new"):
        mode = stat.S_IMODE(os.stat(tmp_path / "new" / name).st_mode)
        assert mode & 0o077 == 0, f"{name} is {oct(mode)}"
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) & 0o007 == 0


def test_barrier_directory_layout_from_the_prolog(tmp_path):
    from slurm_snap.jobdir import JobDir
    jd = JobDir(str(tmp_path / "b"), 9).prepare(OWNER_UID, OWNER_UID).path
    st_job, st_ack, st_rel = (os.stat(os.path.join(jd, x)) for x in ("", "ack", "release"))
    assert (st_job.st_uid, stat.S_IMODE(st_job.st_mode)) == (0, 0o750)
    assert (st_ack.st_uid, stat.S_IMODE(st_ack.st_mode)) == (OWNER_UID, 0o700)
    assert (st_rel.st_uid, stat.S_IMODE(st_rel.st_mode)) == (0, 0o750)


def test_prolog_refuses_a_barrier_entry_the_user_replaced_with_a_link(tmp_path):
    """If a job dir entry were a symlink (e.g. left by an earlier job of a reused id), root must not chown through it."""
    from slurm_snap.jobdir import JobDir
    base = tmp_path / "b"
    base.mkdir()
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    os.symlink(victim, base / "9")
    with pytest.raises(errors.PathError) as ei:
        JobDir(str(base), 9).prepare(OWNER_UID, OWNER_UID)
    assert str(base / "9") in str(ei.value) and "refusing to follow" in str(ei.value)
    st = os.stat(victim)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)


def _dead_drill(env) -> int:
    """A restore test of OWNER's set whose drill process died long ago (no namespace left)."""
    import datetime as dt

    from slurm_snap.inventory.models import RestoreTest
    with env.inv.session() as repo:
        rt = RestoreTest(set_id=env.set_id, command="/bin/true", target="", result="RUNNING",
                         started_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1))
        repo.s.add(rt)
        repo.s.flush()
        return rt.id


def _result(env, test_id):
    with env.inv.session() as repo:
        return repo.restore_test(test_id).result


@pytest.mark.parametrize("how", ["collect", "sweep-before-a-drill"])
def test_another_users_sweep_leaves_the_owners_drills_alone(world, monkeypatch, capsys, how):
    """--collect (and the sweep every drill starts with) names no job: for a
    non-operator it covers their own drills only, never the owner's."""
    from slurm_snap.restore.drill import Drill

    test_id = _dead_drill(world)
    if how == "collect":
        as_user(monkeypatch, OTHER_UID)
        assert main(["--config", world.cfg.path, "restore-test", "--collect"]) == 0
        capsys.readouterr()
    else:   # what Drill.run() does first, as the other user
        Drill(world.cfg, world.inv, caller=access.Caller(uid=OTHER_UID, name=OTHER, via_sudo=True)).sweeper.sweep()
    assert _result(world, test_id) == "RUNNING"
    # the owner's own sweep (and an operator's) does clean it up
    as_user(monkeypatch, OWNER_UID)
    assert main(["--config", world.cfg.path, "restore-test", "--collect"]) == 0
    assert "interrupted drill cleaned up" in capsys.readouterr().out
    assert _result(world, test_id) == "FAILED"
