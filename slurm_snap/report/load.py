"""Fetch what report prints: the sets, their RPO bases, their parts when needed.

Three indexed queries whatever the window: the sets, the newest verified cut of
the jobs among them, and (only if a column or --json needs them) their parts
and their newest drills.
"""
from __future__ import annotations

from ..inventory import refusals
from ..inventory.repository import SetFilter
from .rows import UNPROTECTED, SetRow, order_key, unprotected_row


# What load_rows itself reads of every set (ordering, the RPO base, parts).
KEYS = frozenset(("set_id", "job_id", "restart_count", "requested_at"))


def _ids_with_sets(rows: list[SetRow]) -> set[int]:
    return {r.m["job_id"] for r in rows if r.m["set_id"] is not None}


def load_rows(repo, f: SetFilter, *, need_snaps: bool, need_parts: bool = True,
              keys: frozenset[str] | None = None, need_drills: bool = False) -> list[SetRow]:
    """`keys`: the set columns the caller reads (None: all of them)."""
    rows = [SetRow(m=m) for m in repo.report_set_rows(f, with_parts=need_parts,
                                                      keys=None if keys is None else keys | KEYS)]
    if not f.states or UNPROTECTED in f.states:
        # Runs the Prolog left unprotected have no set: without these lines
        # they would be missing from report as if they had never run.
        runs = refusals.unprotected_runs(repo, f)
        refused = refusals.of_runs(repo, [r["run_id"] for r in runs])
        extra = [unprotected_row(r, refused[r["run_id"]]) for r in runs]
        if extra:
            rows = sorted(rows + extra, key=order_key)
    if not rows:
        return rows
    jobs = [r.m["job_id"] for r in rows]
    bases = repo.report_newest_verified_in(f)
    # Jobs with only unprotected runs in the window have no set in it.
    others = sorted({j for j in jobs if j not in bases} - _ids_with_sets(rows))
    if others:
        bases.update(repo.report_newest_verified(others))
    for r, job in zip(rows, jobs):
        r.rpo_base = bases.get(job)
    if need_snaps:
        by_set: dict[int, list] = {}
        for s in repo.report_snapshot_rows([r.m["set_id"] for r in rows if r.m["set_id"] is not None]):
            by_set.setdefault(s["set_id"], []).append(dict(s))
        for r in rows:
            r.snaps = by_set.get(r.m["set_id"], [])
    if need_drills:
        drills = repo.report_drill_rows([r.m["set_id"] for r in rows if r.m["set_id"] is not None])
        for r in rows:
            r.drill = drills.get(r.m["set_id"])
    return rows

