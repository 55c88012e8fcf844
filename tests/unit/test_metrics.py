"""`slurm-snap metrics`: Prometheus text, exact, and the atomic textfile."""
from __future__ import annotations

import os
import stat

import pytest

from slurm_snap import errors
from slurm_snap.cli import metrics_cmd
from slurm_snap.report.metrics import Exposition, escape_label, reason_class
from test_report_seed import ALICE, ROOT, invoke, report_pg_server, seeded  # noqa: F401  (fixtures)

EXPECTED = """\
# HELP slurm_snap_sets Snapshot sets by state and consistency label.
# TYPE slurm_snap_sets gauge
slurm_snap_sets{state="COMPLETE",consistency="app-consistent"} 1
slurm_snap_sets{state="FAILED",consistency="none"} 1
slurm_snap_sets{state="PARTIAL",consistency="crash-consistent"} 1
slurm_snap_sets{state="VERIFIED",consistency="app-consistent"} 2
# HELP slurm_snap_failures_total Sets that failed, were partial, rolled back or failed a restore drill, by reason class.
# TYPE slurm_snap_failures_total counter
slurm_snap_failures_total{reason="barrier timeout"} 1
slurm_snap_failures_total{reason="zfs"} 1
# HELP slurm_snap_newest_verified_age_seconds Seconds since the cut of the job's newest VERIFIED set (its RPO); +Inf if it has none.
# TYPE slurm_snap_newest_verified_age_seconds gauge
slurm_snap_newest_verified_age_seconds{job_id="1001",user="alice"} 10796
slurm_snap_newest_verified_age_seconds{job_id="1002",user="bob"} 57596
slurm_snap_newest_verified_age_seconds{job_id="1003",user="carol"} +Inf
# HELP slurm_snap_phase_duration_seconds Time spent in each phase of a snapshot set (signal, quiesce, cut, finalize, total; release: a preemption's first signal until its nodes were given back).
# TYPE slurm_snap_phase_duration_seconds summary
slurm_snap_phase_duration_seconds_sum{phase="signal"} 5
slurm_snap_phase_duration_seconds_count{phase="signal"} 5
slurm_snap_phase_duration_seconds_sum{phase="quiesce"} 8
slurm_snap_phase_duration_seconds_count{phase="quiesce"} 4
slurm_snap_phase_duration_seconds_sum{phase="cut"} 2
slurm_snap_phase_duration_seconds_count{phase="cut"} 4
slurm_snap_phase_duration_seconds_sum{phase="finalize"} 4
slurm_snap_phase_duration_seconds_count{phase="finalize"} 4
slurm_snap_phase_duration_seconds_sum{phase="total"} 81
slurm_snap_phase_duration_seconds_count{phase="total"} 5
slurm_snap_phase_duration_seconds_sum{phase="release"} 12
slurm_snap_phase_duration_seconds_count{phase="release"} 1
# HELP slurm_snap_restore_time_to_first_step_seconds Seconds from the start of a passed restore drill until training made its first step.
# TYPE slurm_snap_restore_time_to_first_step_seconds summary
slurm_snap_restore_time_to_first_step_seconds_sum 60
slurm_snap_restore_time_to_first_step_seconds_count 2
"""


def test_exposition_exactly(seeded):
    code, out, exc = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    assert code == 0, exc
    assert out == EXPECTED


def test_job_window_drops_old_jobs(seeded):
    # Job 1003's only set is from 2026-11-28; a one-day window leaves it out.
    code, out, _ = invoke(metrics_cmd.command, ["--job-window", "now-1days"], seeded["config"], ROOT)
    assert code == 0
    jobs = [line for line in out.splitlines() if line.startswith("slurm_snap_newest_verified_age_seconds{")]
    assert [j.split('"')[1] for j in jobs] == ["1001", "1002"]


def test_textfile_is_replaced_atomically(seeded, tmp_path):
    target = tmp_path / "slurm_snap.prom"
    target.write_text("old\n")
    code, out, exc = invoke(metrics_cmd.command, ["--textfile", str(target)], seeded["config"], ROOT)
    assert code == 0, exc
    assert out == ""
    assert target.read_text() == EXPECTED
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".slurm-snap-")] == []


@pytest.mark.parametrize("name", ["metrics.txt", "missing-dir/x.prom"])
def test_bad_textfile_paths(seeded, tmp_path, name):
    code, _, exc = invoke(metrics_cmd.command, ["--textfile", str(tmp_path / name)], seeded["config"], ROOT)
    assert code == errors.USAGE
    assert name.split("/")[0] in str(exc)


def test_non_operators_are_refused(seeded):
    code, _, exc = invoke(metrics_cmd.command, [], seeded["config"], ALICE)
    assert code == errors.PERMISSION and "alice" in str(exc)


def test_label_escaping_and_reason_classes():
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    e = Exposition()
    e.family("m", "gauge", "two\nlines \\ here")
    e.sample("m", 1.5, {"reason": 'say "hi"'})
    assert e.text() == '# HELP m two\\nlines \\\\ here\n# TYPE m gauge\nm{reason="say \\"hi\\""} 1.5\n'
    assert reason_class("barrier timeout: n4 sent no ack") == "barrier timeout"
    assert reason_class("") == "unknown"
    assert len(reason_class("x" * 200)) == 64
