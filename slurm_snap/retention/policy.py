"""Retention policy: which snapshot sets to keep and which to delete, and why.

Pure code: the input is a list of set summaries and an injected clock, the
output is one decision per set with its reasons; nothing here touches the
inventory or a backend (retention/prune.py executes the decisions). The rules follow
restic's `forget --keep-*`, applied per job:

- keep the last N restorable sets (--keep-last);
- keep the newest set of each of the last N days / ISO weeks that have one
  (--keep-daily / --keep-weekly; days and weeks in UTC so every host agrees);
- keep every set cut within a duration of now (--keep-within);
- keep the newest VERIFIED set (--keep-verified, default on): it is the base
  of the job's RPO, so pruning it would silently make the RPO worse;
- never leave a job that has a VERIFIED set without one unless forced;
- never delete the newest VERIFIED set of a job that is running (Policy.live_jobs,
  from squeue), whatever the rules, --no-keep-verified or --force say: it is what
  a requeue or a failure of that job would restore from;
- never touch a set still in flight (a coordinator owns it), even when forced;
- sets that hold nothing restorable (PARTIAL, FAILED, ROLLED_BACK, or labelled
  "none") are deleted: they only cost space;
- a set already DELETING (an interrupted prune) is always finished.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ..errors import BadValueError
from .. import states as S

KEEP = "keep"
DELETE = "delete"

@dataclass(frozen=True)
class SetSummary:
    id: int
    job_id: int
    cut_at: dt.datetime
    state: str
    consistency: str


@dataclass(frozen=True)
class Policy:
    keep_last: int = 0
    keep_daily: int = 0
    keep_weekly: int = 0
    keep_within: dt.timedelta | None = None
    keep_verified: bool = True
    force: bool = False
    # Jobs Slurm says run now; None: Slurm could not say, so every job counts as running.
    live_jobs: frozenset | None = frozenset()

    def is_live(self, job_id: int) -> bool:
        return self.live_jobs is None or job_id in self.live_jobs

    def __post_init__(self):
        for name in ("keep_last", "keep_daily", "keep_weekly"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BadValueError(what=name.replace("_", "-"), value=value, why="expected an integer >= 0")
        if self.keep_within is not None and self.keep_within < dt.timedelta(0):
            raise BadValueError(what="keep-within", value=str(self.keep_within), why="must not be negative")

    @property
    def has_rule(self) -> bool:
        return bool(self.keep_last or self.keep_daily or self.keep_weekly or self.keep_within)


@dataclass(frozen=True)
class Decision:
    set_id: int
    job_id: int
    action: str
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def delete(self) -> bool:
        return self.action == DELETE


def restorable(s: SetSummary) -> bool:
    return S.drillable(s.state, s.consistency)


def _day(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%d")


def _week(t: dt.datetime) -> str:
    year, week, _ = t.astimezone(dt.timezone.utc).isocalendar()
    return f"{year}-W{week:02d}"


def _bucket_rule(ordered: list[SetSummary], count: int, key: Callable[[dt.datetime], str],
                 label: str, keep: dict[int, list[str]]) -> None:
    """restic's bucket rule: walking newest first, keep a set whenever its
    bucket differs from the last kept bucket, until `count` buckets are used."""
    last = None
    for s in ordered:
        if count <= 0:
            return
        bucket = key(s.cut_at)
        if bucket != last:
            keep[s.id].append(f"{label} {bucket}")
            last = bucket
            count -= 1


def decide(sets: Iterable[SetSummary], policy: Policy, now: Callable[[], dt.datetime]) -> list[Decision]:
    """One Decision per input set (DELETED ones are done and left out), in input order."""
    sets = list(sets)
    clock = now()
    by_job: dict[int, list[SetSummary]] = {}
    for s in sets:
        by_job.setdefault(s.job_id, []).append(s)
    out: dict[int, Decision] = {}
    for job_id, job_sets in by_job.items():
        for d in _decide_job(job_id, job_sets, policy, clock):
            out[d.set_id] = d
    return [out[s.id] for s in sets if s.id in out]


def _decide_job(job_id: int, sets: list[SetSummary], policy: Policy, clock: dt.datetime) -> list[Decision]:
    decisions: list[Decision] = []
    candidates = []
    for s in sets:
        if s.state in S.ACTIVE:
            decisions.append(Decision(s.id, job_id, KEEP, (f"in flight ({s.state}): never touched",)))
        elif s.state == S.DELETING:
            decisions.append(Decision(s.id, job_id, DELETE, ("interrupted prune: finishing the deletion",)))
        elif s.state == S.DELETED:
            continue
        elif not restorable(s):
            why = (f"state {s.state}" if s.state not in S.RESTORABLE else f"labelled {s.consistency}")
            decisions.append(Decision(s.id, job_id, DELETE, (f"nothing restorable ({why})",)))
        else:
            candidates.append(s)

    # Newest first; the id breaks ties between sets cut in the same instant.
    ordered = sorted(candidates, key=lambda s: (s.cut_at, s.id), reverse=True)
    keep: dict[int, list[str]] = {s.id: [] for s in ordered}
    for i, s in enumerate(ordered[:policy.keep_last]):
        keep[s.id].append(f"last {i + 1} of {policy.keep_last}")
    _bucket_rule(ordered, policy.keep_daily, _day, "daily", keep)
    _bucket_rule(ordered, policy.keep_weekly, _week, "weekly", keep)
    if policy.keep_within is not None:
        for s in ordered:
            if clock - s.cut_at <= policy.keep_within:
                keep[s.id].append(f"within {_fmt_duration(policy.keep_within)}")
    verified = [s for s in ordered if s.state == S.VERIFIED]
    if verified and policy.keep_verified:
        keep[verified[0].id].append("newest verified set")
    if verified and policy.is_live(job_id):
        keep[verified[0].id].append("newest verified set of a running job: kept whatever the rules say"
                                    if policy.live_jobs is not None else
                                    "newest verified set: Slurm could not say whether the job runs")
    if verified and not policy.force and not any(keep[v.id] for v in verified):
        why = "only verified set" if len(verified) == 1 else "newest of the job's verified sets"
        keep[verified[0].id].append(f"{why}: deleting would leave no verified set (--force deletes it)")

    for s in ordered:
        if keep[s.id]:
            decisions.append(Decision(s.id, job_id, KEEP, tuple(keep[s.id])))
        else:
            decisions.append(Decision(s.id, job_id, DELETE, ("matched no keep rule",)))
    return decisions


def _fmt_duration(d: dt.timedelta) -> str:
    secs = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs and secs % size == 0:
            return f"{secs // size}{unit}"
    return f"{secs}s"

