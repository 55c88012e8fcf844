"""Partner copies: after the cut, each node-local part of a restorable set is
copied to a partner node, so that losing one node loses no set (SCR's
"Partner" redundancy). The partner of node k of a job is node k+1 of the
job's node list (the last one's is the first): another node of the same job,
which the job's owner already uses and whose scratch has the same layout.
A one-node job has no partner and its sets stay single-copy (show says so).

Run by the schedule runner on the controller (`[restore] partner_copies`),
never in the cut's critical path. The stream is incremental against the
previous set's part of the same volume when the partner holds that one
(btrfs send -p: 1% changed costs ~1% of a full copy, docs/benchmarks.md).
"""
from __future__ import annotations

from ..inventory.records import CopyRecord
from . import nodelocal


def partner_of(node: str, nodes: list[str]) -> str | None:
    if node not in nodes or len(nodes) < 2:
        return None
    return nodes[(nodes.index(node) + 1) % len(nodes)]


def make_copies(cfg, inventory, *, limit: int = 100, backend_on=None) -> list[CopyRecord]:
    """One pass: copy the parts that need a partner (at most `limit`), within
    restore.partner_budget; every copy (or failure) is recorded."""
    moves = []
    with inventory.session(readonly=True) as repo:
        for p in repo.parts_needing_partner(limit):
            partner = partner_of(p.node, list(p.set.job_run.nodes or []))
            if partner is None:
                continue
            parent = repo.partner_parent(node=p.node, partner=partner, volume_path=p.volume.path,
                                         before_set=p.set_id)
            moves.append(((p.set_id, p.set.job_id), nodelocal.Move(nodelocal.PartView.of(p), partner, (), p.node,
                                                   nodelocal.PartView.of(parent) if parent is not None else None)))
    if not moves:
        return []
    records = nodelocal.execute(cfg, [m for _s, m in moves], budget=cfg.restore.partner_budget, for_restart=None,
                                purpose="partner", backend_on=backend_on)
    set_of = {m.part.snapshot_id: s for s, m in moves}
    with inventory.session() as repo:
        for set_id, job_id in sorted(set(set_of.values())):
            mine = [c for c in records if set_of[c.snapshot_id] == (set_id, job_id)]
            repo.record_copies(set_id, mine)
            for c in mine:
                repo.event("partner", f"set {set_id}: partner copy " + nodelocal.describe(c)
                           .replace("part of rank(s)  ", "").replace("brought from", "from"),
                           job_id=job_id, set_id=set_id, node=c.node, level="info" if c.ok else "error")
    return records
