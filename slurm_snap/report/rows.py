"""What one report line is made of: a set (plain row from the repository),
its parts when they were loaded, and the job's RPO base.

Derived values (age, RPO, phase durations) are computed here once so the
text columns and the JSON schema cannot disagree.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import states as S


@dataclass(frozen=True)
class Env:
    now: dt.datetime
    tz: dt.tzinfo | None = None


UNPROTECTED = "UNPROTECTED"
"""report's State for a job run that has no set because the Prolog refused
its declared volumes: a line of its own, so the job is not silently absent."""


@dataclass
class SetRow:
    m: Mapping[str, Any]
    rpo_base: dt.datetime | None = None
    snaps: list = field(default_factory=list)
    refused: list = field(default_factory=list)   # inventory.records.Refusal of the run

    @property
    def job_label(self) -> str:
        rc = self.m["restart_count"]
        return f"{self.m['job_id']}.{rc}" if rc else str(self.m["job_id"])

    @property
    def resumable(self) -> bool:
        """A requeued run resumes from this set (states.resumable)."""
        return S.resumable(self.m["state"], self.m["consistency"])

    def age(self, now: dt.datetime) -> float | None:
        return seconds(self.m["cut_done_at"], now)

    def rpo(self, now: dt.datetime) -> float | None:
        """Age of the job's newest VERIFIED set: a measured point, never a schedule."""
        return seconds(self.rpo_base, now)

    @property
    def objective(self) -> int | None:
        """The run's RPO objective: its periodic interval (--snapshot-every or
        the partition's default); None without periodic snapshots."""
        return self.m.get("snapshot_every")

    def rpo_missed(self, now: dt.datetime) -> bool | None:
        """Whether the verified RPO is past the objective (no verified set
        at all counts as past); None without an objective."""
        if self.objective is None:
            return None
        rpo = self.rpo(now)
        return rpo is None or rpo > self.objective

    def phase(self, start: str, end: str) -> float | None:
        return seconds(self.m[start], self.m[end])

    def sites(self) -> list[str]:
        return sorted({s["site"] for s in self.snaps if s["site"]})

    def survives_node_loss(self) -> bool | None:
        """Every node-local part cut has a complete copy on another node;
        None when the set has no node-local part (or its parts were not loaded)."""
        local = [s for s in self.snaps if s["scope"] == "node-local" and s["state"] in S.PART_HELD]
        if not local:
            return None
        return all((s.get("copies_elsewhere") or 0) > 0 for s in local)

    def regions(self) -> list[str]:
        return sorted({s["region"] for s in self.snaps if s["region"]})


def seconds(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


# name in JSON "times" -> set column: the phases in the order they happen.
PHASE_TIMES = (
    ("requested", "requested_at"),
    ("signalled", "signalled_at"),
    ("barrier", "barrier_at"),
    ("released", "released_at"),
    ("cut_started", "cut_started_at"),
    ("cut_done", "cut_done_at"),
    ("finished", "finished_at"),
    ("verified", "verified_at"),
)


def unprotected_row(run: Mapping[str, Any], refused: list) -> SetRow:
    """The line of a run with refused volumes and no set: every set column
    empty, State UNPROTECTED, Reason naming the first refusal."""
    first = refused[0]
    where = f"{first.node} " if first.node else ""
    reason = (f"prolog refused {len(refused)} of {run['declared']} volumes: {where}{first.path}: {first.why}")
    m = {key: None for key in ("set_id", "epoch", "trigger", "wanted", "requested_at", "signalled_at",
                               "barrier_at", "released_at", "release", "cut_started_at", "cut_done_at", "finished_at", "verified_at",
                               "skew_seconds", "checkpoint_step", "manifest_ok")}
    m.update(job_id=run["job_id"], restart_count=run["restart_count"], user_name=run["user_name"],
             partition=run["partition"], nodes=run["nodes"], snapshot_every=run.get("snapshot_every"),
             sluid=run.get("sluid"),
             consistency="none", parts_consistency="none", state=UNPROTECTED,
             reason=reason, expected_parts=run["declared"], parts=0, failed_nodes=[],
             recorded_at=run["created_at"])
    return SetRow(m=m, refused=list(refused))


def order_key(r: SetRow):
    """Request time for a set, recording time for an unprotected run."""
    return (r.m["requested_at"] or r.m.get("recorded_at"), r.m["set_id"] or 0)
