"""report beside sacct 22.05: the options docs/report.md's table marks "same"
or "different because", each checked with exact output."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slurm_snap import __version__, errors
from slurm_snap.cli import report_cmd, show_cmd
from test_report import DEFAULT, run, table
from test_report_seed import ROOT, invoke, make_ctx, seeded  # noqa: F401  (fixtures)

LONG = table("""
JobID|SetID|User|Partition|Trigger|State|Consistency|Resumable|PartsConsistency|Reason|Volumes|NodeList|FailedNodes|Requested|Cut|Verified|Duration|Quiesce|CutTime|Skew|Step|Manifest|Age|RPO
1001|1|alice|gpu|manual|VERIFIED|app-consistent|yes|app-consistent||2/2|n[1-2]||2026-11-30T09:00:00|2026-11-30T09:00:04|2026-11-30T10:00:00|00:00:05|00:00:02|00:00:00|0.250|500|ok|02:59:56|02:59:56
1002.1|4|bob|gpu|preempt|PARTIAL|none|no|crash-consistent|zfs: snapshot failed: pool busy|1/2|n3||2026-11-30T10:30:00|2026-11-30T10:30:04||00:00:05|00:00:02|00:00:00|||ok|01:29:56|15:59:56
1001|2|alice|gpu|manual|COMPLETE|app-consistent|yes|app-consistent||2/2|n[1-2]||2026-11-30T11:00:00|2026-11-30T11:00:04||00:00:05|00:00:02|00:00:00|0.250|600|ok|00:59:56|02:59:56
""")


def split_run(seeded, *args):
    """(exit code, stdout, stderr) kept apart, for options that write to stderr."""
    result = CliRunner().invoke(report_cmd.command, list(args), obj=make_ctx(seeded["config"], ROOT))
    return result.exit_code, result.stdout, result.stderr


def usage_error(seeded, *args):
    code, _out, exc = invoke(report_cmd.command, list(args), seeded["config"], ROOT)
    assert code == errors.USAGE and isinstance(exc, errors.UsageError), (code, exc)
    return str(exc)


def test_long_prints_the_documented_long_columns(seeded):
    assert run(seeded, "-l", "-P") == LONG
    assert run(seeded, "--long", "--snapshots", "-P", "-j", "1002") == table("""
JobID|SetID|State|Node|Volume|Class|Backend|SnapName|SnapState|Cut|Manifest|Site|Region
1002|3|VERIFIED||/pfs/jobs/1002|pfs|xfs-reflink|preempt-0-3|CUT|2026-11-29T20:00:04|ok|lab|us
1002.1|4|PARTIAL||/pfs/jobs/1002|pfs|xfs-reflink|preempt-1-4|CUT|2026-11-30T10:30:04|ok|lab|us
""")


def test_long_and_format_exclude_each_other_as_in_sacct(seeded):
    assert "-o/--format and -l/--long exclude each other" in usage_error(seeded, "-l", "-o", "JobID")
    assert "--rpo-by-user has no long format" in usage_error(seeded, "-l", "--rpo-by-user")


def test_format_env_is_the_default_of_o(seeded, monkeypatch):
    monkeypatch.setenv("SLURM_SNAP_REPORT_FORMAT", "JobID%-7,SetID,State%9")
    assert run(seeded) == table("""
JobID      SetID     State
------- -------- ---------
1001           1  VERIFIED
1002.1         4   PARTIAL
1001           2  COMPLETE
""")
    # -o and -l win over it, as over SACCT_FORMAT in sacct
    assert run(seeded, "-o", "JobID", "-P", "-n") == "1001\n1002.1\n1001\n"
    assert run(seeded, "-l", "-P") == LONG
    # --snapshots keeps its own default (the variable's columns are per-set ones)
    assert run(seeded, "--snapshots", "-P", "-n", "-j", "1002.1") == table("""
1002.1|4|PARTIAL||/pfs/jobs/1002|xfs-reflink|2026-11-30T10:30:04|lab|us
""")


def test_sacct_format_is_not_read(seeded, monkeypatch):
    monkeypatch.setenv("SACCT_FORMAT", "jobid,jobname,elapsed")
    assert run(seeded) == DEFAULT


def test_a_bad_format_env_names_the_variable_and_the_column(seeded, monkeypatch):
    monkeypatch.setenv("SLURM_SNAP_REPORT_FORMAT", "JobID,Elapsed")
    msg = usage_error(seeded)
    assert "$SLURM_SNAP_REPORT_FORMAT" in msg and "'Elapsed'" in msg


def test_verbose_prints_the_filter_to_stderr_only(seeded):
    code, out, err = split_run(seeded, "-v", "-u", "alice,bob", "-s", "verified", "-E", "2026-11-30T10:00",
                               "-o", "JobID", "-P", "-n")
    assert (code, out) == (0, "1001\n")
    assert err == ("report: jobs any; users alice,bob; states VERIFIED; partitions any; "
                   "requested from 2026-11-30T00:00:00 to 2026-11-30T10:00:00\n")
    code, out, err = split_run(seeded, "--verbose", "-j", "1002.1", "-o", "JobID", "-P", "-n")
    assert (code, out, err) == (0, "1002.1\n", "report: jobs 1002.1; users any; states any; partitions any; "
                                               "requested from any time to now\n")
    assert split_run(seeded, "-o", "JobID", "-P", "-n")[2] == ""


@pytest.mark.parametrize("job, kind", [("1234_5", "array task"), ("1234_[1-3]", "array task"),
                                       ("1234+0", "heterogeneous job component"),
                                       ("1001,1234+1", "heterogeneous job component")])
def test_array_tasks_and_het_components_say_to_pass_their_own_job_id(seeded, job, kind):
    msg = usage_error(seeded, "-j", job)
    item = job.split(",")[-1]
    assert msg == (f"invalid job id {item!r}: slurm-snap records each {kind} under its own job id "
                   "(its SLURM_JOB_ID, which squeue and sacct print as JobIDRaw): pass that id")
    code, _out, exc = invoke(show_cmd.command, [job], seeded["config"], ROOT)
    assert code == errors.USAGE and kind in str(exc) and repr(job) in str(exc)


def test_job_dot_number_is_a_restart_not_a_step(seeded):
    # sacct's 1002.1 is step 1; here it is the job's run after its first requeue.
    assert run(seeded, "-j", "1002.1", "-o", "JobID,Restart,SetID", "-P", "-n") == "1002.1|1|4\n"
    assert "JOB.RESTART is one requeued run" in run(seeded, "--help")


def test_a_job_id_beyond_slurms_range_is_refused(seeded):
    assert "larger than Slurm's largest id" in usage_error(seeded, "-j", "4294967296")


def test_times_parse_as_libslurm_does(seeded):
    # one argv with a space (what the shell passes for "2026-11-30 10:00") is accepted, as by libslurm
    assert run(seeded, "-S", "2026-11-30 10:00", "-o", "JobID", "-P", "-n") == "1002.1\n1001\n"
    assert run(seeded, "-S", "11/30-10:00", "-o", "JobID", "-P", "-n") == "1002.1\n1001\n"
    # sacct refuses these (libslurm knows only full unit names and two-digit years): so does report
    for value in ("now-2h", "11/30/2026", "10am", ""):
        msg = usage_error(seeded, "-S", value)
        assert repr(value) in msg and "start time (-S)" in msg
    assert "'now-90min'" in usage_error(seeded, "-E", "now-90min")


def test_json_opens_with_an_envelope_like_sacct_json(seeded):
    doc = json.loads(run(seeded, "--json"))
    assert list(doc)[:2] == ["meta", "errors"]
    assert doc["meta"] == {"slurm_snap": {"version": __version__}, "command": "report", "json_version": 1}
    assert doc["errors"] == []
    # version 1's keys stay, in meaning and place
    assert list(doc)[2:] == ["version", "generated_at", "filter", "sets", "unprotected"]
    by_user = json.loads(run(seeded, "--rpo-by-user", "--json"))
    assert list(by_user) == ["meta", "errors", "version", "generated_at", "users"]
    code, out, _exc = invoke(show_cmd.command, ["--json", "1001"], seeded["config"], ROOT)
    shown = json.loads(out)
    assert code == 0 and shown["meta"]["command"] == "show" and shown["errors"] == []


def test_uid_is_an_alias_of_user_as_in_sacct(seeded):
    assert run(seeded, "--uid", "bob", "-S", "2026-11-01", "-o", "JobID", "-P", "-n") == "1002\n1002.1\n"


@pytest.mark.parametrize("args", [["-A", "physics"], ["-b"], ["--name", "train"], ["--yaml"], ["-N", "n1"],
                                  ["-T"], ["-g", "users"], ["-q", "normal"], ["-M", "all"], ["--units", "G"]])
def test_sacct_options_marked_not_applicable_are_usage_errors(seeded, args):
    code, out, _exc = invoke(report_cmd.command, args, seeded["config"], ROOT)
    assert code == errors.USAGE
    assert "No such option" in out
