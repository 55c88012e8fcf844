"""`slurm-snap report`: sacct-style output, compared with exact expected tables."""
from __future__ import annotations

import json

import pytest

from slurm_snap import errors
from slurm_snap.cli import report_cmd
from test_report_seed import ALICE, BOB, OPER, ROOT, invoke, seeded  # noqa: F401  (fixtures)


def run(seeded, *args, caller=ROOT):
    code, out, exc = invoke(report_cmd.command, list(args), seeded["config"], caller)
    assert code == 0, (code, out, exc)
    return out


def table(text: str) -> str:
    return text.strip("\n") + "\n"


DEFAULT = table("""
JobID             User          State      Consistency Resumable                 Cut         Age            Verified         RPO
------------ --------- -------------- ---------------- --------- ------------------- ----------- ------------------- -----------
1001             alice       VERIFIED   app-consistent       yes 2026-11-30T09:00:04    02:59:56 2026-11-30T10:00:00    02:59:56
1002.1             bob        PARTIAL             none        no 2026-11-30T10:30:04    01:29:56                        15:59:56
1001             alice       COMPLETE   app-consistent       yes 2026-11-30T11:00:04    00:59:56                        02:59:56
""")


def test_default_is_today_since_midnight_all_users_for_root(seeded):
    # D (yesterday) and E (two days ago) are outside the default window.
    assert run(seeded) == DEFAULT


def test_format_with_widths_and_alignment(seeded):
    out = run(seeded, "-o", "JobID%-8,User%6,State%-10,Volumes,Reason%12,RPO%-9")
    assert out == table("""
JobID      User State      Volumes       Reason RPO
-------- ------ ---------- ------- ------------ ---------
1001      alice VERIFIED       2/2              02:59:56
1002.1      bob PARTIAL        1/2 zfs: snapsh+ 15:59:56
1001      alice COMPLETE       2/2              02:59:56
""")


def test_column_names_are_case_insensitive_prefixes(seeded):
    assert run(seeded, "-o", "jobi,USER,consist", "-P", "-n") == table("""
1001|alice|app-consistent
1002.1|bob|none
1001|alice|app-consistent
""")


def test_parsable2_has_no_trailing_bar(seeded):
    assert run(seeded, "-P") == table("""
JobID|User|State|Consistency|Resumable|Cut|Age|Verified|RPO
1001|alice|VERIFIED|app-consistent|yes|2026-11-30T09:00:04|02:59:56|2026-11-30T10:00:00|02:59:56
1002.1|bob|PARTIAL|none|no|2026-11-30T10:30:04|01:29:56||15:59:56
1001|alice|COMPLETE|app-consistent|yes|2026-11-30T11:00:04|00:59:56||02:59:56
""")


def test_parsable_has_trailing_bar(seeded):
    assert run(seeded, "-p", "-o", "JobID,SetID,Trigger,Step") == table("""
JobID|SetID|Trigger|Step|
1001|1|manual|500|
1002.1|4|preempt||
1001|2|manual|600|
""")


def test_noheader(seeded):
    assert run(seeded, "-n") == table("""
1001             alice       VERIFIED   app-consistent       yes 2026-11-30T09:00:04    02:59:56 2026-11-30T10:00:00    02:59:56
1002.1             bob        PARTIAL             none        no 2026-11-30T10:30:04    01:29:56                        15:59:56
1001             alice       COMPLETE   app-consistent       yes 2026-11-30T11:00:04    00:59:56                        02:59:56
""")


def test_snapshots_one_line_per_part(seeded):
    assert run(seeded, "--snapshots") == table("""
JobID           SetID          State       Node Volume                      Backend                 Cut       Site     Region
------------ -------- -------------- ---------- ------------------------ ---------- ------------------- ---------- ----------
1001                1       VERIFIED         n1 /scratch/n1/jobs/1001         btrfs 2026-11-30T09:00:03        lab         eu
1001                1       VERIFIED            /pfs/jobs/1001           xfs-refli+ 2026-11-30T09:00:04        lab         eu
1002.1              4        PARTIAL            /pfs/jobs/1002           xfs-refli+ 2026-11-30T10:30:04        lab         us
1001                2       COMPLETE         n1 /scratch/n1/jobs/1001         btrfs 2026-11-30T11:00:03        lab         eu
1001                2       COMPLETE            /pfs/jobs/1001           xfs-refli+ 2026-11-30T11:00:04        lab         eu
""")


def test_set_level_columns_over_a_wider_window(seeded):
    out = run(seeded, "-S", "2026-11-01", "-o", "JobID,SetID,Volumes,Nodes,Skew,Site,Region,Duration,Quiesce,"
              "Reason%-30")
    assert out == table("""
JobID           SetID Volumes Nodes     Skew       Site     Region    Duration     Quiesce Reason
------------ -------- ------- ----- -------- ---------- ---------- ----------- ----------- ------------------------------
1003                5     0/1     1                                   00:01:01             barrier timeout: n4 sent no a+
1002                3     1/1     1    0.250        lab         us    00:00:05    00:00:02
1001                1     2/2     2    0.250        lab         eu    00:00:05    00:00:02
1002.1              4     1/2     1                 lab         us    00:00:05    00:00:02 zfs: snapshot failed: pool bu+
1001                2     2/2     2    0.250        lab         eu    00:00:05    00:00:02
""")


@pytest.mark.parametrize("args, expected", [
    (["-S", "2026-11-29", "-E", "2026-11-30T10:00"], "1002|3\n1001|1\n"),
    (["-S", "now-15hours"], "1001|1\n1002.1|4\n1001|2\n"),
    (["-S", "now-16hours"], "1002|3\n1001|1\n1002.1|4\n1001|2\n"),
    (["-S", "11/28", "-E", "11/29"], "1003|5\n"),
    (["-S", "10:00"], "1002.1|4\n1001|2\n"),
    (["-S", "now-3days", "-E", "noon"], "1003|5\n1002|3\n1001|1\n1002.1|4\n1001|2\n"),
    (["-E", "midnight"], ""),
])
def test_start_and_end_windows(seeded, args, expected):
    assert run(seeded, *args, "-P", "-n", "-o", "JobID,SetID") == expected


def test_jobs_have_no_default_window(seeded):
    # 1002 covers both runs, including yesterday's set; 1001.0 names one run.
    assert run(seeded, "-j", "1002,1001.0", "-P", "-n", "-o", "JobID,State") == table("""
1002|VERIFIED
1001|VERIFIED
1002.1|PARTIAL
1001|COMPLETE
""")
    assert run(seeded, "-j", "1002.1", "-P", "-n", "-o", "JobID,State") == "1002.1|PARTIAL\n"


def test_state_filter_is_case_insensitive(seeded):
    assert run(seeded, "-S", "2026-11-01", "-s", "verified,Failed", "-P", "-n", "-o", "JobID,State") == table("""
1003|FAILED
1002|VERIFIED
1001|VERIFIED
""")


def test_user_filter(seeded):
    assert run(seeded, "-u", "bob", "-S", "2026-11-01", "-P", "-n", "-o", "JobID,User,RPO") == table("""
1002|bob|15:59:56
1002.1|bob|15:59:56
""")


def test_json_schema_version_1(seeded):
    doc = json.loads(run(seeded, "--json"))
    assert doc["version"] == 1
    assert doc["generated_at"] == "2026-11-30T12:00:00Z"
    assert doc["filter"] == {"jobs": [], "users": [], "states": [], "partitions": [], "start": "2026-11-30T00:00:00Z",
                             "end": None}
    assert [s["job"] for s in doc["sets"]] == ["1001", "1002.1", "1001"]
    first = doc["sets"][0]
    assert {k: first[k] for k in ("set_id", "job_id", "restart_count", "user", "partition", "nodes", "epoch",
                                  "trigger", "wanted", "consistency", "state", "reason", "skew_seconds",
                                  "checkpoint_step", "manifest_ok", "volumes", "failed_nodes", "age_seconds",
                                  "rpo_seconds", "newest_verified_cut", "sites", "regions")} == {
        "set_id": 1, "job_id": 1001, "restart_count": 0, "user": "alice", "partition": "gpu",
        "nodes": ["n1", "n2"], "epoch": "m-1", "trigger": "manual", "wanted": "app",
        "consistency": "app-consistent", "state": "VERIFIED", "reason": "", "skew_seconds": 0.25,
        "checkpoint_step": 500, "manifest_ok": True, "volumes": {"cut": 2, "expected": 2}, "failed_nodes": [],
        "age_seconds": 10796.0, "rpo_seconds": 10796.0, "newest_verified_cut": "2026-11-30T09:00:04Z",
        "sites": ["lab"], "regions": ["eu"]}
    assert first["times"] == {"requested": "2026-11-30T09:00:00Z", "signalled": "2026-11-30T09:00:01Z",
                              "barrier": "2026-11-30T09:00:03Z", "released": None,
                              "cut_started": "2026-11-30T09:00:03.500000Z",
                              "cut_done": "2026-11-30T09:00:04Z", "finished": "2026-11-30T09:00:05Z",
                              "verified": "2026-11-30T10:00:00Z"}
    assert first["durations"] == {"signal": 1.0, "quiesce": 2.0, "cut": 0.5, "finalize": 1.0, "total": 5.0,
                                  "release": None}
    assert first["release"] is None   # a manual set gives no nodes back
    assert [(p["node"], p["volume_path"], p["backend"], p["cut_at"]) for p in first["snapshots"]] == [
        ("n1", "/scratch/n1/jobs/1001", "btrfs", "2026-11-30T09:00:03.750000Z"),
        ("", "/pfs/jobs/1001", "xfs-reflink", "2026-11-30T09:00:04Z")]
    partial = doc["sets"][1]
    assert (partial["volumes"], partial["rpo_seconds"], partial["age_seconds"]) == (
        {"cut": 1, "expected": 2}, 57596.0, 5396.0)
    # Issue 30: a PARTIAL set is no point to restore from, whatever its parts are.
    assert (first["consistency"], first["parts_consistency"], first["resumable"]) == (
        "app-consistent", "app-consistent", True)
    assert (partial["state"], partial["consistency"], partial["parts_consistency"], partial["resumable"]) == (
        "PARTIAL", "none", "crash-consistent", False)


def test_preemption_release_columns_and_json(seeded):
    """A preemption's nodes-given-back time and how (issue 16), in text and JSON."""
    out = run(seeded, "-j", "1002", "-S", "2026-11-01", "-o", "JobID,Trigger,Release,ToRelease,Released%20")
    lines = out.splitlines()
    assert lines[0].split() == ["JobID", "Trigger", "Release", "ToRelease", "Released"]
    rows = [ln.split() for ln in lines[2:]]
    assert ["1002", "preempt", "early", "00:00:12"] == rows[0][:4], out
    assert rows[1][:2] == ["1002.1", "preempt"] and len(rows[1]) == 2, out   # never released: empty
    doc = json.loads(run(seeded, "-j", "1002", "-S", "2026-11-01", "--json"))
    d = doc["sets"][0]
    assert (d["release"], d["durations"]["release"], d["times"]["released"]) == (
        "early", 12.0, "2026-11-29T20:00:12Z")


def test_rpo_by_user(seeded):
    assert run(seeded, "--rpo-by-user", "-S", "2026-11-01") == table("""
     User   Jobs Verified     BestRPO    WorstRPO
--------- ------ -------- ----------- -----------
    alice      1        1    02:59:56    02:59:56
      bob      1        1    15:59:56    15:59:56
    carol      1        0        none        none
""")
    doc = json.loads(run(seeded, "--rpo-by-user", "--json"))
    assert doc["users"] == [
        {"user": "alice", "jobs": 1, "jobs_verified": 1, "jobs_without_verified": 0,
         "best_rpo_seconds": 10796.0, "worst_rpo_seconds": 10796.0},
        {"user": "bob", "jobs": 1, "jobs_verified": 1, "jobs_without_verified": 0,
         "best_rpo_seconds": 57596.0, "worst_rpo_seconds": 57596.0}]


def test_helpformat_lists_every_column(seeded):
    out = run(seeded, "--helpformat")
    names = [line.split()[0] for line in out.splitlines()]
    assert names[:3] == ["JobID", "SetID", "User"]
    assert {"RPO", "Age", "Site", "Region", "Skew", "Verified", "Volumes", "Nodes", "Trigger"} <= set(names)


@pytest.mark.parametrize("args, named", [
    (["-o", "JobID,Bogus"], "'Bogus'"),
    (["-o", "JobID,S"], "'S'"),                  # ambiguous prefix: SetID, State, Site, ...
    (["-o", "JobID%0"], "'JobID%0'"),
    (["-o", "JobID,,User"], "'JobID,,User'"),
    (["-s", "verified,sleeping"], "'sleeping'"),
    (["-j", "1001,abc"], "'abc'"),
    (["-j", "1001.x"], "'1001.x'"),
    (["-S", "last tuesday"], "'last tuesday'"),
    (["-S", "noon", "-E", "10:00"], "'10:00'"),
])
def test_bad_values_are_usage_errors_naming_the_value(seeded, args, named):
    code, out, exc = invoke(report_cmd.command, args, seeded["config"], ROOT)
    assert code == errors.USAGE
    assert isinstance(exc, errors.BadValueError)
    assert named in str(exc)


def test_a_user_sees_only_their_own_jobs(seeded):
    assert run(seeded, "-P", "-n", "-o", "JobID,User", caller=ALICE) == "1001|alice\n1001|alice\n"
    assert run(seeded, "-j", "1001", "-P", "-n", "-o", "JobID", caller=ALICE) == "1001\n1001\n"


@pytest.mark.parametrize("args, words", [
    (["-j", "1002"], ["job 1002 belongs to bob", "alice"]),
    (["-j", "1001,1002.1"], ["job 1002 belongs to bob"]),
    (["-u", "bob"], ["bob", "only operators"]),
    (["-a"], ["--allusers", "alice"]),
])
def test_a_user_asking_for_others_is_refused(seeded, args, words):
    code, out, exc = invoke(report_cmd.command, args, seeded["config"], ALICE)
    assert code == errors.PERMISSION
    assert isinstance(exc, errors.PermissionDenied)
    for w in words:
        assert w in str(exc)


def test_an_operator_sees_other_users_jobs(seeded):
    # OPER is an operator through [access] operator_users; like sacct, only root sees all by default.
    assert run(seeded, "-P", "-n", caller=OPER) == ""
    assert run(seeded, "-j", "1002", "-P", "-n", "-o", "JobID,User", caller=OPER) == "1002|bob\n1002.1|bob\n"
    assert run(seeded, "-u", "alice", "-P", "-n", "-o", "JobID", caller=OPER) == "1001\n1001\n"
    assert run(seeded, "-a", "-P", "-n", "-o", "JobID", caller=OPER) == "1001\n1002.1\n1001\n"


def test_bob_is_refused_alice_job(seeded):
    code, _, exc = invoke(report_cmd.command, ["-j", "1001"], seeded["config"], BOB)
    assert code == errors.PERMISSION and "job 1001 belongs to alice" in str(exc)


def test_through_main_with_a_config_file(seeded, capsys):
    from slurm_snap.cli import main

    # Real clock and caller (root in this test run): a fixed window keeps it deterministic.
    code = main(["--config", seeded["config"], "report", "-S", "2026-11-01", "-E", "2026-11-30T12:00",
                 "-a", "-P", "-n", "-o", "JobID,State"])
    assert code == 0
    assert capsys.readouterr().out == "1003|FAILED\n1002|VERIFIED\n1001|VERIFIED\n1002.1|PARTIAL\n1001|COMPLETE\n"
    assert main(["--config", seeded["config"], "report", "-o", "Nope"]) == errors.USAGE
    assert "'Nope'" in capsys.readouterr().err


def _all_missing_set(url: str) -> int:
    """A job whose two volumes both failed to cut: the coordinator records a
    MISSING part for each, with the error, and the set FAILs."""
    from slurm_snap import states as S
    from slurm_snap.inventory.repository import Inventory, SnapshotRecord
    from slurm_snap.jobrecords import VolumeRecord
    from test_report_seed import at

    inv = Inventory(url)
    with inv.session() as repo:
        run = repo.record_job_run(job_id=1004, restart_count=0, user_name="alice", uid=2001, partition="gpu",
                                  nodes=["n1"])
        vols = repo.add_volumes(run, [
            VolumeRecord(path="/scratch/n1/jobs/1004", scope="node-local", volume_class="scratch", backend="btrfs",
                       node="n1"),
            VolumeRecord(path="/pfs/users/alice/run7", scope="shared", volume_class="pfs", backend="btrfs")])
        t = at("2026-11-30T11:30:00")
        st, _ = repo.create_set(run, epoch="m-9", trigger="manual", requested_at=t)
        repo.transition(st.id, S.CUTTING, at=t)
        repo.record_parts(st.id, [
            SnapshotRecord(volume_id=v.id, backend=v.backend, name=f"m-9-{v.id}", ref="", path="", node=v.node,
                           cut_started_at=t, cut_at=t, state="MISSING", error="not a btrfs subvolume")
            for v in vols])
        repo.transition(st.id, S.FAILED, at=t, reason="no volume was cut")
        set_id = st.id
    inv.dispose()
    return set_id


def test_volumes_counts_only_the_parts_that_were_cut(seeded):
    """A part recorded MISSING is a record of a failure, not a cut volume."""
    set_id = _all_missing_set(seeded["url"])
    assert run(seeded, "-j", "1004", "-o", "JobID,SetID,State,Volumes", "-P", "-n") == f"1004|{set_id}|FAILED|0/2\n"
    doc = json.loads(run(seeded, "-j", "1004", "--json"))
    assert doc["sets"][0]["volumes"] == {"cut": 0, "expected": 2}
    # the parts themselves are still listed, as MISSING
    assert [p["state"] for p in doc["sets"][0]["snapshots"]] == ["MISSING", "MISSING"]


def test_show_counts_only_the_parts_that_were_cut(seeded):
    from slurm_snap.cli import show_cmd

    set_id = _all_missing_set(seeded["url"])
    code, out, exc = invoke(show_cmd.command, [f"set:{set_id}"], seeded["config"], ROOT)
    assert code == 0, (out, exc)
    assert "volumes 0/2" in out
    code, out, exc = invoke(show_cmd.command, ["--json", f"set:{set_id}"], seeded["config"], ROOT)
    assert json.loads(out)["set"]["volumes"] == {"cut": 0, "expected": 2}


# ---- sacct's habits (issue 18) ------------------------------------------------
def test_repeated_job_user_and_state_options_accumulate_as_in_sacct(seeded):
    window = ("-S", "2026-11-01", "-o", "JobID,User,State", "-P", "-n")
    assert run(seeded, "-j", "1001", "-j", "1003", *window) == run(seeded, "-j", "1001,1003", *window)
    assert set(run(seeded, "-j", "1001", "-j", "1003", *window).split()) == {
        "1001|alice|VERIFIED", "1001|alice|COMPLETE", "1003|carol|FAILED"}
    assert set(run(seeded, "-u", "alice", "-u", "carol", *window).split()) == {
        "1001|alice|VERIFIED", "1001|alice|COMPLETE", "1003|carol|FAILED"}
    assert set(run(seeded, "-s", "failed", "-s", "partial", *window).split()) == {
        "1002.1|bob|PARTIAL", "1003|carol|FAILED"}


def test_user_by_uid_and_an_unknown_uid(seeded):
    import pwd

    me = pwd.getpwuid(0).pw_name
    doc = json.loads(run(seeded, "-u", "0", "--json"))
    assert doc["filter"]["users"] == [me] and doc["sets"] == []
    code, _out, exc = invoke(report_cmd.command, ["-u", "3999999999"], seeded["config"], ROOT)
    assert code == errors.USAGE and "'3999999999'" in str(exc) and "UID" in str(exc)


def test_partition_filter(seeded):
    window = ("-S", "2026-11-01", "-o", "JobID,Partition", "-P", "-n")
    assert set(run(seeded, "-r", "cpu", *window).split()) == {"1003|cpu"}
    assert set(run(seeded, "--partition", "gpu", "-r", "cpu", *window).split()) == {
        "1001|gpu", "1002|gpu", "1002.1|gpu", "1003|cpu"}
    assert run(seeded, "-r", "nosuch", *window) == ""


def test_allocations_flag_is_accepted_and_changes_nothing(seeded):
    assert run(seeded, "-X") == DEFAULT


def test_delimiter_replaces_the_bar(seeded):
    assert run(seeded, "-o", "JobID,User", "-P", "-n", "--delimiter", ";;", "-j", "1003") == "1003;;carol\n"
    assert run(seeded, "-o", "JobID,User", "-p", "--delimiter", ",", "-j", "1003") == "JobID,User,\n1003,carol,\n"
    code, _out, exc = invoke(report_cmd.command, ["--delimiter", ""], seeded["config"], ROOT)
    assert code == errors.USAGE and "--delimiter" in str(exc)


@pytest.mark.parametrize("opt", ["-j", "-u", "-s", "-r"])
def test_an_empty_list_is_an_error_not_no_filter(seeded, opt):
    code, _out, exc = invoke(report_cmd.command, [opt, ""], seeded["config"], ROOT)
    assert code == errors.USAGE and "empty item" in str(exc)


def test_nodelist_is_compressed_as_slurm_writes_it(seeded):
    assert run(seeded, "-j", "1001", "-o", "JobID,NodeList", "-P", "-n") == "1001|n[1-2]\n1001|n[1-2]\n"


def _objectives(seeded, every: dict):
    from sqlalchemy import update

    from slurm_snap.inventory.models import JobRun
    from slurm_snap.inventory.repository import Inventory

    inv = Inventory(seeded["url"])
    with inv.session() as repo:
        for (job, rc), seconds in every.items():
            repo.s.execute(update(JobRun).where(JobRun.job_id == job, JobRun.restart_count == rc)
                           .values(snapshot_every=seconds))
    inv.dispose()


def test_objective_beside_rpo_and_the_rpo_missed_filter(seeded):
    """Issue 17: a periodic run's objective is its interval; RPOMet compares
    the verified RPO with it, and --rpo-missed keeps only the jobs past it."""
    _objectives(seeded, {(1001, 0): 3600, (1002, 1): 86400})
    assert run(seeded, "-o", "JobID,RPO,Objective,RPOMet", "-P", "-n") == table("""
1001|02:59:56|01:00:00|no
1002.1|15:59:56|1-00:00:00|yes
1001|02:59:56|01:00:00|no
""")
    assert run(seeded, "-o", "JobID,State,RPOMet", "-P", "-n", "--rpo-missed") == table("""
1001|VERIFIED|no
1001|COMPLETE|no
""")
    doc = json.loads(run(seeded, "--json", "--rpo-missed"))
    assert {(s["job"], s["rpo_objective_seconds"], s["rpo_missed"]) for s in doc["sets"]} == {("1001", 3600, True)}
