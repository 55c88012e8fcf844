"""protocol.nodeloss through repair: a node lost for hardware (Slurm DOWN/
DRAIN with such a reason) or a snapshot gone from its disk makes a COMPLETE
set PARTIAL with the reason, unless a copy of every lost part survives
elsewhere; a node drained for maintenance loses nothing."""
from __future__ import annotations

import datetime as dt

import pytest

from protocol_fixtures import make_env
from slurm_snap import states as S
from slurm_snap.inventory.records import CopyRecord
from slurm_snap.protocol import nodeloss, preempt
from slurm_snap.protocol.repair import repair
from testkit.inventory_helpers import sets_of_job
from test_protocol_preempt import job, now, ranks_ack_at_preemption


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path, nodes=("n1", "n2"))


def complete_set(env) -> int:
    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp())
    for n in ("n1", "n2"):
        preempt.epilog_cut(env.cfg, env.inv, job(env, n), preempt_time=t_pre.timestamp())
    with env.inv.session() as repo:
        (st,) = sets_of_job(repo, env.job_id)
        assert st.state == S.COMPLETE
        return st.id


class Present:
    """Every snapshot asked about is still on its node's disk, except `gone`."""

    def __init__(self, gone=()):
        self.gone, self.asked = set(gone), []

    def __call__(self, vclass, node):
        outer = self

        class B:
            def exists(self, ref):
                outer.asked.append((node, ref.ref))
                return ref.ref not in outer.gone
        return B()


def state_of(env, set_id):
    with env.inv.session() as repo:
        st = repo.get_set(set_id)
        return st.state, st.reason, {p.node: (p.state, p.error) for p in repo.snapshots(set_id)}


def test_lost_from_slurm_needs_a_down_state_and_a_hardware_reason():
    pattern = "hardware|disk|failed"
    states = {"n1": ("down*", "disk failure on nvme0"), "n2": ("drained", "maintenance window"),
              "n3": ("idle", ""), "n4": ("drained", "Hardware: PSU"), "n5": ("fail", "failed by admin"),
              "n6": ("mixed", "disk")}
    assert sorted(nodeloss.lost_from_slurm(states, pattern)) == ["n1", "n4", "n5"]


def test_node_down_for_hardware_makes_the_set_partial_with_the_reason(env):
    set_id = complete_set(env)
    probe = Present()
    actions = repair(env.cfg, env.inv, node_check=True, backend_on=probe,
                     node_states={"n1": ("idle", ""), "n2": ("down*", "disk failure")})
    (a,) = actions
    assert (a.set_id, a.old_state, a.new_state) == (set_id, S.COMPLETE, S.PARTIAL)
    state, reason, parts = state_of(env, set_id)
    assert state == S.PARTIAL and reason.startswith("node lost:") and "n2" in reason and "disk failure" in reason
    assert parts["n2"][0] == "LOST" and parts["n1"] == ("CUT", "")
    assert [n for n, _r in probe.asked] == ["n1"]   # the lost node is not asked
    # Nothing more to say on a second pass: PARTIAL is not restorable.
    assert repair(env.cfg, env.inv, node_check=True, backend_on=probe,
                  node_states={"n2": ("down*", "disk failure")}) == []
    with env.inv.session() as repo:
        assert ("PARTIAL", "node lost", 1) in repo.failure_counts()
        assert repo.newest_set(env.job_id, consistency=S.APP) is None   # no resume point, no RPO base


def test_drained_for_maintenance_is_not_lost(env):
    set_id = complete_set(env)
    assert repair(env.cfg, env.inv, node_check=True, backend_on=Present(),
                  node_states={"n2": ("drained", "kernel upgrade")}) == []
    assert state_of(env, set_id)[0] == S.COMPLETE


def test_a_snapshot_missing_on_disk_is_lost_too(env):
    set_id = complete_set(env)
    with env.inv.session() as repo:
        ref = next(p.ref for p in repo.snapshots(set_id) if p.node == "n1")
    (a,) = repair(env.cfg, env.inv, node_check=True, backend_on=Present(gone={ref}), node_states={})
    assert a.new_state == S.PARTIAL and "no longer on n1's disk" in a.reason


def test_a_surviving_copy_keeps_the_set(env):
    set_id = complete_set(env)
    with env.inv.session() as repo:
        part = next(p for p in repo.snapshots(set_id) if p.node == "n2")
        repo.record_copies(set_id, [CopyRecord(snapshot_id=part.id, node="n3", ref=part.ref, path=part.path,
                                               purpose="partner", source_node="n2", method="send")])
    (a,) = repair(env.cfg, env.inv, node_check=True, backend_on=Present(),
                  node_states={"n2": ("down", "hardware")})
    assert a.new_state == S.COMPLETE and "a copy survives on n3" in a.reason
    state, _reason, parts = state_of(env, set_id)
    assert state == S.COMPLETE and parts["n2"][0] == "LOST"
    # ... until the partner goes too.
    (b,) = repair(env.cfg, env.inv, node_check=True, backend_on=Present(),
                  node_states={"n2": ("down", "hardware"), "n3": ("down", "hardware")})
    assert (b.old_state, b.new_state) == (S.COMPLETE, S.PARTIAL) and "no copy elsewhere" in b.reason
    with env.inv.session() as repo:
        assert [c.state for c in repo.copies(set_id)] == ["LOST"]
    # And a third pass finds nothing new.
    assert repair(env.cfg, env.inv, node_check=True, backend_on=Present(),
                  node_states={"n2": ("down", "hardware"), "n3": ("down", "hardware")}) == []


def test_slurm_unreachable_is_said_not_guessed(env, monkeypatch):
    from slurm_snap import errors
    from slurm_snap.slurm import commands

    set_id = complete_set(env)

    def fail(timeout=10.0):
        raise errors.ToolMissing(backend="slurm", tool="sinfo")

    monkeypatch.setattr(commands, "node_states", fail)
    actions = repair(env.cfg, env.inv, node_check=True, backend_on=Present())
    assert [a.why for a in actions] == ["node check incomplete"] and "sinfo" in actions[0].errors[0]
    assert state_of(env, set_id)[0] == S.COMPLETE
