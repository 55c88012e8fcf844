"""Where a drill's ranks run, and (placed on other nodes) what must be brought there first.

A drill runs as a Slurm job on the nodes that hold the set's node-local
parts (`positions`): position k of the drill job takes the ranks of the
job's node k, on that node, or on a node that holds a copy of its parts
(a partner copy: the schedule runner's drills prefer those, so the drill
proves the copy a node's loss would need). Nothing moves for that.

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
    # --other-nodes: usable nodes that cut nothing of the set (when `nodes` is empty).
    other_nodes: bool = False

    @property
    def moves(self) -> bool:
        """On nodes that hold nothing of the set yet: the parts are brought there first."""
        return bool(self.nodes) or self.other_nodes


@dataclass(frozen=True)
class Position:
    """One node of a drill job: `node` stands in for the job's node
    `stands_for` and clones the node-local parts `snapshot_ids` (its own,
    or copies it holds, at their original's path)."""
    node: str
    stands_for: str
    snapshot_ids: tuple[int, ...] = ()


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


def positions(snapshots, job_nodes: list[str], copies, *, prefer_copies: bool,
              usable: Callable[[], list[str]]) -> list[Position]:
    """The drill job's nodes, by the job's position: for each of the job's
    nodes, a usable node that holds every node-local part cut there (the
    node itself, or one with a complete copy of them all; with
    `prefer_copies` a copy first), never one node for two positions. Raises
    Conflict (no fault of the set: the drill is retried) when a position
    has no such node; [] for a set without node-local parts."""
    local = [s for s in snapshots if s.volume.scope == "node-local"]
    if not local:
        return []
    job_nodes = list(job_nodes) or sorted({s.node for s in local})
    held: dict[int, set[str]] = {}
    for c in copies:
        held.setdefault(c.snapshot_id, set()).add(c.node)
    lost = {s.node for s in local if s.state == S.PART_LOST}
    # Only a choice needs Slurm's word (one sinfo): without copies every
    # position is its own node, and a node that is down keeps the drill job
    # queued until [restore] queue_timeout abandons it.
    up = set(usable()) if held else {s.node for s in local} | set(job_nodes)
    out: list[Position] = []
    taken: set[str] = set()
    for o in job_nodes:
        parts = [s for s in local if s.node == o]
        holders = set.intersection(*(held.get(s.id, set()) for s in parts)) if parts else set()
        own = [o] if o not in lost else []
        order = sorted(holders - lost) + own if prefer_copies else own + sorted(holders - lost)
        choice = next((n for n in order if n in up and n not in taken), None)
        if choice is None:
            raise errors.Conflict(f"no usable node holds the node-local parts of the job's node {o} "
                                  f"(held on {', '.join(order) or 'none'}; usable: {', '.join(sorted(up)) or 'none'})")
        taken.add(choice)
        out.append(Position(node=choice, stands_for=o, snapshot_ids=tuple(s.id for s in parts)))
    return out


def positions_of(placed: Placed, snapshots) -> list[Position]:
    """A placement on other nodes as the drill job's positions: each node
    clones the parts targeted at it (after they are brought there)."""
    local = [s for s in snapshots if s.volume.scope == "node-local"]
    old = {v: k for k, v in placed.node_map.items()}
    return [Position(node=n, stands_for=old.get(n, ""),
                     snapshot_ids=tuple(s.id for s in local if placed.target.get(s.id) == n))
            for n in placed.nodes]
