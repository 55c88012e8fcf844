"""The set label as a pure function: injected times, no I/O."""
from __future__ import annotations

import datetime as dt

import pytest

from slurm_snap import states as S
from slurm_snap.protocol.repair import stale_reason
from slurm_snap.inventory.records import SnapshotRecord
from slurm_snap.jobrecords import Ack
from slurm_snap.protocol.verdict import decide, expected_parts, judge, node_barriers, skew

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)


def at(ms: float) -> dt.datetime:
    return T0 + dt.timedelta(milliseconds=ms)


class Vol:
    def __init__(self, id, node, scope, cls, path=None):
        self.id, self.node, self.scope, self.volume_class = id, node, scope, cls
        self.path = path or (f"/scratch/{node}/jobs/1" if scope == "node-local" else "/pfs/jobs/1")


NODES = ["n1", "n2"]
VOLS = [Vol(1, "n1", "node-local", "scratch"), Vol(2, "n2", "node-local", "scratch"), Vol(3, "", "shared", "pfs")]


def ack(node, rank, local_rank, local_size, step, written, seen, **kw):
    return Ack(node=node, rank=rank, local_rank=local_rank, local_size=local_size, step=step,
               written_at=at(written), seen_at=at(seen), **kw)


def acks(nodes=NODES, written=10, seen=20, step=5, local_size=1, **kw):
    return [ack(n, i * local_size + lr, lr, local_size, step, written, seen, **kw)
            for i, n in enumerate(nodes) for lr in range(local_size)]


def part(volume_id, ok, start, end, manifest_ok=None, why="", error=""):
    return SnapshotRecord(volume_id=volume_id, backend="btrfs", name=f"snap-{volume_id}", ref="", path="",
                          node="", cut_started_at=at(start), cut_at=at(end), state="CUT" if ok else "MISSING",
                          error=why if ok else error, manifest_ok=manifest_ok if ok else None)


def outcomes(ids=(1, 2, 3), start=100, end=110, manifest_ok=True, failed=()):
    out = {i: part(i, True, start, end + i, manifest_ok) for i in ids}
    for i in failed:
        out[i] = part(i, False, start, end, error="btrfs exited with status 1: boom")
    return out


def run(*, wanted="app", ack_list=None, complete=NODES, outs=None, allow_crash=True, vols=VOLS, nodes=NODES, **kw):
    ack_list = acks() if ack_list is None else ack_list
    return decide(wanted=wanted, nodes=nodes, parts=expected_parts(vols, nodes),
                  outcomes=outcomes() if outs is None else outs,
                  barriers=node_barriers(ack_list, complete), requested_at=at(0), allow_crash=allow_crash,
                  acks=ack_list, **kw)


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
    late_n2 = [ack("n1", 0, 0, 1, 5, 10, 20), ack("n2", 1, 0, 1, 5, 10, 150)]
    outs = {1: part(1, True, 100, 101, True), 2: part(2, True, 200, 201, True)}
    v = run(ack_list=late_n2, outs=outs, vols=VOLS[:2])
    assert v.consistency == S.APP, v.reason
    outs[3] = part(3, True, 100, 101, True)  # a shared cut before n2's barrier
    v = run(ack_list=late_n2, outs=outs)
    assert v.consistency == S.CRASH and "after a cut began on n2" in v.reason


def test_acknowledgement_older_than_the_request_is_rejected():
    v = run(ack_list=acks(written=-5000))
    assert v.consistency == S.CRASH and "written before the request" in v.reason


def test_ranks_at_different_steps_are_not_one_point():
    # The demo's old outcome: ranks 0 and 2 at step 8, rank 1 at step 7, all
    # barriers complete. A lockstep job resumed from that diverges.
    nodes = ["n1", "n2", "n3"]
    vols = [Vol(3, "", "shared", "pfs")]
    mixed = [ack("n1", 0, 0, 1, 8, 10, 20), ack("n2", 1, 0, 1, 7, 10, 20), ack("n3", 2, 0, 1, 8, 10, 20)]
    v = run(ack_list=mixed, nodes=nodes, complete=nodes, vols=vols)
    assert (v.state, v.consistency) == (S.COMPLETE, S.CRASH)
    assert "ranks acknowledged different steps (step 7: ranks 1; step 8: ranks 0, 2)" in v.reason
    v = run(ack_list=mixed, nodes=nodes, complete=nodes, vols=vols, allow_crash=False)
    assert v.state == S.FAILED


def test_independent_ranks_at_different_steps_are_app_consistent_with_a_note():
    mixed = [ack("n1", 0, 0, 1, 5, 10, 20, independent=True), ack("n2", 1, 0, 1, 6, 10, 20, independent=True)]
    v = run(ack_list=mixed)
    assert v.consistency == S.APP and "note: ranks acknowledged different steps (5, 6)" in v.reason
    assert v.checkpoint_step == 5  # every rank has a checkpoint at least this new
    # One rank that did not declare it is enough to make the steps a problem.
    v = run(ack_list=mixed[:1] + [ack("n2", 1, 0, 1, 6, 10, 20)])
    assert v.consistency == S.CRASH


def test_failed_step_agreement_is_not_app_consistent_even_at_one_step():
    bad = acks()[:1] + [ack("n2", 1, 0, 1, 5, 10, 20, agreement="failed: all_reduce timed out after 30 s")]
    v = run(ack_list=bad)
    assert v.consistency == S.CRASH
    assert "step agreement failed on ranks 1 (failed: all_reduce timed out after 30 s)" in v.reason
    assert run(ack_list=acks(agreement="collective")).consistency == S.APP


def test_ranks_short_of_the_world_size_are_not_a_barrier():
    # torchrun with 2 workers per node, each taking SLURM_LOCALID=0 of 1: the
    # nodes look complete, the world says 4 ranks and only 2 were heard from.
    v = run(ack_list=acks(world_size=4))
    assert v.consistency == S.CRASH and "2 of 4 ranks acknowledged (missing ranks 2, 3)" in v.reason
    assert run(ack_list=acks(world_size=2)).consistency == S.APP
    odd = acks(world_size=2)[:1] + [ack("n2", 1, 0, 1, 5, 10, 20, world_size=3)]
    assert "disagree on the world size (2, 3)" in run(ack_list=odd).reason


def test_judge_decides_node_completeness_and_words_files_outside():
    two = acks(local_size=2)
    parts = list(outcomes().values())
    v = judge(wanted="app", volumes=VOLS, nodes=NODES, acks=two, parts=parts, requested_at=at(0),
              allow_crash=True)
    assert v.consistency == S.APP, v.reason
    v = judge(wanted="app", volumes=VOLS, nodes=NODES, acks=two[:3], parts=parts, requested_at=at(0),
              allow_crash=True, outside=["/home/a/x@n1"])
    assert v.consistency == S.CRASH and "(n2)" in v.reason
    assert "checkpoint files outside every declared volume: /home/a/x@n1" in v.reason


def test_manifest_failure_or_unknown_blocks_app_consistency():
    bad = outcomes()
    bad[2] = part(2, True, 100, 101, False, why="/x is missing from the snapshot")
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
    # What is there is still consistent, but the set is no point to restore
    # from: its own label says none, its parts' label says what they are.
    assert (v.consistency, v.parts_consistency, v.resumable) == (S.NONE, S.APP, False)


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
    outs = [part(1, True, 0, 5), part(2, True, 3, 40), part(3, False, 0, 900)]
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


def test_a_node_with_a_missing_worker_is_named_with_the_missing_local_ranks():
    """torchrun with 4 workers per node: n2's workers 1 and 3 never answered.
    The node's count comes from the workers' launcher (local_size 4), not
    from the two acknowledgements that arrived."""
    got = acks(["n1", "n2"], local_size=4)
    got = [a for a in got if not (a.node == "n2" and a.local_rank in (1, 3))]
    v = run(ack_list=got, complete=["n1"])
    assert (v.state, v.consistency) == (S.COMPLETE, S.CRASH)
    assert "barrier incomplete on 1 of 2 nodes (n2)" in v.reason
    assert "n2: local ranks 1, 3 of 4 did not acknowledge" in v.reason, v.reason
    assert v.failed_nodes == ("n2",)


def test_ranks_disagreeing_on_a_nodes_size_are_named():
    got = [ack("n1", 0, 0, 1, 5, 10, 20), ack("n2", 1, 0, 2, 5, 10, 20), ack("n2", 2, 1, 4, 5, 10, 20)]
    v = run(ack_list=got, complete=["n1"])
    assert "n2: ranks disagree on how many run there (2, 4)" in v.reason, v.reason
