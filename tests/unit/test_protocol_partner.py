"""protocol.partner: after the cut every node-local part gets a copy on the
job's next node, the second set's incrementally against the first's; the set
then survives the loss of any one node (show), and repair keeps it COMPLETE
when a node goes."""
from __future__ import annotations

import pytest

from protocol_fixtures import make_env
from slurm_snap import states as S
from slurm_snap.backends.transfer import Transferred
from slurm_snap.protocol import partner
from slurm_snap.protocol.repair import repair
from slurm_snap.report.show import survives_node_loss
from test_protocol_nodeloss import Present, complete_set


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path, nodes=("n1", "n2"))


class FakeTransfers:
    def __init__(self, fail_to=()):
        self.calls, self.fail_to = [], set(fail_to)

    def __call__(self, source, ref, target, *, timeout, parent=None, into=None):
        from slurm_snap import errors

        self.calls.append((source, target, ref.ref, parent.ref if parent else None))
        if target in self.fail_to:
            raise errors.CommandFailed(argv0="btrfs receive (on root@" + target + ")", status=1,
                                       stderr="No space left on device")
        return Transferred(ref, "send-incremental" if parent else "send", 100 if parent else 10_000, 0.1)


def test_partner_is_the_next_node_of_the_job():
    assert partner.partner_of("n1", ["n1", "n2", "n3"]) == "n2"
    assert partner.partner_of("n3", ["n1", "n2", "n3"]) == "n1"
    assert partner.partner_of("n1", ["n1"]) is None


def test_each_part_gets_a_partner_copy_incremental_from_the_second_set(env, monkeypatch):
    from slurm_snap.backends import transfer as xfer

    from slurm_snap.inventory.repository import SetFilter
    from slurm_snap.report.columns import parse_format
    from slurm_snap.report.load import load_rows

    def survives_in_report():
        with env.inv.session() as repo:
            (row,) = load_rows(repo, SetFilter(job_ids=(env.job_id,)), need_snaps=True)
            return row.survives_node_loss()

    fake = FakeTransfers()
    monkeypatch.setattr(xfer, "transfer", fake)
    first = complete_set(env)
    assert survives_in_report() is False        # report's Survives column: "no"
    made = partner.make_copies(env.cfg, env.inv, backend_on=lambda vclass, node: node)
    assert survives_in_report() is True
    assert any(f.column.name == "Survives" for f in parse_format("JobID,Survives"))
    assert sorted((c.source_node, c.node, c.method) for c in made) == [("n1", "n2", "send"), ("n2", "n1", "send")]
    assert partner.make_copies(env.cfg, env.inv, backend_on=lambda vclass, node: node) == []   # nothing left
    with env.inv.session() as repo:
        st = repo.report_set_detail(first)
        assert survives_node_loss(st, repo.copies(first)) is True
        parent_refs = [p.ref for p in repo.snapshots(first) if p.node]
    # A second set of the same run (a periodic one), its parts on the same
    # volumes: incremental against the first set's parts, which both ends hold.
    from slurm_snap.clock import utcnow
    from slurm_snap.inventory.records import SnapshotRecord

    with env.inv.session() as repo:
        run = repo.get_set(first).job_run
        second = repo.create_set(run, epoch="p-2", trigger="periodic")[0].id
        repo.record_parts(second, [SnapshotRecord(volume_id=p.volume_id, backend=p.backend, name=p.name + "-2",
                                                  ref=p.ref + "-2", path=p.path + "-2", node=p.node,
                                                  cut_started_at=utcnow(), cut_at=utcnow())
                                   for p in repo.snapshots(first)])
        for state in (S.CUTTING, S.CUT, S.COMPLETE):  # PENDING -> CUTTING: crash-consistent path
            repo.transition(second, state)
    fake.calls.clear()
    made = partner.make_copies(env.cfg, env.inv, backend_on=lambda vclass, node: node)
    assert sorted(c.method for c in made) == ["send-incremental", "send-incremental"]
    assert sorted((r, parent) for _s, _t, r, parent in fake.calls) == \
        sorted((p + "-2", p) for p in parent_refs), fake.calls


def test_a_failed_partner_copy_is_recorded_and_the_set_says_it_would_not_survive(env, monkeypatch):
    from slurm_snap.backends import transfer as xfer

    monkeypatch.setattr(xfer, "transfer", FakeTransfers(fail_to={"n1"}))
    set_id = complete_set(env)
    made = partner.make_copies(env.cfg, env.inv, backend_on=lambda vclass, node: node)
    assert sorted((c.node, c.state) for c in made) == [("n1", "FAILED"), ("n2", "OK")]
    with env.inv.session() as repo:
        assert survives_node_loss(repo.report_set_detail(set_id), repo.copies(set_id)) is False
    # n2 lost: its part has a copy on n1? No: that copy failed, so the set is PARTIAL.
    (a,) = repair(env.cfg, env.inv, node_check=True, backend_on=Present(), node_states={"n2": ("down", "disk")})
    assert a.new_state == S.PARTIAL


def test_prune_deletes_the_copies_on_other_nodes_and_skips_a_lost_part(env, monkeypatch):
    from slurm_snap.backends import transfer as xfer
    from slurm_snap.retention.prune import Pruner

    monkeypatch.setattr(xfer, "transfer", FakeTransfers())
    set_id = complete_set(env)
    partner.make_copies(env.cfg, env.inv, backend_on=lambda vclass, node: node)
    repair(env.cfg, env.inv, node_check=True, backend_on=Present(), node_states={"n2": ("down", "disk")})
    deleted_copies, deleted_parts = [], []

    class CopyBackend:
        def __init__(self, node):
            self.node = node

        def delete(self, ref):
            deleted_copies.append((self.node, ref.ref))
            return True

    class PartBackend:
        def delete(self, ref):
            deleted_parts.append(ref.ref)
            return True

    Pruner(env.inv, lambda snap: PartBackend(), copy_backend=lambda vclass, node: CopyBackend(node)) \
        .delete_set(set_id, why="test")
    with env.inv.session() as repo:
        st = repo.get_set(set_id)
        parts = {p.node: (p.state, p.ref) for p in repo.snapshots(set_id, include_deleted=True)}
        copies = [(c.node, c.state) for c in repo.copies(set_id)]
    assert st.state == S.DELETED
    # n2's copy on n1 was OK and is deleted there; n1's copy on n2 was lost with n2 and is not asked for.
    assert [n for n, _r in deleted_copies] == ["n1"] and sorted(copies) == [("n1", "DELETED"), ("n2", "LOST")]
    # n2's own part was lost: nothing asked of a backend on n2.
    assert parts["n2"][0] == "DELETED" and parts["n2"][1] not in deleted_parts and parts["n1"][1] in deleted_parts
