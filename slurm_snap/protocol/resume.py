"""Where a requeued run resumes from: resume.json's content (a
jobrecords.ResumeRecord, one ResumeRank per rank), computed on the
controller for the head node's Prolog (through the service, or in the hook
on a host with the database).

A rank's checkpoint on a shared volume is where it always was; one on a
node-local volume is on its old node's disk, and is brought to its new node
first (protocol.nodelocal) when the run landed elsewhere.

The requeued run's Prolog may run while the preempted run's set is still
being delivered (a node's part waits in its spool for the node agent):
resume_point waits for that set to be finalized, and for every part the
nodes' cut records name to be in it (the set may not exist yet: nobody could
open it while the database was away), within half of its budget.
When the service cannot be asked at all, the head node judges the preempted
run's set from the files every node wrote on the shared filesystem
(resume_from_files: job.json, the acknowledgements, each node's cut
record), with the same verdict the controller uses.
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections import namedtuple

from .. import states as S
from ..errors import BadValueError
from ..jobdir import JobDir
from ..jobrecords import ResumeRank, ResumeRecord, preempt_epoch
from . import nodelocal

# How often resume_point looks again at a preemption set still being delivered.
POLL = 0.5


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


def _undelivered(repo, job_id: int, epoch: str, cut: set[str]) -> bool:
    """Parts (by name) the preempted run's nodes cut (their cut records) that the
    inventory does not hold yet in a finalized set of that epoch."""
    st = repo.newest_set(job_id, consistency=None, states=S.STATES)
    if st is None or st.epoch != epoch or st.state in S.ACTIVE:
        return True
    return not cut <= {p.name for p in repo.snapshots(st.id)}


def _wait_for_preemption_set(cfg, inventory, job_id: int, restart_count: int | None, limit: float) -> None:
    """Until no preemption set of the job is in flight and every part the
    preempted run's nodes cut is in its finalized set, or `limit` seconds.
    The second: nodes that cut while the inventory was away deliver from
    their spools, and the set may not even exist yet (nobody could open it)."""
    cut: set[str] = set()
    epoch = preempt_epoch(restart_count - 1) if restart_count else None
    if epoch is not None:
        try:
            cuts = JobDir(cfg.paths.barrier_dir, job_id).read_cuts(epoch)
        except (OSError, BadValueError):
            cuts = {}  # unreadable here: wait only for the sets in flight, as before
        cut = {p.name for r in cuts.values() for p in r.parts if p.state == S.PART_CUT}
    deadline = time.monotonic() + limit
    while True:
        with inventory.session() as repo:
            busy = [st.id for st in repo.active_sets(job_id=job_id) if st.trigger in S.HOOK_TRIGGERS]
            waiting = bool(cut) and _undelivered(repo, job_id, epoch, cut)
        if not (busy or waiting) or time.monotonic() >= deadline:
            return
        time.sleep(POLL)


def resume_point(cfg, inventory, job_id: int, *, nodes: list | None = None, restart_count: int | None = None,
                 budget: float | None = None) -> ResumePoint | None:
    _wait_for_preemption_set(cfg, inventory, job_id, restart_count,
                             (cfg.timeouts.hook_budget if budget is None else budget) / 2)
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


_Volume = namedtuple("_Volume", "scope node path volume_class")
_Part = namedtuple("_Part", "id volume path")


def resume_from_files(cfg, jobdir, restart_count: int, *, nodes: list[str], wanted: str,
                      uid: int) -> ResumeRecord | None:
    """resume.json from the shared filesystem alone, for a requeued run whose
    head node cannot ask the service: the cut records of the preempted run
    (`restart_count`, its epoch preempt-<restart_count>) with the job.json
    its Epilogs read, its ranks' acknowledgements, judged by the verdict the
    controller uses. None unless that says app-consistent and COMPLETE. A
    node-local part is used where it is: a rank that now runs on another
    node is named missing (moving parts needs the controller)."""
    from .barrier import AckCollector
    from .cutter import assign_manifests
    from .delivery import snapshot_record
    from .verdict import judge

    epoch = preempt_epoch(restart_count)
    cuts = jobdir.read_cuts(epoch)
    previous = next((r.job for r in cuts.values() if r.job is not None), None)
    if previous is None or not previous.nodes or not os.path.isdir(jobdir.ack):
        return None
    old_nodes = list(previous.nodes)
    with AckCollector(jobdir.ack, job_id=previous.job_id, epoch=epoch, nodes=old_nodes, owner_uid=uid) as c:
        c.rescan()
    # When each file existed is what its rank wrote: it was there before any
    # cut that began later (this Prolog reads it only now, long after).
    acks = [a.seen(a.written_at) for a in c.state.records()]
    volumes = [dataclasses.replace(v, id=-(i + 1)) for i, v in enumerate(previous.volumes)]
    ids = {(v.node if v.scope == "node-local" else "", v.path): v for v in volumes}
    parts, held = [], []
    for record in cuts.values():
        for p in record.parts:
            v = ids.get((p.node if p.scope == "node-local" else "", p.path))
            if v is None:
                continue
            parts.append(snapshot_record(v.id, p))
            if p.ok and p.snapshot_path:
                held.append(_Part(v.id, _Volume(v.scope, v.node, v.path, v.volume_class), p.snapshot_path))
    signalled = [a.signalled_at for a in acks if a.signalled_at]
    bounds = [r.preempt_time for r in cuts.values() if r.preempt_time]
    if signalled:
        requested = min(signalled)
    elif bounds:
        import datetime as dt

        requested = dt.datetime.fromtimestamp(min(bounds), dt.timezone.utc)
    elif acks:
        requested = min(a.written_at for a in acks)
    else:
        return None
    _entries, outside = assign_manifests(volumes, [(a.node, a.manifest) for a in acks])
    v = judge(wanted=wanted, volumes=volumes, nodes=old_nodes, acks=acks, parts=parts, requested_at=requested,
              allow_crash=cfg.protocol.allow_crash_consistent, outside=outside)
    if not v.resumable:
        return None
    moved = dict(zip(old_nodes, nodes)) if len(nodes) == len(old_nodes) else {n: n for n in old_nodes}
    ranks = []
    for a in sorted((a for a in acks if a.manifest), key=lambda a: a.rank):
        paths = [e.path for e in a.manifest]
        live = paths[0] if len(paths) == 1 else os.path.commonpath(paths)
        part, inside = _part_for(live, a.node, held)
        now = moved.get(a.node, a.node)
        why = ""
        if part is None:
            why = f"no part cut for {epoch} holds {live}"
        elif part.volume.scope == "node-local" and now != a.node:
            why = (f"its {part.volume.volume_class} part is on {a.node}; the controller, which moves parts "
                   "between nodes, could not be asked")
        ranks.append(ResumeRank(rank=a.rank, node=now, from_node=a.node, live=live,
                                checkpoint=None if why else inside, missing=why))
    if not ranks:
        return None
    set_id = next((r.set_id for r in cuts.values() if r.set_id is not None), epoch)
    first = ranks[0]
    return ResumeRecord(set_id=set_id, step=v.checkpoint_step if v.checkpoint_step is not None else 0,
                        live=first.live, snapshot=first.checkpoint, ranks=tuple(ranks),
                        missing=tuple(f"rank {r.rank}: {r.missing}" for r in ranks if r.missing))
