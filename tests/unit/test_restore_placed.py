"""Drills placed on other nodes (restore-test --other-nodes / --nodelist, issue 23
part 4): where the ranks go, what is brought there first, and that a part that
cannot be brought fails the drill with the part named.

The nodes are stand-ins: every "node" is this host, the transfer between
them is replaced (the real one is tested over sshd in test_backends_transfer
and on the 4-node cluster in tests/integration/test_nodelocal_cluster.py),
and so is Slurm (the command runs here, through the same watcher). What is
real: the inventory, the namespace and drill.json, the clone on the drill
node, the program run as `nobody`, the verdict."""
from __future__ import annotations

import datetime as dt
import json
import os

import pytest

from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.access import Caller
from slurm_snap.backends import factory
from slurm_snap.backends import transfer as xfer
from slurm_snap.inventory.repository import SnapshotRecord
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap.restore import placement as placement_mod
from slurm_snap.restore.drill import Drill
from slurm_snap.restore.placement import Placement
from slurm_snap.restore.runner import run_program

from test_restore_support import NAME, OWNER, T0, world  # noqa: F401  (fixture)
from testkit.inventory_helpers import restore_tests

ROOT = Caller(uid=0, name="root")
NODES = ["n1", "n2", "n3", "n4"]


@pytest.fixture(autouse=True)
def _needs_root():
    from realcomponents import require

    require(os.geteuid() == 0, "drills switch to the job owner's uid: needs root")


def add_node_local_set(inv, w, *, nodes=("n1",)) -> int:
    """Job 42 ran on `nodes`; its set has one node-local scratch part per node
    (all at the world's snapshot: every stand-in node is this host)."""
    backend = factory.backend_for_class(w.cfg, w.cfg.volume_class("scratch"), None)
    with inv.session() as repo:
        run = repo.record_job_run(job_id=42, restart_count=0, user_name=OWNER, uid=w.uid, nodes=list(nodes),
                                  options={})
        vols = repo.add_volumes(run, [VolumeRecord(path=w.live, scope="node-local", volume_class="scratch",
                                                 backend=NAME, node=n) for n in nodes])
        st, _ = repo.create_set(run, epoch="e1", trigger="manual", requested_at=T0)
        repo.transition(st.id, S.CUTTING, at=T0)
        repo.transition(st.id, S.CUT, at=T0 + dt.timedelta(seconds=1))
        records = []
        for n, vol in zip(nodes, vols):
            ref = backend.create(w.live, f"j42-e1-{n}")
            records.append(SnapshotRecord(volume_id=vol.id, backend=NAME, name=ref.name, ref=ref.ref,
                                          path=ref.path or "", node=n, cut_started_at=T0,
                                          cut_at=T0 + dt.timedelta(seconds=1)))
        repo.record_parts(st.id, records)
        repo.transition(st.id, S.COMPLETE, consistency=S.APP, checkpoint_step=100)
        return st.id


class NodeBackend:
    """The scratch backend "on" a stand-in node: clones for real (here), and
    records which node deleted which copy instead of deleting the snapshot
    every stand-in node shares."""

    def __init__(self, real, node, deleted):
        self._real, self.node, self._deleted = real, node, deleted

    def __getattr__(self, name):
        return getattr(self._real, name)

    @property
    def tools(self):
        return {**self._real.tools, "mkdir": "/bin/mkdir"}

    def mkdir_p(self, path):
        os.makedirs(path, exist_ok=True)

    def delete(self, ref):
        self._deleted.append((self.node, ref.ref))
        return True


class LocalSlurm:
    """Stands in for SlurmSubmitter: runs the command here, remembers the nodes asked for."""

    def __init__(self):
        self.asked: list = []

    def run(self, *, argv, env, marker_dir, marker_file, deadline, owner, creds, job_name, on_submitted=None,
            nodes=None):
        self.asked.append(nodes)
        return run_program(argv, env=env, cwd=marker_dir, deadline=deadline, marker_file=marker_file, creds=creds)


def placed_drill(inv, w, deleted, slurm=None):
    real = factory.backend_for_class(w.cfg, w.cfg.volume_class("scratch"), None)
    return Drill(w.cfg, inv, caller=ROOT, submitter=slurm or LocalSlurm(),
                 backend_on=lambda vclass, node: NodeBackend(real, node, deleted), usable_nodes=lambda: NODES)


def copies(inv, set_id):
    with inv.session() as repo:
        return [(c.purpose, c.source_node, c.node, c.state, c.error) for c in repo.copies(set_id)]


def test_ranks_go_by_position_to_nodes_that_cut_nothing_of_the_set(inventory, world):
    set_id = add_node_local_set(inventory, world, nodes=("n1", "n2"))
    plan = placed_drill(inventory, world, []).plan(f"set:{set_id}", command=world.command("ok"),
                                                   placement=Placement())
    p = plan.placed
    assert p.nodes == ["n3", "n4"] and p.node_map == {"n1": "n3", "n2": "n4"} and p.unplaceable == []
    assert sorted((m.source_node, m.to_node, m.ranks) for m in p.moves) == [("n1", "n3", (0,)), ("n2", "n4", (1,))]
    assert sorted(p.target.values()) == ["n3", "n4"]
    # Planning makes nothing.
    assert copies(inventory, set_id) == [] and not os.path.exists(world.restore_root)


def test_other_nodes_brings_the_part_runs_there_and_leaves_nothing(inventory, world, monkeypatch):
    set_id = add_node_local_set(inventory, world, nodes=("n1",))
    moved = []

    def fake_transfer(source, ref, target, *, timeout, parent=None, into=None):
        moved.append((source.node, target.node, ref.ref))
        return xfer.Transferred(ref, "send", 4096, 0.01)

    monkeypatch.setattr(xfer, "transfer", fake_transfer)
    deleted, slurm = [], LocalSlurm()
    out = placed_drill(inventory, world, deleted, slurm).run(f"set:{set_id}", command=world.command("ok"),
                                                             deadline=60, placement=Placement())
    assert out.passed, out.reason
    assert out.first_step == 101
    # The first usable node that cut nothing of the set.
    assert out.nodes == ["n2"] and slurm.asked == [["n2"]]
    snap = f"{world.snapdir}/j42-e1-n1"
    assert moved == [("n1", "n2", snap)]
    assert out.moved == ["scratch part of rank(s) 0 brought from n1 to n2: 0.0 MiB in 0.01 s (send)"]
    with open(os.path.join(world.report, "seen.json")) as f:
        env = json.load(f)["env"]
    assert json.loads(env["SLURM_SNAP_RESTORE_NODES"]) == {"n1": "n2"}
    # The clone is on the drill node, next to the copy (the node's own disk),
    # at the path every drill node would have it.
    clone = env["SLURM_SNAP_RESTORE_SCRATCH"]
    assert clone == os.path.join(world.snapdir, f".slurm-snap-restore-{set_id}-{out.test_id}", "scratch")
    assert not os.path.exists(os.path.dirname(clone))           # removed, with its namespace
    assert deleted == [("n2", snap)]                            # the copy, on the node it was brought to
    assert copies(inventory, set_id) == [("drill", "n1", "n2", "DELETED", "")]
    with inventory.session() as repo:
        assert repo.get_set(set_id).state == S.VERIFIED
    assert not os.listdir(world.restore_root)


def test_a_part_that_cannot_be_brought_fails_the_drill_naming_it(inventory, world, monkeypatch):
    set_id = add_node_local_set(inventory, world, nodes=("n1",))

    def broken(source, ref, target, *, timeout, parent=None, into=None):
        raise errors.CommandFailed(argv0="btrfs receive (on n3)", status=1, stderr="No space left on device")

    monkeypatch.setattr(xfer, "transfer", broken)

    class NeverSlurm(LocalSlurm):
        def run(self, **kw):
            raise AssertionError("the command ran without a rank's state")

    deleted = []
    out = placed_drill(inventory, world, deleted, NeverSlurm()).run("42", command=world.command("ok"), deadline=60,
                                                                    placement=Placement(nodes=("n3",)))
    assert not out.passed
    assert "scratch part of rank(s) 0 (cut on n1) is not on n3" in out.reason, out.reason
    assert "No space left on device" in out.reason
    with inventory.session() as repo:
        st = repo.get_set(set_id)
        assert st.state == S.FAILED_RESTORE and "cut on n1" in st.reason
        assert [t.result for t in restore_tests(repo, set_id)] == ["FAILED"]
    (row,) = copies(inventory, set_id)
    assert row[:4] == ("drill", "n1", "n3", "FAILED") and "No space" in row[4]
    # The half-received copy was listed before the transfer, so cleanup removed it on n3.
    assert deleted == [("n3", f"{world.snapdir}/j42-e1-n1")]
    assert not os.listdir(world.restore_root)


def test_placement_is_checked_before_anything_is_made(inventory, world):
    set_id = add_node_local_set(inventory, world, nodes=("n1", "n2"))
    d = placed_drill(inventory, world, [])
    with pytest.raises(errors.BadValueError, match="not a usable Slurm node"):
        d.run(f"set:{set_id}", command=world.command("ok"), placement=Placement(nodes=("n3", "evil.example")))
    with pytest.raises(errors.BadValueError, match="n1 cut another rank's part"):
        d.run(f"set:{set_id}", command=world.command("ok"), placement=Placement(nodes=("n2", "n1")))
    only_n3 = Drill(world.cfg, inventory, caller=ROOT, submitter=LocalSlurm(), usable_nodes=lambda: ["n1", "n3"])
    with pytest.raises(errors.Conflict, match="needs 2 node"):
        only_n3.run(f"set:{set_id}", command=world.command("ok"), placement=Placement())
    with inventory.session() as repo:
        assert restore_tests(repo, set_id) == [] and repo.get_set(set_id).state == S.COMPLETE


def test_the_partner_copy_is_the_source_when_preferred():
    from slurm_snap.protocol import nodelocal

    part = nodelocal.PartView(1, "scratch", "n1", "/s/a", "/s/a", "btrfs", "/scratch/j", "a")
    held = {1: {"n2"}}
    _new, moves, _ = nodelocal.follow([part], ["n1", "n2"], ["n3", "n4"], {0: "n1"}, held)
    assert [(m.source_node, m.to_node) for m in moves] == [("n1", "n3")]
    _new, moves, _ = nodelocal.follow([part], ["n1", "n2"], ["n3", "n4"], {0: "n1"}, held, prefer_copies=True)
    assert [(m.source_node, m.to_node) for m in moves] == [("n2", "n3")]


def test_only_operators_or_the_owner_drill_placed(inventory, world):
    set_id = add_node_local_set(inventory, world, nodes=("n1",))
    stranger = Caller(uid=1, name="daemon")
    d = Drill(world.cfg, inventory, caller=stranger, submitter=LocalSlurm(), usable_nodes=lambda: NODES)
    for selector in ("42", f"set:{set_id}"):
        with pytest.raises(errors.PermissionDenied):
            d.run(selector, command=world.command("ok"), placement=Placement())
        with pytest.raises(errors.PermissionDenied):
            d.run(selector, command=world.command("ok"), placement=Placement(nodes=("n3",)))


def test_usable_nodes_are_the_ones_slurm_would_run_on(monkeypatch):
    from slurm_snap.slurm import commands

    monkeypatch.setattr(commands, "node_states", lambda timeout=10.0: {
        "n1": ("idle", ""), "n2": ("drained", "disk failure"), "n3": ("mixed", ""), "n4": ("down*", "gone")})
    assert placement_mod.usable_nodes() == ["n1", "n3"]


def test_cli_placement_flags(world, capsys):
    from slurm_snap.cli import main
    from slurm_snap.inventory.repository import Inventory

    import dbtemplates

    dbtemplates.sqlite(world.cfg.inventory.url.removeprefix("sqlite:///"))     # as `db upgrade` leaves it
    inv = Inventory(world.cfg.inventory.url)
    try:
        add_node_local_set(inv, world, nodes=("n1",))
        cfg = str(world.base / "slurm-snap.toml")
        rc = main(["--config", cfg, "restore-test", "42", "--command", "/bin/true", "--other-nodes",
                   "--nodelist", "n3"])
        assert rc == errors.USAGE and "exclude each other" in capsys.readouterr().err
        rc = main(["--config", cfg, "restore-test", "42", "--command", "/bin/true", "--nodelist", "n[3"])
        assert rc == errors.USAGE and "n[3" in capsys.readouterr().err   # a bad hostlist names itself
        with inv.session() as repo:
            assert restore_tests(repo, 1) == [] and repo.get_set(1).state == S.COMPLETE
    finally:
        inv.dispose()
