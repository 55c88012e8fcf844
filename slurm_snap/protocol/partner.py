"""Partner copies: after the cut, each node-local part of a restorable set is
copied to a partner node, so that losing one node loses no set (SCR's
"Partner" redundancy). The partner of node k of a job is node k+1 of the
job's node list (the last one's is the first): another node of the same job,
which the job's owner already uses and whose scratch has the same layout.
A one-node job has no partner and its sets stay single-copy (show says so).

Queued by the schedule runner on the controller (`[restore] partner_copies`),
never in the cut's critical path; made by the two nodes' agents, the part's
node streaming it to its partner's (nodetasks/stream.py), never through the
controller or over SSH. The stream is incremental against the
previous set's part of the same volume when the partner holds that one
(btrfs send -p: 1% changed costs ~1% of a full copy, docs/benchmarks.md).
"""
from __future__ import annotations



def partner_of(node: str, nodes: list[str]) -> str | None:
    if node not in nodes or len(nodes) < 2:
        return None
    return nodes[(nodes.index(node) + 1) % len(nodes)]


def make_copies(cfg, inventory, *, limit: int = 100) -> list[str]:
    """One pass: queue a transfer (nodetasks: the part's node's agent sends,
    its partner's agent receives) for each part that needs a partner and has
    none under way, at most `limit`; one line each. The copy is recorded when
    the receiver reports (nodetasks.ops.finished), so show and `Survives`
    count only a copy that arrived."""
    from ..nodetasks.ops import queue_transfer

    lines = []
    with inventory.session() as repo:
        for p in repo.parts_needing_partner(limit):
            partner = partner_of(p.node, list(p.set.job_run.nodes or []))
            if partner is None:
                continue
            # Incremental only on a first attempt: a failed one may have been the parent's fault.
            parent = None if repo.failed_node_tasks(p.id, kind="receive", purpose="partner") else \
                repo.partner_parent(node=p.node, partner=partner, volume_path=p.volume.path, before_set=p.set_id)
            if queue_transfer(repo, p, to_node=partner, purpose="partner", parent=parent):
                lines.append(f"set {p.set_id}: {p.volume.volume_class} part on {p.node} queued for {partner}"
                             + (f" (incremental against set {parent.set_id}'s)" if parent is not None else ""))
    return lines
