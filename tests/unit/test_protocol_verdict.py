"""The set label as a pure function: injected times, no I/O."""
from __future__ import annotations

import datetime as dt

import pytest

from slurm_snap import states as S
from slurm_snap.protocol.repair import stale_reason
from slurm_snap.protocol.verdict import (AckFact, PartOutcome, decide, expected_parts,
                                         node_barriers, skew)

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def at(ms: float) -> dt.datetime:
    return T0 + dt.timedelta(milliseconds=ms)


class Vol:
    def __init__(self, id, node, scope, cls, path=None):
        self.id, self.node, self.scope, self.volume_class = id, node, scope, cls
        self.path = path or (f"/scratch/{node}/jobs/1" if scope == "node-local" else "/pfs/jobs/1")


NODES = ["n1", "n2"]
VOLS = [Vol(1, "n1", "node-local", "scratch"), Vol(2, "n2", "node-local", "scratch"), Vol(3, "", "shared", "pfs")]


def acks(nodes=NODES, written=10, seen=20, step=5, local_size=1):
    return [AckFact(n, i * local_size + lr, lr, local_size, step, at(written), at(seen))
            for i, n in enumerate(nodes) for lr in range(local_size)]


def outcomes(ids=(1, 2, 3), start=100, end=110, manifest_ok=True, failed=()):
    out = {i: PartOutcome(i, True, at(start), at(end + i), manifest_ok) for i in ids}
    for i in failed:
        out[i] = PartOutcome(i, False, at(start), at(end), None, error="btrfs exited with status 1: boom")
    return out


def run(*, wanted="app", ack_list=None, complete=NODES, outs=None, allow_crash=True, vols=VOLS, nodes=NODES, **kw):
    ack_list = acks() if ack_list is None else ack_list
    return decide(wanted=wanted, nodes=nodes, parts=expected_parts(vols, nodes),
                  outcomes=outcomes() if outs is None else outs,
                  barriers=node_barriers(ack_list, complete), requested_at=at(0), allow_crash=allow_crash, **kw)


def test_every_barrier_before_every_cut_is_app_consistent():
    v = run()
    assert (v.state, v.consistency) == (S.COMPLETE, S.APP)
    assert v.reason == "" and v.failed_nodes == () and v.checkpoint_step == 5 and v.manifest_ok is True
    assert v.skew_seconds == pytest.approx(0.013)  # first start 100 ms, last end 113 ms


def test_missing_barrier_is_crash_consistent_and_names_the_node():
    v = run(ack_list=acks(["n1"]), complete=["n1"])
    assert (v.state, v.consistency) == (S.COMPLETE, S.CRASH)
    assert "barrier incomplete on 1 of 2 nodes (n2)" in v.reason
    assert v.failed_nodes == ("n2",)


def test_missing_barrier_fails_when_crash_consistency_is_not_allowed():
    v = run(ack_list=acks(["n1"]), complete=["n1"], allow_crash=False)
    assert (v.state, v.consistency) == (S.FAILED, S.NONE)
    assert "allow_crash_consistent is false" in v.reason and "n2" in v.reason


def test_incomplete_node_ranks_do_not_count_as_a_barrier():
    # n2 has acks but its node_barrier_complete said no (one of two local ranks)
    v = run(ack_list=acks(local_size=2)[:3], complete=["n1"])
    assert v.consistency == S.CRASH and "(n2)" in v.reason


def test_barrier_seen_after_a_cut_began_is_not_app_consistent():
    v = run(ack_list=acks(seen=105))  # cuts started at 100 ms
    assert v.consistency == S.CRASH
    assert "barrier completed after a cut began on n1, n2" in v.reason


def test_node_local_cut_only_needs_its_own_nodes_barrier():
    late_n2 = [AckFact("n1", 0, 0, 1, 5, at(10), at(20)), AckFact("n2", 1, 0, 1, 5, at(10), at(150))]
    outs = {1: PartOutcome(1, True, at(100), at(101), True), 2: PartOutcome(2, True, at(200), at(201), True)}
    v = run(ack_list=late_n2, outs=outs, vols=VOLS[:2])
    assert v.consistency == S.APP, v.reason
    outs[3] = PartOutcome(3, True, at(100), at(101), True)  # a shared cut before n2's barrier
    v = run(ack_list=late_n2, outs=outs)
    assert v.consistency == S.CRASH and "after a cut began on n2" in v.reason


def test_acknowledgement_older_than_the_request_is_rejected():
    v = run(ack_list=acks(written=-5000))
    assert v.consistency == S.CRASH and "written before the request" in v.reason


def test_ranks_at_different_steps_are_noted_not_downgraded():
    mixed = acks()[:1] + [AckFact("n2", 1, 0, 1, 6, at(10), at(20))]
    v = run(ack_list=mixed)
    assert v.consistency == S.APP and "note: ranks acknowledged different steps (5, 6)" in v.reason
    assert v.checkpoint_step == 5  # every rank has a checkpoint at least this new


def test_manifest_failure_or_unknown_blocks_app_consistency():
    bad = outcomes()
    bad[2] = PartOutcome(2, True, at(100), at(101), False, manifest_why="/x is missing from the snapshot")
    v = run(outs=bad)
    assert v.consistency == S.CRASH and "manifest check failed on scratch@n2: /x is missing" in v.reason
    assert v.manifest_ok is False
    v = run(outs=outcomes(manifest_ok=None))
    assert v.consistency == S.CRASH and "could not be checked" in v.reason


def test_checkpoint_outside_the_volumes_blocks_app_consistency():
    v = run(outside=["checkpoint files outside every declared volume: /home/a/x@n1"])
    assert v.consistency == S.CRASH and "/home/a/x@n1" in v.reason


def test_missing_volume_is_partial_naming_volume_node_and_error():
    v = run(outs=outcomes(ids=(1, 3), failed=(2,)))
    assert v.state == S.PARTIAL
    assert "missing 1 of 3 volumes: scratch@n2 (btrfs exited with status 1: boom)" in v.reason
    assert "nodes without a complete cut: n2" in v.reason
    assert v.failed_nodes == ("n2",) and v.missing == ("scratch@n2",)
    assert v.consistency == S.APP  # what is there is still consistent


def test_node_whose_prolog_never_recorded_its_volume_makes_the_set_partial():
    nodes = ["n1", "n2", "n3"]
    v = run(nodes=nodes, ack_list=acks(nodes), complete=nodes)
    assert v.state == S.PARTIAL
    assert "scratch@n3 (never recorded by the node's Prolog)" in v.reason and "n3" in v.failed_nodes


def test_nothing_cut_is_failed():
    v = run(outs=outcomes(ids=(), failed=(1, 2, 3)))
    assert (v.state, v.consistency) == (S.FAILED, S.NONE)
    assert v.reason.startswith("no volume was cut")


def test_crash_requested_is_labelled_crash_without_barriers():
    v = run(wanted="crash", ack_list=[], complete=[])
    assert (v.state, v.consistency) == (S.COMPLETE, S.CRASH)
    assert "as requested" in v.reason and v.failed_nodes == ()


def test_skew_is_last_end_minus_first_start_over_cut_parts():
    outs = [PartOutcome(1, True, at(0), at(5)), PartOutcome(2, True, at(3), at(40)),
            PartOutcome(3, False, at(0), at(900))]
    assert skew(outs) == pytest.approx(0.040)
    assert skew([]) is None


def test_stale_reason_rules():
    now = at(100_000)
    kw = dict(owner_token="h:1:2", requested_at=at(0), now=now)
    assert stale_reason(deadline=None, older_than=0, alive=True, **kw) is None
    assert "is gone" in stale_reason(deadline=None, older_than=0, alive=False, **kw)
    assert "deadline" in stale_reason(deadline=at(50_000), older_than=0, alive=True, **kw)
    assert stale_reason(deadline=at(50_000), older_than=200, alive=False, **kw) is None  # too young
    assert stale_reason(deadline=None, older_than=0, alive=None, **kw) is None
    assert "no owner" in stale_reason(deadline=None, older_than=10, alive=None, **kw)
