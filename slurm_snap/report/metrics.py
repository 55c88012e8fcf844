"""Prometheus text exposition (format 0.0.4) of the inventory.

Series:
  slurm_snap_sets{state,consistency}                   gauge: sets now in each state/label
  slurm_snap_failures_total{reason}                    counter: failed/partial/rolled-back sets by reason
  slurm_snap_newest_verified_age_seconds{job_id,user}  gauge: the job's RPO; +Inf when it has no verified set
  slurm_snap_phase_duration_seconds{phase}             summary (_sum/_count): signal, quiesce, cut, finalize,
                                                       total, release (a preemption's signal -> nodes given back;
                                                       its quiesce is signal -> last acknowledgement)
  slurm_snap_restore_time_to_first_step_seconds        summary (_sum/_count) over passed restore drills

Cardinality: reasons are free text written by the coordinator, so only their
class (the text before the first ':', at most 64 characters) becomes a label;
job series cover jobs with a set requested within the job window only, since
finished jobs would otherwise grow the scrape forever.
"""
from __future__ import annotations

import datetime as dt
import math
import os

from ..errors import BadValueError
from ..fsio import atomic_write

PHASES = ("signal", "quiesce", "cut", "finalize", "total", "release")


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


def reason_class(reason: str) -> str:
    head = (reason or "unknown").split(":", 1)[0].strip()
    return (head or "unknown")[:64]


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


def collect(repo, *, now: dt.datetime, jobs_since: dt.datetime) -> str:
    out = Exposition()
    out.family("slurm_snap_sets", "gauge", "Snapshot sets by state and consistency label.")
    for state, consistency, n in sorted(repo.count_sets_by()):
        out.sample("slurm_snap_sets", n, {"state": state, "consistency": consistency})

    failures: dict[str, int] = {}
    for reason, n in repo.failure_reasons():
        key = reason_class(reason)
        failures[key] = failures.get(key, 0) + n
    out.family("slurm_snap_failures_total", "counter",
               "Sets that failed, were partial, rolled back or failed a restore drill, by reason class.")
    for reason in sorted(failures):
        out.sample("slurm_snap_failures_total", failures[reason], {"reason": reason})

    out.family("slurm_snap_newest_verified_age_seconds", "gauge",
               "Seconds since the cut of the job's newest VERIFIED set (its RPO); +Inf if it has none.")
    for job_id, user, newest in repo.report_job_rpo(jobs_since):
        age = math.inf if newest is None else max(0.0, (now - newest).total_seconds())
        out.sample("slurm_snap_newest_verified_age_seconds", age, {"job_id": str(job_id), "user": user})

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
