"""Honest state after a node is lost: a node-local part lives on its node's
disk, and when that node is gone (Slurm has it DOWN, DRAIN or FAIL for a
hardware reason, `[repair] lost_reason`) or its snapshot is no longer on the
disk (a replaced disk under a node that still runs), the part is LOST. A set
keeps its state only if every lost part has a complete copy on a surviving
node (protocol.nodelocal's restore or partner copies); otherwise it becomes
PARTIAL with the reason, so it no longer counts for RPO (only VERIFIED sets
do), report shows it, and restore/resume do not rely on it.

`slurm-snap repair` runs this after labelling abandoned sets.
"""
from __future__ import annotations

import re
from typing import Callable

from ..clock import utcnow
from ..errors import SnapError
from .. import states as S
from .nodelocal import PartView
from .repairaction import RepairAction

_LOST_STATES = ("down", "drain", "fail")


def lost_from_slurm(states: dict[str, tuple[str, str]], pattern: str) -> dict[str, str]:
    """node -> why it is lost, from sinfo's (state, reason). Pure."""
    rx = re.compile(pattern, re.I)
    lost = {}
    for node, (state, reason) in states.items():
        base = state.lower().rstrip("*~#!%$@^-+")
        if base.startswith(_LOST_STATES) and reason and rx.search(reason):
            lost[node] = f"Slurm has it {state.upper()}: {reason}"
    return lost


def check(cfg, inventory, *, node_states: dict[str, tuple[str, str]] | None = None, probe: bool | None = None,
          backend_on: Callable | None = None, dry_run: bool = False, clock=utcnow) -> tuple[list[RepairAction], list[str]]:
    """Find lost node-local parts of restorable sets and label what they
    cost. Returns (one action per set that changed or would, errors)."""
    errors: list[str] = []
    if node_states is None:
        from ..slurm.api import interface

        try:
            node_states = interface().node_states(timeout=cfg.timeouts.slurm_command)
        except SnapError as exc:
            errors.append(f"cannot read node states from Slurm: {exc}")
            node_states = {}
    lost_nodes = lost_from_slurm(node_states, cfg.repair.lost_reason)
    probe = cfg.repair.probe_parts if probe is None else probe
    if backend_on is None:
        from ..backends.factory import backend_on_node

        backend_on = lambda vclass, node: backend_on_node(cfg, vclass, node)  # noqa: E731
    with inventory.session(readonly=True) as repo:
        todo = []
        for st in repo.sets_in_states(S.RESTORABLE):
            # LOST parts too: one already lost lives on only in its copies,
            # and the set must hear when the last of them goes.
            parts = [(PartView.of(p), p.error if p.state == S.PART_LOST else None)
                     for p in repo.snapshots(st.id) if p.state in S.PART_HELD and p.volume.scope == "node-local"]
            if parts:
                copies = [(c.id, c.snapshot_id, c.node) for c in repo.copies(st.id, states=(S.COPY_OK,))]
                todo.append((st.id, st.job_id, st.state, parts, copies))
    actions = []
    for set_id, job_id, state, parts, copies in todo:
        lost_parts: dict[int, str] = {}
        known_lost = {v.snapshot_id: earlier for v, earlier in parts if earlier is not None}
        for v, earlier in parts:
            if earlier is not None:
                lost_parts[v.snapshot_id] = earlier
            elif v.node in lost_nodes:
                lost_parts[v.snapshot_id] = f"node {v.node} lost ({lost_nodes[v.node]})"
            elif probe:
                try:
                    there = backend_on(v.volume_class, v.node).exists(v.snapshot_ref())
                except SnapError as exc:
                    errors.append(f"set {set_id}: cannot check {v.ref} on {v.node}: {exc}")
                    continue
                if not there:
                    lost_parts[v.snapshot_id] = f"snapshot {v.ref} is no longer on {v.node}'s disk"
        lost_copies = [cid for cid, _pid, node in copies if node in lost_nodes]
        if not lost_copies and set(lost_parts) == set(known_lost):
            continue   # nothing new since the last pass
        survivors = {}
        for _cid, pid, node in copies:
            if node not in lost_nodes:
                survivors.setdefault(pid, node)
        gone = {pid: why for pid, why in lost_parts.items() if pid not in survivors}
        by_id = {v.snapshot_id: v for v, _e in parts}
        if gone:
            what = "; ".join(f"{by_id[pid].volume_class} part of {by_id[pid].node}: {why}, and no copy elsewhere"
                             for pid, why in sorted(gone.items()))
            new_state, reason = S.PARTIAL, f"node lost: {what}"
        else:
            new_state, reason = state, ""
        saved = "; ".join(f"{by_id[pid].volume_class} part of {by_id[pid].node}: {why}; "
                          f"a copy survives on {survivors[pid]}"
                          for pid, why in sorted(lost_parts.items()) if pid in survivors)
        if not reason and not saved:
            saved = "copies on " + ", ".join(sorted({n for _c, _p, n in copies if n in lost_nodes})) + " lost"
        action = RepairAction(set_id=set_id, job_id=job_id, old_state=state, new_state=new_state,
                            why="node-local part lost", reason=reason or saved, dry_run=dry_run)
        if not dry_run:
            with inventory.session() as repo:
                current = repo.get_set(set_id, lock=True)
                for pid, why in lost_parts.items():
                    if pid not in known_lost:
                        repo.set_snapshot_state(pid, S.PART_LOST, why)
                for node in {n for _c, _p, n in copies if n in lost_nodes}:
                    repo.mark_copies_lost(node, f"node {node} lost ({lost_nodes[node]})")
                if gone and current.state in S.RESTORABLE:
                    repo.transition(set_id, S.PARTIAL, at=clock(), reason=reason)
                elif gone:
                    action.acted, action.new_state = False, current.state
                repo.event("repair", f"set {set_id}: " + "; ".join(x for x in (reason, saved) if x),
                           job_id=job_id, set_id=set_id, level="warning" if gone else "info")
        actions.append(action)
    return actions, errors
