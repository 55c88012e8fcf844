"""protocol.nodelocal: ranks mapped to the new run's nodes by position, the
moves that put each rank's node-local part there, and the budget."""
from __future__ import annotations

from slurm_snap.protocol.nodelocal import Move, PartView, describe, execute, place_ranks, plan


def part(pid: int, node: str) -> PartView:
    return PartView(pid, "scratch", node, f"/s/jobs/.snapshots/p{pid}", f"/s/jobs/.snapshots/p{pid}", "btrfs",
                    "/s/jobs/7", f"p{pid}")


RANKS = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


def test_ranks_keep_their_position_in_the_node_list():
    assert place_ranks(["n1", "n2"], ["n3", "n4"], RANKS) == {0: "n3", 1: "n3", 2: "n4", 3: "n4"}
    # Overlapping placement: n2 now holds position 0.
    assert place_ranks(["n1", "n2"], ["n2", "n3"], RANKS) == {0: "n2", 1: "n2", 2: "n3", 3: "n3"}
    # A shrunken run has no node for the second position.
    assert place_ranks(["n1", "n2"], ["n3"], RANKS) == {0: "n3", 1: "n3", 2: None, 3: None}


def test_plan_moves_only_what_is_not_there():
    parts = [part(1, "n1"), part(2, "n2")]
    moves, bad = plan(parts, RANKS, place_ranks(["n1", "n2"], ["n3", "n4"], RANKS), {})
    assert [(m.part.snapshot_id, m.to_node, m.ranks, m.source_node) for m in moves] == \
        [(1, "n3", (0, 1), "n1"), (2, "n4", (2, 3), "n2")] and bad == []
    # Same nodes: nothing moves. A copy already on the target: nothing moves.
    assert plan(parts, RANKS, dict(RANKS), {}) == ([], [])
    moves, _ = plan(parts, RANKS, place_ranks(["n1", "n2"], ["n3", "n4"], RANKS), {1: {"n3"}})
    assert [m.part.snapshot_id for m in moves] == [2]


def test_plan_reads_from_a_surviving_copy_when_the_first_node_is_lost():
    parts = [part(1, "n1")]
    new = {0: "n3", 1: "n3"}
    moves, bad = plan(parts, {0: "n1", 1: "n1"}, new, {1: {"n2"}}, lost_nodes=frozenset({"n1"}))
    assert [(m.to_node, m.source_node) for m in moves] == [("n3", "n2")] and bad == []
    moves, bad = plan(parts, {0: "n1", 1: "n1"}, new, {}, lost_nodes=frozenset({"n1"}))
    assert moves == [] and len(bad) == 1 and "no copy survives" in bad[0]
    _m, bad = plan(parts, {0: "n1", 1: "n1"}, {0: None, 1: "n3"}, {})
    assert len(bad) == 1 and "rank 0" in bad[0] and "no node at its position" in bad[0]


def test_a_spent_budget_starts_no_transfer_and_says_so():
    called = []

    def backend_on(vclass, node):
        called.append(node)
        raise AssertionError("no backend should be built")

    (rec,) = execute(None, [Move(part(1, "n1"), "n3", (0,), "n1")], budget=0.0, for_restart=2, backend_on=backend_on)
    assert (rec.state, rec.node, rec.for_restart, called) == ("FAILED", "n3", 2, [])
    assert "restore.move_budget" in rec.error and "is not on n3" in describe(rec, "scratch")


def test_a_failed_transfer_is_a_record_not_an_exception():
    from slurm_snap import errors

    def backend_on(vclass, node):
        raise errors.TransportError(host=node, why="cannot connect: no route")

    (rec,) = execute(None, [Move(part(1, "n1"), "n3", (0,), "n1")], budget=5.0, for_restart=1,
                     backend_on=backend_on)
    assert rec.state == "FAILED" and "no route" in rec.error
