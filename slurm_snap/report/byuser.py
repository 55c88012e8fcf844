"""report --rpo-by-user: one line per user over the jobs in the window.

BestRPO is the freshest verified point among the user's jobs; WorstRPO the
stalest, or "none" when some job has no verified set at all (that job could
not be restored to a tested point, which is the number that matters).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from .columns import RIGHT, Column
from .rows import SetRow
from ..slurm.slurmtime import format_elapsed


@dataclass
class UserRow:
    user: str
    jobs: int
    verified: int
    best: float | None
    worst: float | None  # None when some job has no verified set

    def doc(self) -> dict[str, Any]:
        return {"user": self.user, "jobs": self.jobs, "jobs_verified": self.verified,
                "jobs_without_verified": self.jobs - self.verified,
                "best_rpo_seconds": self.best, "worst_rpo_seconds": self.worst}


def summarize(rows: list[SetRow], now: dt.datetime) -> list[UserRow]:
    rpo_by_job: dict[str, dict[int, float | None]] = {}
    for r in rows:
        rpo_by_job.setdefault(r.m["user_name"], {})[r.m["job_id"]] = r.rpo(now)
    out = []
    for user in sorted(rpo_by_job):
        rpos = list(rpo_by_job[user].values())
        known = [x for x in rpos if x is not None]
        out.append(UserRow(user=user, jobs=len(rpos), verified=len(known),
                           best=min(known) if known else None,
                           worst=max(known) if known and len(known) == len(rpos) else None))
    return out


def _rpo(v: float | None) -> str:
    return "none" if v is None else format_elapsed(v)


USER_COLUMNS = {c.name.lower(): c for c in (
    Column("User", 9, RIGHT, lambda r, s, e: r.user, "job owner"),
    Column("Jobs", 6, RIGHT, lambda r, s, e: str(r.jobs), "jobs with a set in the window"),
    Column("Verified", 8, RIGHT, lambda r, s, e: str(r.verified), "of those, jobs with a VERIFIED set"),
    Column("BestRPO", 11, RIGHT, lambda r, s, e: _rpo(r.best), "smallest RPO among the jobs"),
    Column("WorstRPO", 11, RIGHT, lambda r, s, e: _rpo(r.worst), "largest RPO; none if a job has no verified set"),
)}
DEFAULT_USER_FORMAT = "User,Jobs,Verified,BestRPO,WorstRPO"
