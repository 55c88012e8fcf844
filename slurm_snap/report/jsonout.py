"""The --json documents of report and show: schema version 1 (docs/report.md).

Stable means: keys are only ever added within a version; a key removed or a
meaning changed bumps "version". Times are UTC ISO 8601 with a 'Z'; durations
are seconds (float); missing values are null, never "".
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from .rows import PHASE_TIMES, SetRow, seconds
from ..slurm.slurmtime import iso_utc

VERSION = 1


def envelope(command: str) -> dict[str, Any]:
    """sacct --json opens with {"meta": {plugin, Slurm version}, "errors": [],
    then the records}; slurm-snap's documents open the same way. `errors` is
    always empty when a document is printed at all: an error exits non-zero
    with a message on stderr instead (docs/report.md)."""
    from .. import __version__

    return {"meta": {"slurm_snap": {"version": __version__}, "command": command, "json_version": VERSION},
            "errors": []}


def job_labels(f) -> list[str]:
    """A filter's jobs as the user wrote them: JOB, JOB.RESTART."""
    return [str(j) for j in f.job_ids] + [f"{j}.{rc}" for j, rc in f.job_runs]


def _run_fields(r: SetRow) -> dict[str, Any]:
    """The job run a row is about, the same in a set's document and an unprotected run's."""
    m = r.m
    return {"job": r.job_label, "job_id": m["job_id"], "restart_count": m["restart_count"], "user": m["user_name"],
            "partition": m["partition"], "nodes": list(m["nodes"] or []), "sluid": m.get("sluid")}


def set_doc(r: SetRow, now: dt.datetime) -> dict[str, Any]:
    m = r.m
    return {
        "set_id": m["set_id"],
        **_run_fields(r),
        "epoch": m["epoch"],
        "trigger": m["trigger"],
        "wanted": m["wanted"],
        "consistency": m["consistency"],
        "parts_consistency": m.get("parts_consistency") or m["consistency"],
        "resumable": r.resumable,
        "state": m["state"],
        "reason": m["reason"],
        "times": {name: iso_utc(m[col]) for name, col in PHASE_TIMES},
        "durations": {
            "signal": r.phase("requested_at", "signalled_at"),
            "quiesce": r.phase("signalled_at", "barrier_at"),
            "cut": r.phase("cut_started_at", "cut_done_at"),
            "finalize": r.phase("cut_done_at", "finished_at"),
            "total": r.phase("requested_at", "finished_at"),
            "release": r.phase("requested_at", "released_at"),
        },
        "release": m["release"] or None,
        "skew_seconds": m["skew_seconds"],
        "checkpoint_step": m["checkpoint_step"],
        "manifest_ok": m["manifest_ok"],
        "volumes": {"cut": m.get("parts"), "expected": m["expected_parts"]},
        "failed_nodes": list(m["failed_nodes"] or []),
        "age_seconds": r.age(now),
        "rpo_seconds": r.rpo(now),
        "rpo_objective_seconds": r.objective,
        "rpo_missed": r.rpo_missed(now),
        "newest_verified_cut": iso_utc(r.rpo_base),
        "sites": r.sites(),
        "regions": r.regions(),
        "survives_node_loss": r.survives_node_loss(),
        "snapshots": [snapshot_doc(s) for s in r.snaps],
    }


def snapshot_doc(s) -> dict[str, Any]:
    return {
        "snapshot_id": s["snapshot_id"],
        "node": s["node"],
        "volume_path": s["volume_path"],
        "volume_class": s["volume_class"],
        "scope": s["scope"],
        "backend": s["backend"],
        "name": s["name"],
        "ref": s["ref"],
        "path": s["path"],
        "state": s["state"],
        "cut_started": iso_utc(s["cut_started_at"]),
        "cut_at": iso_utc(s["cut_at"]),
        "cut_seconds": seconds(s["cut_started_at"], s["cut_at"]),
        "site": s["site"],
        "region": s["region"],
        "manifest_ok": s["manifest_ok"],
        "error": s["error"],
        "copies_elsewhere": s.get("copies_elsewhere"),
    }


def report_doc(rows: list[SetRow], *, now: dt.datetime, f) -> dict[str, Any]:
    return {
        **envelope("report"),
        "version": VERSION,
        "generated_at": iso_utc(now),
        "filter": {
            "jobs": job_labels(f),
            "users": list(f.users),
            "states": list(f.states),
            "partitions": list(f.partitions),
            "start": iso_utc(f.start),
            "end": iso_utc(f.end),
        },
        "sets": [set_doc(r, now) for r in rows if r.m["set_id"] is not None],
        # Runs without a set whose declared volumes the Prolog refused.
        "unprotected": [unprotected_doc(r) for r in rows if r.m["set_id"] is None],
    }


def unprotected_doc(r: SetRow) -> dict[str, Any]:
    m = r.m
    return {
        **_run_fields(r),
        "recorded_at": iso_utc(m["recorded_at"]),
        "volumes": {"protected": m["expected_parts"] - len(r.refused), "declared": m["expected_parts"]},
        "refused": [{"node": x.node, "path": x.path, "reason": x.why} for x in r.refused],
    }
