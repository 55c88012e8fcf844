"""`slurm-snap metrics`: Prometheus text, exact, and the atomic textfile."""
from __future__ import annotations

import os
import stat

import pytest

from slurm_snap import __version__, errors
from slurm_snap import states as S
from slurm_snap.inventory.repository import Inventory
from slurm_snap.cli import metrics_cmd
from slurm_snap.inventory.failures import reason_class
from slurm_snap.report.metrics import Exposition, escape_label
from test_report_seed import ALICE, ROOT, invoke, seeded  # noqa: F401  (fixtures)

EXPECTED = """\
# HELP slurm_snap_info The slurm-snap that wrote these values (always 1).
# TYPE slurm_snap_info gauge
slurm_snap_info{version="%s"} 1
# HELP slurm_snap_collected_timestamp_seconds Unix time at which slurm-snap metrics read the inventory.
# TYPE slurm_snap_collected_timestamp_seconds gauge
slurm_snap_collected_timestamp_seconds 1796040000
# HELP slurm_snap_sets Snapshot sets by state and the set's consistency label.
# TYPE slurm_snap_sets gauge
slurm_snap_sets{state="COMPLETE",consistency="app-consistent"} 1
slurm_snap_sets{state="FAILED",consistency="none"} 1
slurm_snap_sets{state="PARTIAL",consistency="none"} 1
slurm_snap_sets{state="VERIFIED",consistency="app-consistent"} 2
# HELP slurm_snap_resumable_sets Sets a requeued run would resume from.
# TYPE slurm_snap_resumable_sets gauge
slurm_snap_resumable_sets 3
# HELP slurm_snap_failures_total Times a set became FAILED, PARTIAL, ROLLED_BACK or FAILED_RESTORE, by state and reason class.
# TYPE slurm_snap_failures_total counter
slurm_snap_failures_total{state="FAILED",reason="barrier timeout"} 1
slurm_snap_failures_total{state="PARTIAL",reason="zfs"} 1
# HELP slurm_snap_hook_failures_total Slurm hooks (Prolog, Epilog, PrologSlurmctld, EpilogSlurmctld) that failed.
# TYPE slurm_snap_hook_failures_total counter
slurm_snap_hook_failures_total 0
# HELP slurm_snap_jobs Jobs with a set requested within the job window, by whether they take periodic snapshots, recorded a resume command (scheduled drills can verify them) and have a VERIFIED set.
# TYPE slurm_snap_jobs gauge
slurm_snap_jobs{periodic="yes",drillable="yes",verified="yes"} 0
slurm_snap_jobs{periodic="yes",drillable="yes",verified="no"} 0
slurm_snap_jobs{periodic="yes",drillable="no",verified="yes"} 0
slurm_snap_jobs{periodic="yes",drillable="no",verified="no"} 0
slurm_snap_jobs{periodic="no",drillable="yes",verified="yes"} 0
slurm_snap_jobs{periodic="no",drillable="yes",verified="no"} 0
slurm_snap_jobs{periodic="no",drillable="no",verified="yes"} 2
slurm_snap_jobs{periodic="no",drillable="no",verified="no"} 0
# HELP slurm_snap_newest_verified_age_seconds Seconds since the cut of a periodic job's newest VERIFIED set (its RPO); +Inf if it has none.
# TYPE slurm_snap_newest_verified_age_seconds gauge
# HELP slurm_snap_rpo_objective_seconds A periodic job's RPO objective: seconds between its periodic snapshots (--snapshot-every or the partition's default).
# TYPE slurm_snap_rpo_objective_seconds gauge
# HELP slurm_snap_job_series_omitted Drillable periodic jobs of the job window given no per-job series (over --max-jobs): `slurm-snap report --rpo-missed` lists them.
# TYPE slurm_snap_job_series_omitted gauge
slurm_snap_job_series_omitted 0
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
""" % __version__


def test_exposition_exactly(seeded):
    code, out, exc = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    assert code == 0, exc
    assert out == EXPECTED


def test_objectives_and_overdue_drills(seeded):
    """A periodic job's objective beside its RPO; with restore.verify_within,
    the COMPLETE sets no drill proved in time."""
    from sqlalchemy import update

    from slurm_snap.inventory.models import JobRun

    inv = Inventory(seeded["url"])
    with inv.session() as repo:
        repo.s.execute(update(JobRun).where(JobRun.job_id == 1001).values(
            snapshot_every=3600, options={"resume_cmd": "python train.py --resume"}))
        overdue = repo.overdue_drills(before=seeded_now() - __import__("datetime").timedelta(hours=1))
    inv.dispose()
    with open(seeded["config"], "a") as f:
        f.write('\n[restore]\nverify_within = "1h"\n')
    code, out, exc = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    assert code == 0, exc
    assert 'slurm_snap_rpo_objective_seconds{job_id="1001"} 3600\n' in out
    assert 'slurm_snap_newest_verified_age_seconds{job_id="1001"} 10796\n' in out
    # 1002 takes no periodic snapshots: counted, not named.
    assert 'job_id="1002"' not in out
    assert 'slurm_snap_jobs{periodic="yes",drillable="yes",verified="yes"} 1\n' in out
    assert "# TYPE slurm_snap_drills_overdue gauge\n" in out and f"slurm_snap_drills_overdue {overdue}\n" in out


def seeded_now():
    import datetime as dt

    return dt.datetime.fromtimestamp(1796040000, dt.timezone.utc)


def _periodic(seeded, every: dict[int, int], *, resume_cmd: str = "python train.py --resume") -> None:
    from sqlalchemy import update

    from slurm_snap.inventory.models import JobRun

    inv = Inventory(seeded["url"])
    with inv.session() as repo:
        for job_id, seconds in every.items():
            repo.s.execute(update(JobRun).where(JobRun.job_id == job_id).values(
                snapshot_every=seconds, options={"resume_cmd": resume_cmd} if resume_cmd else {}))
    inv.dispose()


def _named(out: str, family: str) -> list[str]:
    return [line.split('"')[1] for line in out.splitlines() if line.startswith(family + "{")]


def test_job_window_drops_old_jobs(seeded):
    # Job 1003's only set is from 2026-11-28: in a week's window, out of the default day's.
    _periodic(seeded, {1001: 3600, 1002: 60000, 1003: 600})
    code, out, _ = invoke(metrics_cmd.command, ["--job-window", "7days"], seeded["config"], ROOT)
    assert code == 0
    assert _named(out, "slurm_snap_newest_verified_age_seconds") == ["1001", "1002", "1003"]
    code, out, _ = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    assert code == 0
    assert _named(out, "slurm_snap_newest_verified_age_seconds") == ["1001", "1002"]


def test_per_job_series_are_bounded_to_the_periodic_jobs_furthest_past_their_objective(seeded):
    """Issue 35 item 6: at most --max-jobs jobs are named, the worst first
    (no verified set at all, then the highest RPO/objective); the rest are
    counted; no series carries a user."""
    _periodic(seeded, {1001: 3600, 1002: 60000, 1003: 600})
    code, out, _ = invoke(metrics_cmd.command, ["--job-window", "7days", "--max-jobs", "2"], seeded["config"], ROOT)
    assert code == 0
    # 1003: none verified; 1001: 10796 s of a 3600 s objective; 1002 is within its objective.
    assert _named(out, "slurm_snap_newest_verified_age_seconds") == ["1001", "1003"]
    assert _named(out, "slurm_snap_rpo_objective_seconds") == ["1001", "1003"]
    assert "slurm_snap_job_series_omitted 1\n" in out
    assert 'slurm_snap_jobs{periodic="yes",drillable="yes",verified="no"} 1\n' in out
    assert 'slurm_snap_jobs{periodic="yes",drillable="yes",verified="yes"} 2\n' in out
    assert "user=" not in out
    code, out, _ = invoke(metrics_cmd.command, ["--max-jobs", "0"], seeded["config"], ROOT)
    assert code == 0 and _named(out, "slurm_snap_newest_verified_age_seconds") == []
    assert "slurm_snap_job_series_omitted 2\n" in out


def test_a_periodic_job_without_a_resume_command_is_counted_not_named(seeded):
    """No drill can verify its sets, so its RPO objective can never hold: an
    alert on it would fire for every such job (issue 35 item 6)."""
    _periodic(seeded, {1001: 3600, 1002: 600}, resume_cmd="")
    code, out, _ = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    assert code == 0
    assert _named(out, "slurm_snap_newest_verified_age_seconds") == []
    assert 'slurm_snap_jobs{periodic="yes",drillable="no",verified="yes"} 2\n' in out
    assert "slurm_snap_job_series_omitted 0\n" in out


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


@pytest.mark.parametrize("reason, label", [
    # Ids and counts would make one series per set: numbers become N.
    ("restore test 12: exit 1", "restore test N"),
    ("barrier incomplete after 60.5 s on 2 of 4 nodes (n1, n2); nothing was cut",
     "barrier incomplete after N s on N of N nodes"),
    ("missing 1 of 3 volumes: n2 scratch (not cut)", "missing N of N volumes"),
    ("coordinator stopped: KeyboardInterrupt: ", "coordinator stopped"),
    ("  ;", "unknown"),
])
def test_reason_classes_drop_ids_and_counts(reason, label):
    assert reason_class(reason) == label


def _series(out: str, name: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in out.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")}


def test_failures_never_fall_when_sets_are_pruned_or_drills_pass(seeded):
    """Prometheus takes a falling counter for a restart: the sets leaving
    their failure states (prune's DELETING -> DELETED, a FAILED_RESTORE set
    whose next drill passes) must leave every failure counter as it was."""
    _, before, _ = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    inv = Inventory(seeded["url"])
    with inv.session() as repo:
        for key in ("C", "E"):  # the PARTIAL and the FAILED set, as prune moves them
            repo.transition(seeded["ids"][key], S.DELETING)
            repo.transition(seeded["ids"][key], S.DELETED)
        a = seeded["ids"]["A"]
        repo.transition(a, S.FAILED_RESTORE, reason="restore test 7: exit 1")
        repo.transition(a, S.FAILED_RESTORE, reason="restore test 8: exit 1")
        repo.transition(a, S.VERIFIED, reason="")
    inv.dispose()
    code, after, exc = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    assert code == 0, exc
    was, now = _series(before, "slurm_snap_failures_total"), _series(after, "slurm_snap_failures_total")
    assert now == {**was, 'slurm_snap_failures_total{state="FAILED_RESTORE",reason="restore test N"}': 2}
    # The gauge of current sets did fall: the counter is not read from it.
    sets = _series(after, "slurm_snap_sets")
    assert 'slurm_snap_sets{state="DELETED",consistency="none"}' in sets
    assert 'slurm_snap_sets{state="PARTIAL",consistency="crash-consistent"}' not in sets


def test_a_rolled_back_transition_counts_nothing(seeded):
    inv = Inventory(seeded["url"])
    with pytest.raises(RuntimeError):
        with inv.session() as repo:
            repo.transition(seeded["ids"]["B"], S.FAILED_RESTORE, reason="restore test 9: exit 1")
            raise RuntimeError("the caller failed after the transition")
    with inv.session(readonly=True) as repo:
        assert ("FAILED_RESTORE", "restore test N", 1) not in repo.failure_counts()
        assert repo.failure_counts() == [("FAILED", "barrier timeout", 1), ("PARTIAL", "zfs", 1)]
    inv.dispose()


def test_hook_failures_count_the_append_only_event_log(seeded):
    inv = Inventory(seeded["url"])
    with inv.session() as repo:
        for node in ("n1", "n2", "n2"):
            repo.event("hook-failed", "epilog: backend tool missing", job_id=1001, node=node, level="error")
        repo.event("hook", "recorded 2 volumes", job_id=1001)
    inv.dispose()
    _, out, _ = invoke(metrics_cmd.command, [], seeded["config"], ROOT)
    assert "\nslurm_snap_hook_failures_total 3\n" in out


def test_upgrade_to_0008_starts_the_counters_from_the_failed_sets_of_today(tmp_path):
    """At the upgrade the new counter must not start below the old series (a
    drop reads as a reset): it is seeded from the sets in failure states."""
    from sqlalchemy import text

    from slurm_snap.inventory import db

    url = f"sqlite:///{tmp_path}/old.db"
    engine = db.make_engine(url, create=True)
    db.upgrade(engine, "0007_mysql_precision")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO job_run (id, job_id, restart_count, user_name, uid, partition, nodes, "
                          "options, created_at) VALUES (1, 7, 0, 'alice', 2001, 'gpu', '[]', '{}', "
                          "'2026-11-30 10:00:00')"))
        for i, (state, reason) in enumerate([("FAILED", "barrier timeout: n1"), ("FAILED", "barrier timeout: n2"),
                                             ("PARTIAL", "missing 1 of 2 volumes: x"), ("FAILED_RESTORE", ""),
                                             ("COMPLETE", "fine"), ("DELETED", "barrier timeout: n3")], 1):
            conn.execute(text("INSERT INTO snapshot_set (id, job_run_id, job_id, user_name, epoch, trigger, "
                              "wanted, consistency, state, reason, owner, requested_at, expected_parts, "
                              "failed_nodes, \"release\") VALUES (:i, 1, 7, 'alice', :e, 'manual', 'app', "
                              "'none', :s, :r, '', '2026-11-30 10:00:00', 0, '[]', '')"),
                         {"i": i, "e": f"m-{i}", "s": state, "r": reason})
    assert db.upgrade(engine) == db.SCHEMA_HEAD
    engine.dispose()
    inv = Inventory(url)
    with inv.session(readonly=True) as repo:
        assert repo.failure_counts() == [("FAILED", "barrier timeout", 2), ("FAILED_RESTORE", "unknown", 1),
                                         ("PARTIAL", "missing N of N volumes", 1)]
    inv.dispose()
