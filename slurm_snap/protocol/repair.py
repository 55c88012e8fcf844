"""Find sets whose driver is gone and label them honestly; remove orphans.

A set is abandoned when it is still PENDING/QUIESCING/CUTTING/CUT and its
owner process (host:pid:start, checked on this host) is gone, or its deadline
passed (by `grace` seconds). Two callers: `slurm-snap repair` by hand, and
the sweeper in `slurm-snap serve`'s loop (sweep()), which labels only: it
lists and removes no snapshot, so it never waits on a node's sshd and
never touches a part a node has cut and not yet delivered. Repair then:
  1. labels it under the set's row lock, through the same verdict as the
     coordinator: a CUT set (every part recorded) is finalized; a CUTTING set
     with recorded parts becomes PARTIAL (or whatever the facts say); a set
     with nothing recorded becomes ROLLED_BACK if snapshots of it were found
     and removed, else FAILED;
  2. removes orphan snapshots: backend snapshots named like this set's parts
     (the names are a function of job, set and volume) that are not recorded
     as cut, and every part of a ROLLED_BACK set. A preemption set's parts
     (named by job, preempted run, node and path: cutter.part_name) are
     listed but never removed: a node that cut one while the inventory was
     away keeps it in its spool and delivers it later, and it joins the set
     then (states.LATE_JOIN);
  3. writes release/<epoch>, so ranks still waiting continue.
With `node_check`, it then asks protocol.nodeloss which restorable sets lost
a node-local part with its node (or its disk) and makes those PARTIAL.
Labelling happens before deleting: a slow owner that comes back finds a
terminal set and records nothing pointing at a deleted snapshot.
"""
from __future__ import annotations

import datetime as dt
import logging
from typing import Callable

from ..clock import utcnow
from ..errors import SnapError
from ..jobdir import JobDir
from . import finalize, nodeloss, owner
from .. import states as S
from ..jobrecords import ReleaseRecord, VolumeRecord, preempt_restart
from .cutter import part_name, snapshot_name
from .repairaction import RepairAction

log = logging.getLogger(__name__)


def stale_reason(*, owner_token: str, deadline: dt.datetime | None, requested_at: dt.datetime,
                 now: dt.datetime, older_than: float, alive: bool | None, grace: float = 0.0) -> str | None:
    """Why a set in flight is abandoned, or None if it may still be driven. Pure."""
    if requested_at > now - dt.timedelta(seconds=older_than):
        return None
    if alive is False:
        return f"its owner {owner_token} is gone"
    if deadline is not None and now > deadline + dt.timedelta(seconds=grace):
        return f"its deadline {deadline:%Y-%m-%dT%H:%M:%SZ} passed" + (f" {grace:g} s ago" if grace else "")
    if alive is None and deadline is None and older_than > 0:
        return f"no owner on this host, no deadline, and older than {older_than:g} s"
    return None


def _default_backend_for(cfg):
    from ..backends.factory import backend_for_volume

    return lambda v: backend_for_volume(cfg, v)


def repair(cfg, inventory, *, older_than: float = 0.0, dry_run: bool = False, clock=utcnow,
           backend_for: Callable | None = None, host: str | None = None, node_check: bool = False,
           node_states: dict | None = None, backend_on: Callable | None = None, grace: float = 0.0,
           snapshots: bool = True) -> list[RepairAction]:
    """`snapshots=False` (the sweeper): label only; no backend is asked."""
    backend_for = backend_for or _default_backend_for(cfg)
    now = clock()
    todo = []
    with inventory.session() as repo:
        for st in repo.sets_in_states(S.ACTIVE):
            why = stale_reason(owner_token=st.owner, deadline=st.deadline, requested_at=st.requested_at,
                               now=now, older_than=older_than, alive=owner.alive(st.owner, host=host), grace=grace)
            if why:
                todo.append((st.id, why))
    actions = [_repair_one(cfg, inventory, set_id, why, dry_run=dry_run, clock=clock, backend_for=backend_for,
                           snapshots=snapshots)
               for set_id, why in todo]
    if node_check:
        lost, errs = nodeloss.check(cfg, inventory, node_states=node_states, backend_on=backend_on,
                                    dry_run=dry_run, clock=clock)
        actions += lost
        if errs:
            # Not a set's action, but what repair could not find out: said with the others.
            actions.append(RepairAction(set_id=0, job_id=0, old_state="-", new_state="-",
                                        why="node check incomplete", errors=errs, dry_run=dry_run, acted=False))
    return actions


def sweep(cfg, inventory, *, clock=utcnow) -> list[RepairAction]:
    """What `slurm-snap serve`'s sweeper does every [service] sweep_every
    seconds: label every set left in flight sweep_after seconds past its
    deadline (or whose owner on this host is gone), as repair would, but
    without asking any backend (no orphan is listed or removed: repair by
    hand does that). So no set waits for a person: a set is final within
    its deadline + sweep_after + sweep_every."""
    return repair(cfg, inventory, clock=clock, grace=cfg.service.sweep_after, snapshots=False)


def _part_name(st_info, v: VolumeRecord) -> str:
    """The name this set's part of `v` has (or would have) on its backend."""
    restart = preempt_restart(st_info["epoch"])
    if st_info["trigger"] in S.HOOK_TRIGGERS and restart is not None:
        return part_name(st_info["job_id"], restart, v.node, v.path)
    return snapshot_name(st_info["job_id"], st_info["id"], v.id)


def _find_orphans(st_info, volumes, recorded_cut: set[int], backend_for, *, include_recorded: bool):
    """(volume, ref) of backend snapshots named like this set's parts and not recorded as cut."""
    found, errors = [], []
    for v in volumes:
        if v.id in recorded_cut and not include_recorded:
            continue
        name = _part_name(st_info, v)
        try:
            backend = backend_for(v)
            for ref in backend.list(v.path):
                if ref.name == name:
                    found.append((v, backend, ref))
        except SnapError as exc:
            errors.append(f"{v.path}@{v.node or 'shared'}: cannot list snapshots: {exc}")
    return found, errors


def _repair_one(cfg, inventory, set_id: int, why: str, *, dry_run: bool, clock, backend_for,
                snapshots: bool = True) -> RepairAction:
    with inventory.session() as repo:
        st = repo.get_set(set_id, lock=True)
        info = {"id": st.id, "job_id": st.job_id, "epoch": st.epoch, "uid": st.job_run.uid, "trigger": st.trigger}
        volumes = [VolumeRecord.of(v) for v in repo.volumes(st.job_run)]
        parts = repo.snapshots(set_id)
        recorded_cut = {p.volume_id for p in parts if p.state == S.PART_CUT}
        old = st.state
    action = RepairAction(set_id=set_id, job_id=info["job_id"], old_state=old, new_state=old, why=why,
                          dry_run=dry_run)
    orphans, errs = [], []
    if snapshots:
        orphans, errs = _find_orphans(info, volumes, recorded_cut, backend_for, include_recorded=False)
    action.errors.extend(errs)
    undelivered: list[str] = []
    if info["trigger"] in S.HOOK_TRIGGERS:
        # A node's own part, cut while the inventory was away: its node agent
        # delivers it from the spool, and it joins the set then. Never removed.
        undelivered = [f"{ref.ref} on {v.node or 'the shared volume'}" for v, _b, ref in orphans]
        orphans = []
    action.orphans = [ref.ref for _v, _b, ref in orphans]
    action.undelivered = undelivered

    prefix = f"repair: {why}"
    with inventory.session() as repo:
        st = repo.get_set(set_id, lock=True)
        if st.state not in S.ACTIVE:
            # Someone else labelled it (the orphans listed above are theirs
            # to remove, or already removed): report what they left.
            action.new_state, action.reason, action.acted = st.state, st.reason or "", False
            action.orphans = []
            return action
        if st.state == S.CUT or recorded_cut:
            v = finalize.verdict_for(repo, st, allow_crash=cfg.protocol.allow_crash_consistent,
                                     extra_reasons=[prefix + f" during {st.state}; finalized by repair"])
            action.new_state, action.reason = v.state, v.reason
            if not dry_run:
                finalize.apply(repo, st, v, at=clock())
        else:
            target = S.ROLLED_BACK if orphans else S.FAILED
            what = (f"{len(orphans)} snapshot(s) cut but never recorded were removed" if orphans
                    else "nothing was cut" if info["trigger"] not in S.HOOK_TRIGGERS
                    else "no node delivered a part" + (f" ({len(undelivered)} cut and not yet delivered: they "
                                                       "join the set when their node's spool is)" if undelivered
                                                       else "; a part a node delivers later joins the set"))
            action.new_state = target
            action.reason = f"{prefix} during {st.state}; {what}"
            if not dry_run:
                repo.transition(set_id, target, at=clock(), reason=action.reason, consistency=S.NONE)
        if not dry_run:
            repo.event("repair", f"set {set_id}: {old} -> {action.new_state}: {action.reason}",
                       job_id=info["job_id"], set_id=set_id, level="warning")
    if dry_run:
        return action
    # Delete after labelling: nothing recorded can point at a removed snapshot.
    rolled_back = action.new_state == S.ROLLED_BACK
    if rolled_back and recorded_cut:
        more, errs = _find_orphans(info, volumes, recorded_cut, backend_for, include_recorded=True)
        action.errors.extend(errs)
        orphans = orphans + [o for o in more if o[2].ref not in action.orphans]
    deleted, failed = [], []
    for v, backend, ref in orphans:
        try:
            backend.delete(ref)
            deleted.append(ref.ref)
        except SnapError as exc:
            failed.append(ref.ref)
            action.errors.append(f"cannot delete {ref.ref}: {exc}")
    # Only what is gone is reported as deleted; the label written before the
    # deletes says "were removed", so a failure amends it rather than leave it wrong.
    action.orphans = deleted
    if failed:
        action.reason += f"; {len(failed)} of them could not be removed: {', '.join(failed)}"
        with inventory.session() as repo:
            repo.update_set(set_id, reason=action.reason)
    if rolled_back:
        with inventory.session() as repo:
            for p in repo.snapshots(set_id):
                if p.state == S.PART_CUT:
                    repo.set_snapshot_state(p.id, S.PART_DELETED)
    try:
        dirs = JobDir(cfg.paths.barrier_dir, info["job_id"]).ensure(info["uid"])
        dirs.write_release(ReleaseRecord(epoch=info["epoch"], set_id=set_id, state=action.new_state))
    except (OSError, SnapError) as exc:
        action.errors.append(f"cannot write release/{info['epoch']}: {exc}")
    return action
