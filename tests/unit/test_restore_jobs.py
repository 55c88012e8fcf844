"""Drills run as Slurm jobs of the owner (issue 31): the node's Prolog makes the
node-local clones, the program runs in the job on the node, the Epilog removes
the clones, each node reports to the inventory; what sbatch is asked for; who
may claim a drill; where the ranks go.

Slurm is a stand-in (test_restore_support.SlurmHere: every node is this host),
everything else is real: the spec and batch script, onnode.prepare/cleanup as
root, the in-job runner and the program as `nobody`, the inventory. The same
on the multi-host cluster: tests/integration/test_drill_jobs_cluster.py."""
from __future__ import annotations

import dataclasses
import json
import os
import pwd

import pytest

from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.access import Caller
from slurm_snap.restore import injob, onnode
from slurm_snap.restore.drill import Drill
from slurm_snap.restore.nodeops import LocalDrillNodes
from slurm_snap.restore.placement import positions
from slurm_snap.restore.submit import Where, sbatch_argv
from slurm_snap.slurm.jobenv import from_environ

from test_restore_support import SlurmHere, add_node_local_set, node_local, world  # noqa: F401  (fixture)
from testkit.inventory_helpers import restore_tests

ROOT = Caller(uid=0, name="root")
NODES = ["n1", "n2", "n3", "n4"]


pytestmark = pytest.mark.slow(14)   # seconds idle: the unit run starts this file early (tests/conftest.py)


@pytest.fixture(autouse=True)
def _needs_root():
    from realcomponents import require

    require(os.geteuid() == 0, "drill jobs' Prologs act as root and the program runs as the owner")


def drill(inv, w, slurm):
    return Drill(w.cfg, inv, caller=ROOT, submitter=slurm.submitter, usable_nodes=lambda: NODES)


def nodes_of(inv, test_id):
    with inv.session() as repo:
        return [(n.node, n.state, n.cleanup, n.blames_set) for n in repo.restore_nodes(test_id)]


def test_the_nodes_prolog_clones_the_program_runs_in_the_job_the_epilog_cleans(inventory, world):
    w = node_local(world)
    set_id = add_node_local_set(inventory, w, nodes=("n1",))
    seen_clone = {}
    slurm = SlurmHere(w.cfg, inventory, before_epilog=lambda s: seen_clone.update(
        exists=os.path.isdir(os.path.join(w.snapdir, f".slurm-snap-restore-{set_id}-1", "scratch"))))
    out = drill(inventory, w, slurm).run("42", command=w.command("ok"), deadline=60)
    assert out.passed, out.reason
    assert out.first_step == 101 and out.ran_on == "n1" and out.queued_seconds is not None
    (cmd,) = slurm.asked
    assert f"--snapshot-drill={out.test_id}" in cmd and "--nodelist=n1" in cmd and "--nodes=1" in cmd
    assert "--ntasks-per-node=1" in cmd and "--nice=1000" in cmd
    assert not any(a.startswith("--uid") for a in cmd)
    with open(os.path.join(w.report, "seen.json")) as f:
        seen = json.load(f)
    clone = os.path.join(w.snapdir, f".slurm-snap-restore-{set_id}-{out.test_id}", "scratch")
    # The clone the node's Prolog made, next to the snapshot on the node's disk, as the owner saw it.
    assert seen["uid"] == w.uid and seen["env"]["SLURM_SNAP_RESTORE_SCRATCH"] == clone
    assert seen["map"] == {w.live: clone} and seen_clone == {"exists": True}
    assert not os.path.exists(os.path.dirname(clone))           # the Epilog removed it
    assert nodes_of(inventory, out.test_id) == [("n1", S.NODE_READY, S.NODE_CLEANED, False)]
    with inventory.session() as repo:
        rt = repo.restore_test(out.test_id)
        assert (rt.result, rt.ran_on, rt.slurm_job_id) == ("PASSED", "n1", out.slurm_job_id)
        assert rt.queued_seconds == pytest.approx(out.queued_seconds) and rt.submitted_at is not None
        assert repo.get_set(set_id).state == S.VERIFIED
    assert not os.listdir(w.restore_root)


def test_a_snapshot_the_node_cannot_clone_fails_the_set_and_the_program_never_starts(inventory, world):
    w = node_local(world)
    set_id = add_node_local_set(inventory, w, nodes=("n1",))
    os.rename(os.path.join(w.snapdir, "j42-e1-n1"), os.path.join(w.base, "gone"))
    out = drill(inventory, w, SlurmHere(w.cfg, inventory)).run("42", command=w.command("ok"), deadline=60)
    assert not out.passed
    assert out.reason.startswith("clone of ") and "on n1 failed" in out.reason, out.reason
    assert not os.path.exists(os.path.join(w.report, "seen.json"))   # the program never ran
    assert nodes_of(inventory, out.test_id) == [("n1", S.NODE_FAILED, S.NODE_CLEANED, True)]
    with inventory.session() as repo:
        assert repo.get_set(set_id).state == S.FAILED_RESTORE


def test_a_node_that_never_reports_abandons_the_drill_and_leaves_the_set(inventory, world):
    w = node_local(world)
    set_id = add_node_local_set(inventory, w, nodes=("n1",))
    with pytest.raises(errors.BackendError, match="Prolog on n1 never reported"):
        drill(inventory, w, SlurmHere(w.cfg, inventory, prolog=False)).run("42", command=w.command("ok"), deadline=2)
    with inventory.session() as repo:
        (rt,) = restore_tests(repo, set_id)
        assert rt.result == "FAILED" and rt.reason.startswith("drill aborted: ")
        assert repo.get_set(set_id).state == S.COMPLETE


def test_only_the_drills_own_job_of_its_owner_gets_the_nodes_work(inventory, world):
    w = node_local(world)
    set_id = add_node_local_set(inventory, w, nodes=("n1",))
    with inventory.session() as repo:
        test_id = repo.start_restore_test(set_id, "cmd", target="/ns/1-1").id
        repo.set_restore_test_target(test_id, os.path.join(w.restore_root, f"{set_id}-{test_id}"))
        (snap,) = repo.snapshots(set_id)
        repo.plan_restore_nodes(test_id, [("n1", [snap.id])])
    ops = LocalDrillNodes(w.cfg, inventory)
    with pytest.raises(errors.PermissionDenied, match="uid 0"):
        ops.work(test_id=test_id, job_id=7, uid=0, node="n1")
    with pytest.raises(errors.NotFound, match="n2"):
        ops.work(test_id=test_id, job_id=7, uid=w.uid, node="n2")
    work = ops.work(test_id=test_id, job_id=7, uid=w.uid, node="n1")     # the first job binds the drill
    assert [c.clone for c in work.clones] == [os.path.join(w.snapdir, f".slurm-snap-restore-{set_id}-{test_id}",
                                                           "scratch")]
    with pytest.raises(errors.PermissionDenied, match="Slurm job 7's"):
        ops.work(test_id=test_id, job_id=8, uid=w.uid, node="n1")
    with pytest.raises(errors.PermissionDenied):
        ops.work(test_id=test_id, job_id=8, uid=w.uid, node="n1", cleanup=True)
    with inventory.session() as repo, pytest.raises(errors.Conflict, match="claimed by Slurm job 7"):
        repo.set_restore_test_job(test_id, 8)     # the drill's own job, submitted after another claimed it
    with inventory.session() as repo:
        repo.finish_restore_test(test_id, passed=False, first_step=None, time_to_first_step=None)
    with pytest.raises(errors.Conflict, match="not running"):
        ops.work(test_id=test_id, job_id=7, uid=w.uid, node="n1")
    assert ops.work(test_id=test_id, job_id=7, uid=w.uid, node="n1", cleanup=True).clones == work.clones


def test_a_job_that_is_not_the_drills_makes_and_removes_nothing(inventory, world, monkeypatch):
    w = node_local(world)
    set_id = add_node_local_set(inventory, w, nodes=("n1",))
    with inventory.session() as repo:
        test_id = repo.start_restore_test(set_id, "cmd", target=os.path.join(w.restore_root, "x")).id
        (snap,) = repo.snapshots(set_id)
        repo.plan_restore_nodes(test_id, [("n1", [snap.id])])
        repo.set_restore_test_job(test_id, 5)
    impostor = SlurmHere(w.cfg, inventory)
    job = from_environ(impostor.hook_env(test_id, "n1", ["n1"], pwd.getpwuid(w.uid)))
    with pytest.raises(errors.PermissionDenied):
        onnode.prepare(w.cfg, inventory, job)
    assert nodes_of(inventory, test_id) == [("n1", S.NODE_PLANNED, "", False)]   # nothing reported for it
    assert not any(n.startswith(".slurm-snap-restore-") for n in os.listdir(w.snapdir))


def test_an_epilog_without_the_service_removes_what_the_nodes_journal_lists(inventory, world, monkeypatch):
    w = node_local(world)
    add_node_local_set(inventory, w, nodes=("n1",))
    found = []

    def away(*a, **k):
        raise errors.ServiceUnavailable(why="cannot reach the slurm-snap service (test)")

    def service_goes_away(slurm):
        found.extend((x.test_id, x.job_id, [os.path.basename(c) for c in x.clones]) for x in onnode.leftovers(w.cfg, "n1"))
        monkeypatch.setattr(LocalDrillNodes, "work", away)
        monkeypatch.setattr(LocalDrillNodes, "report", away)

    out = drill(inventory, w, SlurmHere(w.cfg, inventory, before_epilog=service_goes_away)).run(
        "42", command=w.command("ok"), deadline=60)
    assert out.passed, out.reason
    assert found == [(out.test_id, out.slurm_job_id, ["scratch"])]      # the Prolog's journal on the node
    assert onnode.leftovers(w.cfg, "n1") == []                          # ...from which the Epilog removed it
    assert not [n for n in os.listdir(w.snapdir) if n.startswith(".slurm-snap-restore-")]
    # Its word never reached the inventory: the drill says so rather than claim the node clean.
    assert out.cleanup_errors == ["clones on n1: its Epilog never reported (its Epilog or the node agent "
                                  "removes them)"]


def test_leftovers_are_read_from_the_journal_in_the_per_job_snapshot_tree(world):
    w = node_local(world)
    vc = w.cfg.volume_class("scratch")
    alt = os.path.join(w.snapdir, ".slurm-snap-restore-3-9")
    assert w.snapdir == os.path.join(vc.prefix_for("n1"), "jobs", ".snapshots")
    os.makedirs(os.path.join(alt, "scratch"))
    with open(os.path.join(alt, onnode.JOURNAL), "w") as f:
        json.dump({"test_id": 9, "set_id": 3, "job_id": 77, "clones": [{"clone": os.path.join(alt, "scratch")}]}, f)
    os.makedirs(os.path.join(os.path.dirname(alt), ".slurm-snap-restore-4-10"))   # no journal: not trusted
    (left,) = onnode.leftovers(w.cfg, "n1")
    assert (left.test_id, left.job_id, left.clones) == (9, 77, [os.path.join(alt, "scratch")])
    assert onnode.remove(w.cfg, "n1", left.clones) == [] and not os.path.exists(alt)


class Snap:
    def __init__(self, id, node, scope="node-local", state=S.PART_CUT):
        self.id, self.node, self.state = id, node, state
        self.volume = type("V", (), {"scope": scope})


class Copy:
    def __init__(self, snapshot_id, node):
        self.snapshot_id, self.node = snapshot_id, node


def test_positions_are_the_nodes_holding_the_parts_copies_first_when_asked_one_node_each():
    snaps = [Snap(1, "n1"), Snap(2, "n2"), Snap(3, "n3"), Snap(9, "", scope="shared")]
    ring = [Copy(1, "n2"), Copy(2, "n3"), Copy(3, "n1")]      # partner copies: node k's on node k+1
    own = positions(snaps, ["n1", "n2", "n3"], ring, prefer_copies=False, usable=lambda: NODES)
    assert [(p.node, p.stands_for, p.snapshot_ids) for p in own] == [("n1", "n1", (1,)), ("n2", "n2", (2,)),
                                                                      ("n3", "n3", (3,))]
    copies = positions(snaps, ["n1", "n2", "n3"], ring, prefer_copies=True, usable=lambda: NODES)
    assert [(p.node, p.stands_for) for p in copies] == [("n2", "n1"), ("n3", "n2"), ("n1", "n3")]
    # n2 is down: its part is drilled from its copy on n3.
    down = positions(snaps[:2], ["n1", "n2"], [Copy(2, "n3")], prefer_copies=False, usable=lambda: ["n1", "n3"])
    assert [p.node for p in down] == ["n1", "n3"]
    # ...but with n3's own position to fill too, no node is left for it (never one node for two).
    with pytest.raises(errors.Conflict, match="job's node n3"):
        positions(snaps, ["n1", "n2", "n3"], ring, prefer_copies=False, usable=lambda: ["n1", "n3"])
    lost = [Snap(1, "n1", state=S.PART_LOST), Snap(2, "n2")]
    assert [p.node for p in positions(lost, ["n1", "n2"], [Copy(1, "n3")], prefer_copies=False,
                                      usable=lambda: NODES)] == ["n3", "n2"]
    assert positions([Snap(9, "", scope="shared")], ["n1"], [], prefer_copies=True, usable=lambda: []) == []


def test_sbatch_asks_for_the_positions_partition_qos_nice_and_gres(tmp_path):
    where = Where(test_id=12, nodes=("n2", "n1"), partition="drills", qos="low", nice=500, gres="gpu:2")
    cmd = sbatch_argv(where, job_name="slurm-snap-restore-3", deadline=120, marker_dir=str(tmp_path))
    assert cmd[0].endswith("/sbatch") and cmd[-1] == str(tmp_path / "drill.sh")
    for want in ("--snapshot-drill=12", "--nodelist=n2,n1", "--nodes=2", "--ntasks-per-node=1", "--partition=drills",
                 "--qos=low", "--nice=500", "--gres=gpu:2", "--time=5"):
        assert want in cmd, (want, cmd)
    anywhere = sbatch_argv(Where(test_id=1, count=3), job_name="j", deadline=60, marker_dir=str(tmp_path),
                           partition="p")
    assert "--nodes=3" in anywhere and "--partition=p" in anywhere
    assert not [a for a in anywhere if a.startswith(("--nodelist", "--qos", "--nice", "--gres"))]


def test_ranks_follow_the_positions_when_slurm_orders_the_nodes_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    env = injob._placement_env({"positions": ["n2", "n1"]}, str(tmp_path))
    assert env == {"SLURM_HOSTFILE": str(tmp_path / "hostfile"), "SLURM_DISTRIBUTION": "arbitrary"}
    assert (tmp_path / "hostfile").read_text() == "n2\nn1\n"
    assert injob._placement_env({"positions": ["n1", "n2"]}, str(tmp_path)) == {}


def test_the_local_mode_is_explicit_and_job_mode_needs_a_submitter(inventory, world):
    w = node_local(world)
    add_node_local_set(inventory, w, nodes=("n1",))
    with pytest.raises(errors.ConfigError, match="submitter"):
        Drill(w.cfg, inventory, caller=ROOT, usable_nodes=lambda: NODES).run("42", command=w.command("ok"))
    local = dataclasses.replace(w.cfg, restore=dataclasses.replace(w.cfg.restore, mode="local"))
    with pytest.raises(errors.UsageError, match="Slurm job"):
        Drill(local, inventory, caller=ROOT).run("42", command=w.command("ok"), wait=False)


def test_the_jobs_gres_is_read_from_slurm_and_asked_again_for_its_drills(tmp_path):
    from slurm_snap.slurm.commands import gres_from_show_job

    line = ("JobId=77 JobName=train UserId=alice(1000) Partition=gpu NumNodes=2 TresPerNode=gres:gpu:a100:2,"
            "gres:nvme:1 TresPerJob=gres:gpu:4 MinCPUsNode=1")
    assert gres_from_show_job(line) == {"gres": "gpu:a100:2,nvme:1", "gpus": "4"}
    assert gres_from_show_job("JobId=78 TresPerNode=gres/gpu:1") == {"gres": "gpu:1"}     # later versions' spelling
    assert gres_from_show_job("JobId=79 NumNodes=1 TRES=cpu=1,node=1") == {}
    cmd = sbatch_argv(Where(test_id=3, nodes=("n1",), gres="gpu:a100:2,nvme:1", gpus="4"), job_name="j",
                      deadline=60, marker_dir=str(tmp_path))
    assert "--gres=gpu:a100:2,nvme:1" in cmd and "--gpus=4" in cmd
