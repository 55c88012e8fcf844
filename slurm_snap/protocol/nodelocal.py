"""Node-local parts follow the job: a requeued run may land on other nodes
(Slurm does not promise the same ones), and each rank's node-local part of
the set it resumes from must be on the node where that rank now runs.

Mapping is by rank. A rank's old node is the node its acknowledgement came
from; its new node is the node at the same position of the new run's node
list (Slurm keeps a requeued job's geometry: the same node count and tasks
per node, placed in node-list order, so position k holds the same ranks).
A part goes to every new node whose ranks had it, unless that node already
holds it (the same node again, or an earlier copy).

Everything here runs on the controller (the service runs it for the head
node's Prolog): it alone has the SSH key to every node, and the stream goes
node -> controller -> node (backends.transfer). Transfers run in parallel,
all within one budget; what did not arrive in time is a missing part, named
in resume.json, `show` and the job's output, and the run starts without it.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time

from .. import progress
from .. import states as S
from ..backends.base import SnapshotRef
from ..errors import SnapError
from ..inventory.records import CopyRecord

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PartView:
    """What planning needs of a node-local part (a Snapshot row)."""

    snapshot_id: int
    volume_class: str
    node: str
    ref: str
    path: str
    backend: str
    volume: str
    name: str

    @classmethod
    def of(cls, snapshot) -> "PartView":
        """From an inventory Snapshot row, read while its session is open."""
        return cls(snapshot.id, snapshot.volume.volume_class, snapshot.node, snapshot.ref, snapshot.path,
                   snapshot.backend, snapshot.volume.path, snapshot.name)

    def snapshot_ref(self) -> SnapshotRef:
        """The backend's handle of this part (the same ref on whichever node holds a copy)."""
        return SnapshotRef(backend=self.backend, volume=self.volume, name=self.name, ref=self.ref,
                           path=self.path or None)


@dataclasses.dataclass(frozen=True)
class Move:
    part: PartView
    to_node: str
    ranks: tuple[int, ...]
    source_node: str         # the original's node, or a node holding a copy
    # A snapshot of the same volume both nodes hold: send only what changed
    # since it (btrfs send -p). Tried once; on failure the full stream.
    parent: PartView | None = None


def place_ranks(old_nodes: list[str], new_nodes: list[str], rank_old: dict[int, str]) -> dict[int, str | None]:
    """rank -> the node it runs on in the new run (None: the new run has no
    node at that position, or the old node is not in the old list)."""
    out: dict[int, str | None] = {}
    for rank, node in rank_old.items():
        pos = old_nodes.index(node) if node in old_nodes else None
        out[rank] = new_nodes[pos] if pos is not None and pos < len(new_nodes) else None
    return out


def plan(parts: list[PartView], rank_old: dict[int, str], rank_new: dict[int, str | None],
         held: dict[int, set[str]], lost_nodes: frozenset[str] = frozenset(), *,
         prefer_copies: bool = False) -> tuple[list[Move], list[str]]:
    """Moves that put every rank's node-local parts where it now runs, and
    what cannot be placed at all (why, one line each). `held` maps a part
    to the other nodes holding a complete copy of it. `prefer_copies` reads
    from a copy (a partner's) before the original: a drill that proves the
    copy restores, rather than the original a second time."""
    moves, unplaceable = [], []
    for part in parts:
        ranks_here = sorted(r for r, n in rank_old.items() if n == part.node)
        targets: dict[str, list[int]] = {}
        for r in ranks_here:
            new = rank_new.get(r)
            if new is None:
                unplaceable.append(f"rank {r}'s {part.volume_class} part (cut on {part.node}): the new run has "
                                   "no node at its position")
                continue
            targets.setdefault(new, []).append(r)
        copies = held.get(part.snapshot_id, set())
        for node, ranks in sorted(targets.items()):
            if node == part.node or node in copies:
                continue
            original = [part.node] if part.node not in lost_nodes else []
            others = sorted(copies - lost_nodes)
            sources = others + original if prefer_copies else original + others
            if not sources:
                unplaceable.append(f"{part.volume_class} part of rank(s) {', '.join(map(str, ranks))} (cut on "
                                   f"{part.node}): no copy survives")
                continue
            moves.append(Move(part, node, tuple(ranks), sources[0]))
    return moves, unplaceable


def follow(parts: list[PartView], old_nodes: list[str], new_nodes: list[str], rank_old: dict[int, str],
           held: dict[int, set[str]], lost_nodes: frozenset[str] = frozenset(), *,
           prefer_copies: bool = False) -> tuple[dict[int, str | None], list[Move], list[str]]:
    """The one mapping of a set's ranks onto a new node list, for a requeued
    run (protocol.resume) and a drill placed on other nodes (restore.drill):
    (rank -> new node, the moves that bring each rank's parts there, what
    cannot be placed)."""
    rank_new = place_ranks(old_nodes, list(new_nodes), rank_old)
    moves, unplaceable = plan(parts, rank_old, rank_new, held, lost_nodes, prefer_copies=prefer_copies)
    return rank_new, moves, unplaceable


def execute(cfg, moves: list[Move], *, budget: float, for_restart: int | None, purpose: str = "restore",
            backend_on=None) -> list[CopyRecord]:
    """Run the moves in parallel within `budget` seconds; one record each
    (state OK with what moved, or FAILED with why)."""
    from ..backends import transfer as xfer

    if backend_on is None:
        from ..backends.factory import backend_on_node

        backend_on = lambda vclass, node: backend_on_node(cfg, vclass, node)  # noqa: E731
    deadline = time.monotonic() + budget

    def one(m: Move) -> CopyRecord:
        base = dict(snapshot_id=m.part.snapshot_id, node=m.to_node, ref=m.part.ref, path=m.part.path,
                    purpose=purpose, source_node=m.source_node, ranks=m.ranks, for_restart=for_restart)
        left = deadline - time.monotonic()
        if left <= 0:
            return CopyRecord(**base, state=S.COPY_FAILED,
                              error=f"not started: the {budget:g} s budget (restore.move_budget) was spent")
        ref = m.part.snapshot_ref()
        parent = None if m.parent is None else m.parent.snapshot_ref()
        try:
            source, target = backend_on(m.part.volume_class, m.source_node), backend_on(m.part.volume_class, m.to_node)
            try:
                got = xfer.transfer(source, ref, target, timeout=left, parent=parent)
            except SnapError:
                if parent is None:
                    raise
                # The parent may have been pruned on one side since: a full
                # stream costs more but needs nothing on the target.
                got = xfer.transfer(source, ref, target, timeout=max(0.1, deadline - time.monotonic()))
        except SnapError as exc:
            return CopyRecord(**base, state=S.COPY_FAILED, error=str(exc)[:2000])
        except Exception as exc:  # noqa: BLE001 -- a failed copy is a missing part, never a failed Prolog
            log.exception("moving %s to %s", m.part.ref, m.to_node)
            return CopyRecord(**base, state=S.COPY_FAILED, error=f"{exc.__class__.__name__}: {exc}"[:2000])
        progress.advance(0, nbytes=got.bytes or 0)   # the line shows bytes moved; callers count the items
        return CopyRecord(**base, method=got.method, bytes=got.bytes, seconds=round(got.seconds, 6))

    if not moves:
        return []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(moves))) as pool:
        return list(pool.map(one, moves))


def describe(c: CopyRecord, volume_class: str = "") -> str:
    what = f"{volume_class + ' ' if volume_class else ''}part of rank(s) {', '.join(map(str, c.ranks))}"
    if c.ok:
        size = f"{(c.bytes or 0) / (1 << 20):.1f} MiB" if c.method != "present" else "already there"
        return f"{what} brought from {c.source_node} to {c.node}: {size} in {c.seconds or 0:.2f} s ({c.method})"
    return f"{what} (cut on {c.source_node}) is not on {c.node}: {c.error}"
