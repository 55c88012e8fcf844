"""What one report line is made of: a set (plain row from the repository),
its parts when they were loaded, and the job's RPO base.

Derived values (age, RPO, phase durations) are computed here once so the
text columns and the JSON schema cannot disagree.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Env:
    now: dt.datetime
    tz: dt.tzinfo | None = None


@dataclass
class SetRow:
    m: Mapping[str, Any]
    rpo_base: dt.datetime | None = None
    snaps: list = field(default_factory=list)

    @property
    def job_label(self) -> str:
        rc = self.m["restart_count"]
        return f"{self.m['job_id']}.{rc}" if rc else str(self.m["job_id"])

    def age(self, now: dt.datetime) -> float | None:
        return seconds(self.m["cut_done_at"], now)

    def rpo(self, now: dt.datetime) -> float | None:
        """Age of the job's newest VERIFIED set: a measured point, never a schedule."""
        return seconds(self.rpo_base, now)

    def phase(self, start: str, end: str) -> float | None:
        return seconds(self.m[start], self.m[end])

    def sites(self) -> list[str]:
        return sorted({s["site"] for s in self.snaps if s["site"]})

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
    ("cut_started", "cut_started_at"),
    ("cut_done", "cut_done_at"),
    ("finished", "finished_at"),
    ("verified", "verified_at"),
)
