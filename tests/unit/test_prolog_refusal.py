"""A declared volume the node Prolog refuses is not a silent loss of protection
(issue 21 item 3): the Prolog prepares what it can, tells the job (a notice the
SPANK plugin prints in the job's output: tests/integration/test_spank.py runs
that part in real slurmstepd), records the refusal in the inventory, and
report and show list the job with the reason instead of leaving it out.
The Prolog still exits 0 under policy open (a refusal must not drain a node).
"""
from __future__ import annotations

import json
import os
import pwd

import pytest

from slurm_snap import errors
from slurm_snap.cli import main
from slurm_snap.inventory.repository import Inventory
from slurm_snap.jobrecords import ResumeRecord

from test_report_seed import invoke
from slurm_snap import access
import dbtemplates


def _user():
    for name in ("snapuser", "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid, pw.pw_name
        except KeyError:
            continue
    return 65534, 65534, "65534"


UID, GID, USER = _user()
JOB = 78


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "root"
    mine = root / "scratch" / "users" / USER
    mine.mkdir(parents=True)
    os.chown(mine, UID, GID)
    os.symlink("/etc", mine / "link")          # the case: a link to /etc on the node's scratch
    os.lchown(mine / "link", UID, GID)
    (root / "pfs").mkdir()
    text = f"""
[inventory]
url = "sqlite:///{tmp_path}/inv.db"
[paths]
allowed_roots = ["{root}"]
barrier_dir = "{tmp_path}/barriers"
log_dir = "{tmp_path}/log"
[access]
operator_users = ["root"]
[[volume_class]]
name = "scratch"
prefix = "{root}/scratch"
scope = "node-local"
backend = "xfs-reflink"
[[volume_class]]
name = "pfs"
prefix = "{root}/pfs"
scope = "shared"
backend = "xfs-reflink"
"""
    for policy in ("open", "closed"):
        (tmp_path / f"{policy}.toml").write_text(text + f"[hooks]\nfailure_policy = '{policy}'\n")
    dbtemplates.sqlite(tmp_path / "inv.db")     # migrated, as `db upgrade` leaves it
    return tmp_path


def hook_env(monkeypatch, site, volumes):
    for k, v in {"SLURM_JOB_ID": str(JOB), "SLURM_JOB_UID": str(UID), "SLURM_JOB_GID": str(GID),
                 "SLURM_JOB_USER": USER, "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n1",
                 "SLURM_JOB_PARTITION": "low", "SPANK_SLURM_SNAP": "1", "SPANK_SLURM_SNAP_ON_PREEMPT": "1",
                 "SPANK_SLURM_SNAP_VOLUMES": volumes}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SUDO_UID", raising=False)


def link(site) -> str:
    return f"{site}/root/scratch/users/{USER}/link"


def test_the_prolog_tells_the_job_records_it_and_exits_0(site, monkeypatch, capsys):
    hook_env(monkeypatch, site, f"pfs,{link(site)}")
    rc = main(["--config", str(site / "open.toml"), "hook", "prolog"])
    err = capsys.readouterr().err
    assert rc == 0, err                                      # policy open: the node stays up
    assert f"refused 1 declared volume(s)" in err and repr(link(site)) in err and "is a symlink" in err
    # what could be prepared was: the job's own pfs volume
    assert (site / "root" / "pfs" / "jobs" / str(JOB)).is_dir()
    # the node's Prolog file the SPANK plugin prints in the job's output (root's, the job's group reads it)
    notice = site / "barriers" / str(JOB) / "prolog" / "0" / "n1"
    text = notice.read_text()
    assert text.startswith(f"prolog on n1 refused --snapshot-volumes {link(site)}: ") and "is a symlink" in text
    assert f"slurm-snap show {JOB}" in text and text.endswith("\n") and text.count("\n") == 1
    st = os.stat(notice)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, GID, 0o640)
    # in the inventory: the volume is marked, an event says so, and no second vaguer failure record
    inv = Inventory(f"sqlite:///{site}/inv.db")
    with inv.session() as repo:
        run = repo.job_run(JOB)
        vols = {v.path: v for v in repo.volumes(run)}
        assert vols[link(site)].refused_at is not None and "is a symlink" in vols[link(site)].refusal
        assert vols[f"{site}/root/pfs/jobs/{JOB}"].refused_at is None
        kinds = [e.kind for e in repo.events(job_id=JOB)]
    inv.dispose()
    assert kinds == ["refused"]
    log = [json.loads(x) for x in (site / "log" / "hooks.log").read_text().splitlines()]
    assert log[-1]["status"] == "failed" and "is a symlink" in log[-1]["message"]


def test_under_policy_closed_the_job_fails_and_the_refusal_is_still_recorded(site, monkeypatch, capsys):
    hook_env(monkeypatch, site, link(site))
    assert main(["--config", str(site / "closed.toml"), "hook", "prolog"]) == 1
    assert not (site / "barriers" / str(JOB)).exists()       # the job will not run: nothing to tell it
    inv = Inventory(f"sqlite:///{site}/inv.db")
    with inv.session() as repo:
        (v,) = repo.volumes(repo.job_run(JOB))
        assert v.refused_at is not None
    inv.dispose()


def _refused_job(site, monkeypatch, capsys):
    hook_env(monkeypatch, site, link(site))
    assert main(["--config", str(site / "open.toml"), "hook", "prolog"]) == 0
    capsys.readouterr()


def test_report_lists_the_unprotected_job_instead_of_leaving_it_out(site, monkeypatch, capsys):
    from slurm_snap.cli import report_cmd

    _refused_job(site, monkeypatch, capsys)
    owner = access.Caller(uid=UID, name=USER)
    code, out, exc = invoke(report_cmd.command, ["-o", "JobID,SetID,State,Volumes,Reason%-80", "-P", "-n"],
                            str(site / "open.toml"), owner)
    assert code == 0, exc
    (line,) = out.splitlines()
    jid, set_id, state, volumes, reason = line.split("|")
    assert (jid, set_id, state, volumes) == (str(JOB), "", "UNPROTECTED", "0/1")
    assert reason.startswith(f"prolog refused 1 of 1 volumes: n1 {link(site)}: ") and "symlink" in reason
    code, out, exc = invoke(report_cmd.command, ["-j", str(JOB), "--json"], str(site / "open.toml"), owner)
    doc = json.loads(out)
    assert doc["sets"] == []
    (u,) = doc["unprotected"]
    assert (u["job_id"], u["user"], u["volumes"]) == (JOB, USER, {"protected": 0, "declared": 1})
    assert u["refused"][0]["path"] == link(site) and "symlink" in u["refused"][0]["reason"]
    # -s selects it by its state, and other states leave it out
    for states, n in (("UNPROTECTED", 1), ("COMPLETE,FAILED", 0)):
        code, out, exc = invoke(report_cmd.command, ["-s", states, "-P", "-n", "-o", "JobID"],
                                str(site / "open.toml"), owner)
        assert code == 0 and len(out.splitlines()) == n, (states, out)


def test_show_job_explains_it(site, monkeypatch, capsys):
    from slurm_snap.cli import show_cmd

    _refused_job(site, monkeypatch, capsys)
    owner = access.Caller(uid=UID, name=USER)
    code, out, exc = invoke(show_cmd.command, [str(JOB)], str(site / "open.toml"), owner)
    assert code == 0, exc
    lines = out.splitlines()
    assert lines[0] == f"Job {JOB} (user {USER}, partition low, nodes n1): no snapshot set"
    assert lines[1] == ("  UNPROTECTED: the Prolog refused 1 of 1 declared volumes; "
                        "the job ran without their snapshots:")
    assert lines[2].startswith(f"    n1         {link(site)}: ") and "symlink" in lines[2]
    assert any(line.startswith("  n1") and "REFUSED:" in line for line in lines)
    assert any("refused: prolog on n1 refused" in line for line in lines)       # the event
    code, out, exc = invoke(show_cmd.command, ["--json", str(JOB)], str(site / "open.toml"), owner)
    doc = json.loads(out)
    assert doc["set"] is None and doc["refused"][0]["path"] == link(site)
    # someone else may not look (item 2's rule, on this form too)
    other = access.Caller(uid=UID + 1, name="someone-else")
    code, out, exc = invoke(show_cmd.command, [str(JOB)], str(site / "open.toml"), other)
    assert code == errors.PERMISSION


def test_a_set_of_a_job_with_a_refused_volume_says_so(site, monkeypatch, capsys):
    """At preemption the set covers what was prepared; show names what was not."""
    from slurm_snap import states as S
    from slurm_snap.cli import show_cmd

    hook_env(monkeypatch, site, f"pfs,{link(site)}")
    assert main(["--config", str(site / "open.toml"), "hook", "prolog"]) == 0
    inv = Inventory(f"sqlite:///{site}/inv.db")
    with inv.session() as repo:
        st, _ = repo.create_set(repo.job_run(JOB), epoch="preempt-0", trigger="preempt")
        repo.transition(st.id, S.FAILED, reason="test")
    inv.dispose()
    code, out, exc = invoke(show_cmd.command, [str(JOB)], str(site / "open.toml"), access.Caller(uid=0, name="root"))
    assert code == 0, exc
    assert "  UNPROTECTED: the Prolog refused 1 of 2 declared volumes" in out and link(site) in out


def test_a_plain_directory_on_a_btrfs_node_class_is_refused_by_the_prolog(site, monkeypatch, capsys):
    """What the submit host could not see (the node's disk): the Prolog checks
    the backend can cut the declared directory alone, and says what to do."""
    text = (site / "open.toml").read_text().replace('prefix = "' + f"{site}/root/scratch" + '"\nscope = "node-local"\n'
                                                     'backend = "xfs-reflink"',
                                                     'prefix = "' + f"{site}/root/scratch" + '"\nscope = "node-local"\n'
                                                     'backend = "btrfs"')
    assert 'backend = "btrfs"' in text
    (site / "btrfs.toml").write_text(text)
    plain = site / "root" / "scratch" / "users" / USER / "run7"
    plain.mkdir()
    os.chown(plain, UID, GID)
    hook_env(monkeypatch, site, str(plain))
    assert main(["--config", str(site / "btrfs.toml"), "hook", "prolog"]) == 0
    notice = (site / "barriers" / str(JOB) / "prolog" / "0" / "n1").read_text()
    assert "not a btrfs subvolume" in notice and f"`btrfs subvolume create {plain}`" in notice


def test_every_prolog_leaves_its_file_per_run_empty_when_all_was_well(site, monkeypatch, capsys):
    """The SPANK plugin waits for one file per node before it prints (a step
    may start before another node's Prolog is done): a Prolog that prepared
    everything writes an empty one, and a requeued run writes its own, so an
    earlier run's refusal is never printed again."""
    hook_env(monkeypatch, site, f"pfs,{link(site)}")
    assert main(["--config", str(site / "open.toml"), "hook", "prolog"]) == 0
    run0 = site / "barriers" / str(JOB) / "prolog" / "0" / "n1"
    assert "is a symlink" in run0.read_text()
    os.unlink(f"{site}/root/scratch/users/{USER}/link")      # the user fixed it before the requeue
    hook_env(monkeypatch, site, "pfs")
    monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", "1")
    assert main(["--config", str(site / "open.toml"), "hook", "prolog"]) == 0, capsys.readouterr().err
    run1 = site / "barriers" / str(JOB) / "prolog" / "1" / "n1"
    assert run1.read_bytes() == b"" and "is a symlink" in run0.read_text()
    st = os.stat(run1.parent)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, GID, 0o750)


def test_a_prolog_that_fails_still_leaves_word_for_the_job(site, monkeypatch, capsys):
    """An internal error after the job's directory exists: the policy records
    it and exits 0, and the node's file says it failed, so the job's steps
    neither wait out their bound nor stay silent."""
    from slurm_snap.hooks import jobhooks

    def broken(cfg, inv, job, *, budget=None):
        raise RuntimeError("resume lookup exploded")

    monkeypatch.setattr("slurm_snap.protocol.preempt.prepare_resume", broken)
    hook_env(monkeypatch, site, "pfs")
    monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", "2")
    assert jobhooks.HOOKS["prolog"] is jobhooks.prolog
    assert main(["--config", str(site / "open.toml"), "hook", "prolog"]) == 0
    assert "internal error: RuntimeError: resume lookup exploded" in capsys.readouterr().err
    text = (site / "barriers" / str(JOB) / "prolog" / "2" / "n1").read_text()
    assert text == (f"prolog on n1 failed (RuntimeError: resume lookup exploded); the job may run without "
                    f"snapshots (slurm-snap show {JOB})\n")


def test_parts_a_requeued_run_starts_without_are_told_in_the_jobs_output(site, monkeypatch, capsys):
    """The head node's Prolog of a run that landed on other nodes: the parts
    that could not be brought over are named in its file (which the SPANK
    plugin prints in every step), and the hook still succeeds."""
    from slurm_snap.hooks import jobhooks

    asked = {}

    def resume(cfg, inv, job, *, budget=None):
        asked["budget"] = budget
        return ResumeRecord.parse({"set_id": 12, "step": 40, "checkpoint": {"live": "/x", "snapshot": None},
                                   "ranks": {}, "missing": ["scratch part of rank(s) 1 (cut on n2) is not on n4: "
                                                            "btrfs receive exited with status 1"]})

    monkeypatch.setattr("slurm_snap.protocol.preempt.prepare_resume", resume)
    hook_env(monkeypatch, site, "pfs")
    monkeypatch.setenv("SLURM_JOB_RESTART_COUNT", "1")
    assert jobhooks.HOOKS["prolog"] is jobhooks.prolog
    assert main(["--config", str(site / "open.toml"), "hook", "prolog"]) == 0, capsys.readouterr().err
    text = (site / "barriers" / str(JOB) / "prolog" / "1" / "n1").read_text()
    assert text == ("resuming from set 12 without scratch part of rank(s) 1 (cut on n2) is not on n4: btrfs receive "
                    f"exited with status 1 (slurm-snap show {JOB})\n")
    # The moves get what is left of the hook's budget, less a reserve for writing.
    from slurm_snap.config import load

    hook_budget = load(str(site / "open.toml")).timeouts.hook_budget
    assert asked["budget"] is not None and hook_budget - 10.0 < asked["budget"] <= hook_budget - 5.0


def test_a_refused_volume_is_never_cut(tmp_path):
    """A refused path may be a link aimed at someone else's data: the set's
    cut records it MISSING with the refusal and hands it to no backend."""
    from protocol_fixtures import ROOT, make_env
    from slurm_snap import states as S
    from slurm_snap.inventory import refusals
    from slurm_snap.protocol.coordinator import Coordinator

    env = make_env(tmp_path, nodes=("n1",))
    target = tmp_path / "someone-elses"
    target.mkdir()
    (target / "secret").write_text("not yours")
    scratch = env.local_paths["n1"]
    os.rename(scratch, scratch + ".moved")
    os.symlink(target, scratch)                     # swapped in after the Prolog refused it
    with env.inv.session() as repo:
        run = repo.job_run(env.job_id)
        refusals.record(repo, job_id=env.job_id, restart_count=0, user_name="alice", uid=env.uid, partition="",
                        nodes=["n1"], options={}, specs=[],
                        refused=[refusals.Refusal("n1", scratch, "is a symlink; symlinks below an allowed root "
                                                                 "are refused")])
    out = Coordinator(env.cfg, env.inv, caller=ROOT).snapshot(env.job_id, consistency="crash")
    assert out.state == S.PARTIAL
    with env.inv.session() as repo:
        parts = {p.volume.path: p for p in repo.snapshots(out.set_id)}
    assert parts[scratch].state == "MISSING" and "the Prolog refused this path" in parts[scratch].error
    assert parts[env.shared_path].state == "CUT"
    assert not os.path.exists(os.path.join(os.path.dirname(scratch), ".snapshots"))   # nothing cut through it
    assert sorted(os.listdir(target)) == ["secret"]
