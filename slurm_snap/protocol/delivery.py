"""A node's spool entry into the inventory: what one node's Epilog cut for a
preemption or before the time limit (spool.records.SpoolEntry), recorded by
the controller whether the Epilog delivers it at once or the node agent
delivers it later.

Idempotent: an acknowledgement or a part already recorded is kept (an
acknowledgement keeps its earliest sighting). The set is found by its id, or
by job and epoch (opened if needed) when the node cut without knowing it.
The delivery that brings the last expected part finalizes, under the set's
row lock. A set already finalized by the sweeper or repair takes the part
late and is judged again by the same verdict (states.LATE_JOIN); a pruned
set goes back to DELETING so prune removes the part.
"""
from __future__ import annotations

import dataclasses

from .. import states as S
from ..clock import utcnow
from ..errors import BadValueError, NotFound
from ..inventory.records import SnapshotRecord
from ..jobrecords import CutPart
from ..spool.records import SpoolEntry
from .preemptset import as_time, early_text, observed_times, open_set, release_of


@dataclasses.dataclass(frozen=True)
class Delivered:
    """What the inventory made of one spool entry."""

    set_id: int
    state: str
    summary: str
    late: bool = False      # the set was already finalized: a late part (states.LATE_JOIN)


def snapshot_record(volume_id: int, p: CutPart) -> SnapshotRecord:
    return SnapshotRecord(volume_id=volume_id, backend=p.backend, name=p.name, ref=p.ref, path=p.snapshot_path,
                          node=p.node, cut_started_at=p.cut_started_at, cut_at=p.cut_at, state=p.state,
                          error=p.error, site=p.site, region=p.region, shared_key=p.shared_key,
                          manifest_ok=p.manifest_ok)


def cut_part(volume, p: SnapshotRecord) -> CutPart:
    """snapshot_record's inverse: a part named by its volume (a VolumeRecord
    or the inventory's row: class, scope, node, live path) instead of its id."""
    return CutPart(volume_class=volume.volume_class, scope=volume.scope, node=volume.node or "", path=volume.path,
                   backend=p.backend, name=p.name, ref=p.ref, snapshot_path=p.path, cut_started_at=p.cut_started_at,
                   cut_at=p.cut_at, state=p.state, error=p.error, shared_key=p.shared_key,
                   manifest_ok=p.manifest_ok, site=p.site, region=p.region)


def _record_run(cfg, repo, entry: SpoolEntry):
    """The preempted run as the node's entry describes it, when PrologSlurmctld
    could not record it (the database was away when the job started); with
    its declared volumes, as job.json lists them, on the controller's
    classes. NotFound when the entry cannot say (no job.json)."""
    if entry.job is None or not entry.job.volumes:
        raise NotFound(what="job run", value=f"{entry.job_id}.{entry.restart_count}")
    run = repo.record_job_run(job_id=entry.job_id, restart_count=entry.restart_count,
                              user_name=entry.job.user or str(entry.uid), uid=entry.uid, partition=entry.partition,
                              nodes=list(entry.job.nodes or entry.nodes), options=dict(entry.options))
    specs = []
    for v in entry.job.volumes:
        vc = cfg.volume_class(v.volume_class)
        specs.append(dataclasses.replace(v, backend=vc.backend if vc else "", site=vc.site if vc else "",
                                         region=vc.region if vc else ""))
    repo.add_volumes(run, specs)
    repo.event("preempt", f"run {entry.job_id}.{entry.restart_count} recorded from {entry.node}'s spool: "
               "PrologSlurmctld had not recorded it (the inventory was away when the job started)",
               job_id=entry.job_id, node=entry.node, level="warning")
    return run


def deliver(cfg, inv, entry: SpoolEntry, *, clock=utcnow) -> Delivered:
    """Record one node's spool entry: its acknowledgements, its parts and
    rank 0's early-release decision; the delivery that brings the last
    expected part finalizes, under the set's row lock. Idempotent. A set
    the sweeper (or repair) finalized already takes the part late and is
    judged again (states.LATE_JOIN); a pruned set goes back to DELETING
    so prune removes the part."""
    from . import finalize

    t_pre, t_kill = as_time(entry.preempt_time), as_time(entry.killed_at)
    with inv.session() as repo:
        if entry.set_id is not None:
            st = repo.get_set(entry.set_id, lock=True)
            if st.job_id != entry.job_id or st.epoch != entry.epoch:
                raise BadValueError(what="spool entry field 'set_id'", value=entry.set_id,
                                    why=f"set {st.id} is job {st.job_id}'s {st.epoch}, not job "
                                        f"{entry.job_id}'s {entry.epoch}")
        else:
            run = repo.find_job_run(entry.job_id, entry.restart_count) or _record_run(cfg, repo, entry)
            # The entry's trigger: a time-limit set delivered late is still one.
            _run, opened, _created = open_set(repo, cfg, entry.job_id, entry.restart_count,
                                              preempt_time=t_pre, now=clock(), run=run, trigger=entry.trigger)
            st = repo.get_set(opened.id, lock=True)
        set_id = st.id
        rows = {(v.node or "", v.path): v.id for v in repo.volumes(st.job_run)}
        parts, unknown = [], []
        for p in entry.parts:
            vid = rows.get((p.node if p.scope == "node-local" else "", p.path))
            if vid is None:
                unknown.append(f"{p.volume_class}:{p.path}@{p.node or 'shared'}")
            else:
                parts.append(snapshot_record(vid, p))
        if entry.acks:
            repo.record_acks(set_id, list(entry.acks))
            changed = observed_times(repo, st)
            if changed and st.state in S.ACTIVE:
                repo.update_set(set_id, **changed)
        if st.state in (S.PENDING, S.QUIESCING):
            repo.transition(set_id, S.CUTTING, at=min((p.cut_started_at for p in parts if p.cut_started_at),
                                                      default=None) or clock())
        new = repo.record_parts(set_id, parts)
        node = entry.node
        if entry.offline:
            repo.event("preempt", f"set {set_id}: {node} cut {len(entry.parts)} part(s) at "
                       f"{entry.written_at:%Y-%m-%dT%H:%M:%SZ} without the inventory ({entry.offline[:300]}); "
                       f"delivered from its spool", job_id=entry.job_id, set_id=set_id, node=node)
        if unknown:
            repo.event("preempt", f"set {set_id}: {node} delivered parts of volumes the job run does not "
                       f"declare, not recorded: {', '.join(unknown[:8])}", job_id=entry.job_id, set_id=set_id,
                       node=node, level="error")
        if entry.early is not None:
            repo.event("preempt", early_text(entry.early, st.requested_at), job_id=entry.job_id, set_id=set_id,
                       node=node)
        released = release_of(entry.early, t_kill or t_pre, st.trigger)
        # Rank 0's requeue, when it happened, is the release; Slurm's kill
        # at the end of GraceTime only when nothing earlier was recorded
        # (the head node, which reads rank 0's decision, may record last).
        if released is not None and (st.release != "early" or released[1] == "early") \
                and (st.released_at, st.release) != released:
            repo.update_set(set_id, released_at=released[0], release=released[1])
        if st.state == S.CUTTING:
            have = repo.count_parts(set_id)
            if have < st.expected_parts:
                ok = sum(p.ok for p in parts)
                return Delivered(set_id, st.state, f"set {set_id}: {node} cut {ok}/{len(parts)} volumes; "
                                                   f"{have}/{st.expected_parts} parts in")
            extra = [] if t_pre is not None or st.signalled_at else \
                ["preemption time unknown: acknowledgements checked against the run's start"]
            v = finalize.verdict_for(repo, st, allow_crash=cfg.protocol.allow_crash_consistent,
                                     extra_reasons=extra)
            finalize.apply(repo, st, v, at=clock())
            repo.event("preempt", f"set {set_id} finalized by {node}: {v.state} {v.consistency}"
                       + (f" ({v.reason})" if v.reason else ""), job_id=entry.job_id, set_id=set_id, node=node)
            return Delivered(set_id, v.state, f"set {set_id} {v.state} {v.consistency}")
        return Delivered(set_id, *_late(cfg, repo, st, entry, new, clock))

def _late(cfg, repo, st, entry: SpoolEntry, new: int, clock) -> tuple[str, str, bool]:
    """(state, summary, late) for parts delivered to a set no longer
    being cut: judged again when they are new to a PARTIAL or FAILED set
    (states.LATE_JOIN), handed to prune when the set was pruned."""
    from . import finalize

    node, set_id, was = entry.node, st.id, st.state
    if not new:
        return was, f"set {set_id} is {was}; {node}'s parts were recorded already", False
    if was in (S.PARTIAL, S.FAILED):
        v = finalize.verdict_for(repo, st, allow_crash=cfg.protocol.allow_crash_consistent,
                                 extra_reasons=[f"{node}'s part(s) delivered late from its spool"])
        if v.state != was and (was, v.state) in S.LATE_JOIN:
            finalize.apply(repo, st, v, at=clock(), late=True)
        else:
            repo.update_set(set_id, reason=v.reason[:8000], failed_nodes=list(v.failed_nodes),
                            skew_seconds=v.skew_seconds, checkpoint_step=v.checkpoint_step,
                            manifest_ok=v.manifest_ok)
        now = repo.get_set(set_id).state
        repo.event("preempt", f"set {set_id}: {new} part(s) of {node} delivered late; {was} -> {now} "
                   f"{v.consistency}" + (f" ({v.reason[:500]})" if v.reason else ""),
                   job_id=entry.job_id, set_id=set_id, node=node, level="warning")
        return now, f"set {set_id} {was} -> {now} {v.consistency} (late part of {node})", True
    if was == S.DELETED:
        repo.transition(set_id, S.DELETING, at=clock(), late=True)
    if was in (S.DELETED, S.DELETING):
        repo.event("preempt", f"set {set_id}: {new} part(s) of {node} delivered after the set was pruned: "
                   "the next prune removes them", job_id=entry.job_id, set_id=set_id, node=node,
                   level="warning")
        return S.DELETING, f"set {set_id} was {was}: {node}'s late part(s) are left to prune", True
    repo.event("preempt", f"set {set_id} is {was}: {new} late part(s) of {node} recorded",
               job_id=entry.job_id, set_id=set_id, node=node)
    return was, f"set {set_id} is {was}: {node}'s parts recorded", True
