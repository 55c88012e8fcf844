"""Prometheus text exposition (format 0.0.4) of the inventory.

Series:
  slurm_snap_info{version}                             gauge, always 1: which slurm-snap wrote the values
  slurm_snap_collected_timestamp_seconds               gauge: Unix time the values were read (a textfile's
                                                       age is time() minus this)
  slurm_snap_sets{state,consistency}                   gauge: sets now in each state/label (the set's own label:
                                                       none for PARTIAL, FAILED, ROLLED_BACK, whatever the
                                                       parts that were cut are)
  slurm_snap_resumable_sets                            gauge: sets a requeued run would resume from
                                                       (restorable state, app-consistent)
  slurm_snap_failures_total{state,reason}              counter: moves into FAILED, PARTIAL, ROLLED_BACK or
                                                       FAILED_RESTORE, by reason class (inventory/failures.py)
  slurm_snap_hook_failures_total                       counter: hooks that failed (hook-failed events)
  slurm_snap_jobs{periodic,drillable,verified}         gauge: jobs with a set requested within the job window,
                                                       by whether they take periodic snapshots, recorded a
                                                       resume command and have a VERIFIED set (yes/no)
  slurm_snap_newest_verified_age_seconds{job_id}       gauge: a periodic job's RPO; +Inf when it has no verified
                                                       set (bounded: below)
  slurm_snap_rpo_objective_seconds{job_id}             gauge: the same job's RPO objective (its interval)
  slurm_snap_job_series_omitted                        gauge: drillable periodic jobs left without series
  slurm_snap_drills_overdue                            gauge, with restore.verify_within: jobs owed a drill
                                                       past it (inventory.schedule.overdue_drills)
  slurm_snap_phase_duration_seconds{phase}             summary (_sum/_count): signal, quiesce, cut, finalize,
                                                       total, release (a preemption's signal -> nodes given back;
                                                       its quiesce is signal -> last acknowledgement)
  slurm_snap_restore_time_to_first_step_seconds        summary (_sum/_count) over passed restore drills

Counters come from append-only sources (the failure_count table, which only
the state change increments, and the event log), never from a count of
current rows: prune deleting a failed set must not look like a reset.

Cardinality: reasons are free text written by the coordinator, so only their
class (inventory.failures.reason_class: the head, numbers as N) becomes a label.
Per-job series are bounded three ways, since every job id is a new series
(Prometheus' naming guide warns against unbounded labels, and against user
ids: no user label, `report -j JOB` names the owner):
  - only periodic jobs that recorded a resume command: their RPO has an
    objective and the runner's drills can verify their sets, so a miss is the
    one per-job fact an admin acts on (SlurmSnapRPOObjectiveMissed); any
    other job (no periodic snapshots, or nothing a drill can run) is counted
    in slurm_snap_jobs, not named;
  - only jobs with a set requested within the job window (--job-window,
    default 1 day): a periodic job takes a set every interval while it runs,
    so one that ended leaves the series (and its alert) a window after its
    last set;
  - at most MAX_JOBS (--max-jobs) of them, those furthest past their
    objective first (no verified set at all first of all); the rest are
    counted in slurm_snap_job_series_omitted, and `report --rpo-missed` lists
    every one.
"""
from __future__ import annotations

import datetime as dt
import math
import os

from .. import __version__
from .. import states as S
from ..errors import BadValueError
from ..fsio import atomic_write

PHASES = ("signal", "quiesce", "cut", "finalize", "total", "release")
MAX_JOBS = 50


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def fmt_value(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


class Exposition:
    def __init__(self):
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {escape_help(help_text)}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        if labels:
            inner = ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items())
            self.lines.append(f"{name}{{{inner}}} {fmt_value(value)}")
        else:
            self.lines.append(f"{name} {fmt_value(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def collect(repo, *, now: dt.datetime, jobs_since: dt.datetime, cfg=None, max_jobs: int = MAX_JOBS) -> str:
    out = Exposition()
    out.family("slurm_snap_info", "gauge", "The slurm-snap that wrote these values (always 1).")
    out.sample("slurm_snap_info", 1, {"version": __version__})
    out.family("slurm_snap_collected_timestamp_seconds", "gauge",
               "Unix time at which slurm-snap metrics read the inventory.")
    out.sample("slurm_snap_collected_timestamp_seconds", now.timestamp())

    out.family("slurm_snap_sets", "gauge", "Snapshot sets by state and the set's consistency label.")
    by = sorted(repo.count_sets_by())
    for state, consistency, n in by:
        out.sample("slurm_snap_sets", n, {"state": state, "consistency": consistency})
    out.family("slurm_snap_resumable_sets", "gauge", "Sets a requeued run would resume from.")
    out.sample("slurm_snap_resumable_sets", sum(n for state, consistency, n in by if S.resumable(state, consistency)),
               {})

    out.family("slurm_snap_failures_total", "counter",
               "Times a set became FAILED, PARTIAL, ROLLED_BACK or FAILED_RESTORE, by state and reason class.")
    for state, reason, n in repo.failure_counts():
        out.sample("slurm_snap_failures_total", n, {"state": state, "reason": reason})
    out.family("slurm_snap_hook_failures_total", "counter",
               "Slurm hooks (Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld) that failed.")
    out.sample("slurm_snap_hook_failures_total", repo.hook_failure_count())

    rpo_rows = repo.report_job_rpo(jobs_since)
    objectives = repo.report_job_objectives([j for j, _u, _n in rpo_rows])
    ages = {job_id: math.inf if newest is None else max(0.0, (now - newest).total_seconds())
            for job_id, _user, newest in rpo_rows}
    drillable = repo.report_jobs_with_resume_cmd(list(ages))
    out.family("slurm_snap_jobs", "gauge",
               "Jobs with a set requested within the job window, by whether they take periodic snapshots, "
               "recorded a resume command (scheduled drills can verify them) and have a VERIFIED set.")
    counts: dict[tuple[str, str, str], int] = {}
    for job_id, age in ages.items():
        key = ("yes" if job_id in objectives else "no", "yes" if job_id in drillable else "no",
               "no" if math.isinf(age) else "yes")
        counts[key] = counts.get(key, 0) + 1
    for periodic in ("yes", "no"):
        for resume in ("yes", "no"):
            for verified in ("yes", "no"):
                out.sample("slurm_snap_jobs", counts.get((periodic, resume, verified), 0),
                           {"periodic": periodic, "drillable": resume, "verified": verified})

    # Named: periodic jobs the runner's drills can verify, furthest past their
    # objective first (none verified: infinitely far).
    worst = sorted((j for j in objectives if j in drillable), key=lambda j: (-(ages[j] / objectives[j]), j))
    shown, omitted = sorted(worst[:max_jobs]), len(worst) - min(len(worst), max_jobs)
    out.family("slurm_snap_newest_verified_age_seconds", "gauge",
               "Seconds since the cut of a periodic job's newest VERIFIED set (its RPO); +Inf if it has none.")
    for job_id in shown:
        out.sample("slurm_snap_newest_verified_age_seconds", ages[job_id], {"job_id": str(job_id)})
    out.family("slurm_snap_rpo_objective_seconds", "gauge",
               "A periodic job's RPO objective: seconds between its periodic snapshots (--snapshot-every or the "
               "partition's default).")
    for job_id in shown:
        out.sample("slurm_snap_rpo_objective_seconds", objectives[job_id], {"job_id": str(job_id)})
    out.family("slurm_snap_job_series_omitted", "gauge",
               "Drillable periodic jobs of the job window given no per-job series (over --max-jobs): "
               "`slurm-snap report --rpo-missed` lists them.")
    out.sample("slurm_snap_job_series_omitted", omitted)

    within = cfg.restore.verify_within if cfg is not None else ""
    if within:
        from ..config import duration_seconds

        out.family("slurm_snap_drills_overdue", "gauge",
                   "Jobs with a resume command whose newest COMPLETE set no restore drill gave a verdict was cut "
                   "longer than restore.verify_within ago.")
        seconds_ = duration_seconds(within, key="restore.verify_within", path=cfg.path)
        out.sample("slurm_snap_drills_overdue", repo.overdue_drills(before=now - dt.timedelta(seconds=seconds_)))

    out.family("slurm_snap_phase_duration_seconds", "summary",
               "Time spent in each phase of a snapshot set (signal, quiesce, cut, finalize, total; "
               "release: a preemption's first signal until its nodes were given back).")
    durations = repo.report_phase_durations()
    for phase in PHASES:
        total, n = durations.get(phase, (0.0, 0))
        out.sample("slurm_snap_phase_duration_seconds_sum", total, {"phase": phase})
        out.sample("slurm_snap_phase_duration_seconds_count", n, {"phase": phase})

    out.family("slurm_snap_restore_time_to_first_step_seconds", "summary",
               "Seconds from the start of a passed restore drill until training made its first step.")
    total, n = repo.report_restore_first_step()
    out.sample("slurm_snap_restore_time_to_first_step_seconds_sum", total)
    out.sample("slurm_snap_restore_time_to_first_step_seconds_count", n)
    return out.text()


def write_textfile(path: str, text: str) -> None:
    """Atomically replace `path`: node_exporter must never read a half-written file."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        raise BadValueError(what="textfile path", value=path, why=f"directory {directory} does not exist")
    if not path.endswith(".prom"):
        raise BadValueError(what="textfile path", value=path,
                            why="node_exporter's textfile collector reads only *.prom files")
    # 0644: node_exporter usually runs as another user.
    atomic_write(path, text.encode("utf-8"), mode=0o644, durable=True)
