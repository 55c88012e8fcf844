"""Where a requeued run resumes from: resume.json's content (a
jobrecords.ResumeRecord, one ResumeRank per rank), computed on the
controller for the head node's Prolog (through the service, or in the hook
on a host with the database).

A rank's checkpoint on a shared volume is where it always was; one on a
node-local volume is on its old node's disk, and is brought to its new node
first (protocol.nodelocal) when the run landed elsewhere.
"""
from __future__ import annotations

import dataclasses
import os

from .. import states as S
from ..jobrecords import ResumeRank, ResumeRecord
from . import nodelocal


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """resume.json for a requeued run, and the job's uid to write it for."""

    resume: ResumeRecord
    uid: int


def _part_for(live: str, node: str, parts) -> tuple[object | None, str | None]:
    """The part holding `live` as rank on `node` wrote it, and the path inside its snapshot."""
    for p in parts:
        v = p.volume
        if v.scope == "node-local" and v.node != node:
            continue
        root = v.path.rstrip("/")
        if live == root or live.startswith(root + "/"):
            rel = live[len(root):].lstrip("/")
            return p, (os.path.join(p.path, rel) if rel else p.path)
    return None, None


def resume_point(cfg, inventory, job_id: int, *, nodes: list | None = None, restart_count: int | None = None,
                 budget: float | None = None) -> ResumePoint | None:
    with inventory.session() as repo:
        st = repo.newest_set(job_id, consistency=S.APP)
        if st is None:
            return None
        acks = [a for a in repo.ack_records(st.id) if a.manifest]
        # A LOST part (its node or disk is gone: protocol.nodeloss) may still
        # have a copy elsewhere to bring over.
        parts = [p for p in repo.snapshots(st.id) if p.state in S.PART_HELD and p.path]
        lost_nodes = frozenset(p.node for p in parts if p.state == S.PART_LOST)
        if not acks or not parts:
            return None
        uid, old_nodes = st.job_run.uid, list(st.job_run.nodes or [])
        set_id, step = st.id, st.checkpoint_step
        held: dict[int, set[str]] = {}
        for c in repo.copies(st.id, states=(S.COPY_OK,)):
            held.setdefault(c.snapshot_id, set()).add(c.node)
        per_rank = {}
        for a in acks:
            paths = [e.path for e in a.manifest]
            live = paths[0] if len(paths) == 1 else os.path.commonpath(paths)
            part, inside = _part_for(live, a.node, parts)
            # Ids, not rows: the rows are not read after the transaction.
            per_rank[a.rank] = (a.node, live, part.id if part is not None else None, inside)
        views = {p.id: nodelocal.PartView.of(p) for p in parts if p.volume.scope == "node-local"}
        first = min(acks, key=lambda a: a.rank)
        if step is None:
            step = first.step
    rank_old = {r: v[0] for r, v in per_rank.items()}
    # Without both node lists there is nothing to map by: assume the same
    # nodes (what every run before this feature did) rather than call every
    # part missing.
    # Only the parts that hold a rank's checkpoint need to be where the rank is.
    needed = [views[i] for i in sorted({v[2] for v in per_rank.values() if v[2] in views})]
    if nodes and old_nodes:
        rank_new, moves, unplaceable = nodelocal.follow(needed, old_nodes, list(nodes), rank_old, held, lost_nodes)
    else:
        rank_new = dict(rank_old)
        moves, unplaceable = nodelocal.plan(needed, rank_old, rank_new, held, lost_nodes)
    missing = list(unplaceable)
    records = []
    if moves:
        limit = cfg.restore.move_budget if budget is None else min(cfg.restore.move_budget, budget)
        records = nodelocal.execute(cfg, moves, budget=max(0.0, limit), for_restart=restart_count)
        with inventory.session() as repo:
            repo.record_copies(set_id, records)
            for c in records:
                text = nodelocal.describe(c, views[c.snapshot_id].volume_class)
                repo.event("resume", f"set {set_id}: {text}", job_id=job_id, set_id=set_id, node=c.node,
                           level="info" if c.ok else "error")
        for c in records:
            if c.ok:
                held.setdefault(c.snapshot_id, set()).add(c.node)
            else:
                missing.append(nodelocal.describe(c, views[c.snapshot_id].volume_class))
    ranks = []
    for r, (old, live, part, inside) in sorted(per_rank.items()):
        now = rank_new.get(r) or old
        why = ""
        if part is None:
            why = f"no part of set {set_id} holds {live}"
        elif part in views and (now != old or old in lost_nodes) and now not in held.get(part, set()):
            why = f"its {views[part].volume_class} part (cut on {old}) is not on {now}"
        ranks.append(ResumeRank(rank=r, node=now, from_node=old, live=live, checkpoint=None if why else inside,
                                missing=why))
    first_node, first_live, _p, first_inside = per_rank[first.rank]
    return ResumePoint(resume=ResumeRecord(set_id=set_id, step=step, live=first_live, snapshot=first_inside,
                                           ranks=tuple(ranks), missing=tuple(missing)), uid=uid)
