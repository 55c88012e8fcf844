"""Where a placed drill's ranks run, and what must be brought there first.

Placed on other nodes (restore-test --other-nodes / --nodelist, and the
schedule runner's drills with partner copies), a drill proves the hard case
of a requeue: each rank's node-local part is first brought to the node at its
rank's position in the drill's node list (protocol.nodelocal, the same
mapping as a requeued run's Prolog), cloned there, and the command runs on
exactly those nodes. `place` only decides (no I/O but the `usable` nodes it
is given); the drill (drill.py) brings, clones and runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import errors
from .. import states as S
from ..protocol import nodelocal


@dataclass(frozen=True)
class Placement:
    """Run a drill's ranks on other nodes than the ones that cut the set.

    `nodes`: the drill's node list, position k taking the ranks of the job's
    node k; empty: usable nodes Slurm has that cut nothing of the set, in
    sinfo's order. `prefer_copies`: bring a part from a copy (a partner's)
    when one exists, proving the copy. `only_node_local`: a set without
    node-local parts is drilled the ordinary way (the schedule runner)."""
    nodes: tuple[str, ...] = ()
    prefer_copies: bool = False
    only_node_local: bool = False


@dataclass
class Placed:
    """A placement resolved against one set (Plan.placed)."""
    nodes: list                 # the drill's node list
    node_map: dict              # the job's node -> the drill's node, by position
    moves: list                 # nodelocal.Move: parts to bring first
    unplaceable: list           # why a part cannot be brought (fails the drill)
    target: dict                # snapshot id -> node its clone goes on


# sinfo's node states a drill may be placed on (it waits in the queue for a busy one).
USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})


def usable_nodes() -> list[str]:
    """The nodes Slurm has that a drill may be placed on, in sinfo's order."""
    from ..slurm.api import interface

    return [n for n, (state, _why) in interface().node_states().items() if state.lower() in USABLE_STATES]


def place(snapshots, old_nodes: list[str], acks, copies, placement: Placement,
          usable: Callable[[], list[str]]) -> Placed:
    """Resolve a placement against a set: the drill's nodes, and the moves
    that put each rank's node-local parts on its node (nodelocal.follow, the
    requeue's mapping). Raises when no such node list exists (not the set's
    fault); a part that cannot be brought is listed in `unplaceable`."""
    local = [s for s in snapshots if s.volume.scope == "node-local"]
    old_nodes = list(old_nodes) or sorted({s.node for s in local})
    cut = {s.node for s in local}
    if placement.nodes:
        nodes = list(placement.nodes)
        if len(set(nodes)) != len(nodes):
            raise errors.BadValueError(what="--nodelist", value=",".join(nodes), why="names a node twice")
        # Root reaches these hosts over SSH to bring the parts: only nodes
        # Slurm has and would run the drill on, never any host a user types.
        known = set(usable())
        strange = [n for n in nodes if n not in known]
        if strange:
            raise errors.BadValueError(what="--nodelist", value=",".join(nodes),
                                       why=f"{', '.join(strange)}: not a usable Slurm node")
        # A part's copy has its original's path: on a node that cut another
        # part of the set it would land on that part.
        clash = [n for k, n in enumerate(nodes) if n in cut and (k >= len(old_nodes) or old_nodes[k] != n)]
        if clash:
            raise errors.BadValueError(what="--nodelist", value=",".join(nodes),
                                       why=f"{', '.join(clash)} cut another rank's part of the set; a node of the "
                                           "set may only keep its own position")
    else:
        nodes = [n for n in usable() if n not in cut and n not in old_nodes][:len(old_nodes)]
    if len(nodes) < len(old_nodes):
        raise errors.Conflict(f"the drill needs {len(old_nodes)} node(s) at the job's positions "
                              f"({','.join(old_nodes)}) but has {','.join(nodes) or 'none'}"
                              + ("" if placement.nodes else " usable outside the nodes that cut the set"))
    nodes = nodes[:len(old_nodes)]
    # One rank per node when the set has no acknowledgements (crash-consistent):
    # position k stands for the job's node k.
    rank_old = {a.rank: a.node for a in acks} or dict(enumerate(old_nodes))
    held: dict[int, set[str]] = {}
    for c in copies:
        held.setdefault(c.snapshot_id, set()).add(c.node)
    lost = frozenset(s.node for s in local if s.state == S.PART_LOST)
    views = [nodelocal.PartView.of(s) for s in local]
    rank_new, moves, unplaceable = nodelocal.follow(views, old_nodes, nodes, rank_old, held, lost,
                                                    prefer_copies=placement.prefer_copies)
    target: dict[int, str] = {}
    for s in local:
        news = sorted({rank_new.get(r) for r, n in rank_old.items() if n == s.node} - {None})
        if not news:
            if not any(n == s.node for n in rank_old.values()):
                unplaceable.append(f"{s.volume.volume_class} part cut on {s.node}: no rank of the job ran there "
                                   "to place it by")
            continue
        # There when cloned: its own node, a copy already held there, or the move's.
        target[s.id] = news[0]
    node_map = {o: nodes[k] for k, o in enumerate(old_nodes)}
    return Placed(nodes=nodes, node_map=node_map, moves=moves, unplaceable=unplaceable, target=target)
