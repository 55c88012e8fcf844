"""The per-job files' records (slurm_snap.jobrecords): each writer's object
parses back to the same record, and each parser names the file, the field
and the value that is wrong. The acknowledgement has its own suite
(test_client_ack.py, test_badinput_files.py)."""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest

from slurm_snap.errors import BadValueError
from slurm_snap.jobdir import JobDir
from slurm_snap.jobrecords import (Ack, CutPart, CutRecord, EarlyDecision, JobRecord, ManifestEntry, ReleaseRecord,
                                   RequestRecord, ResumeRank, ResumeRecord, VolumeRecord, is_preempt_epoch,
                                   preempt_epoch, preempt_restart)

T0 = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.timezone.utc)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RECORDS = [
    JobRecord(job_id=77, restart_count=2, user="alice", nodes=("n1", "n2"), signal="USR1",
              volumes=(VolumeRecord(path="/scratch/n1/jobs/77", scope="node-local", volume_class="scratch", node="n1"),
                       VolumeRecord(path="/pfs/jobs/77", scope="shared", volume_class="pfs"))),
    RequestRecord(job_id="77", epoch="s12", requested_at=T0, deadline=T0 + dt.timedelta(seconds=60)),
    ReleaseRecord(epoch="s12", set_id=12, state="COMPLETE", consistency="app-consistent"),
    ReleaseRecord(epoch="preempt-0"),
    ResumeRecord(set_id=12, step=300, live="/pfs/ckpt", snapshot="/pfs/.snap/12/ckpt",
                 ranks=(ResumeRank(rank=0, node="n3", from_node="n1", live="/s/ckpt", checkpoint="/s/.snap/ckpt"),
                        ResumeRank(rank=1, node="n4", from_node="n2", live="/s/ckpt", checkpoint=None,
                                   missing="its scratch part (cut on n2) is not on n4")),
                 missing=("scratch part of rank(s) 1 (cut on n2): no copy survives",)),
    EarlyDecision(epoch="preempt-0", decision="requeued", at=1.5e9, why="preempted at X", all_acknowledged_at=1.4e9),
    EarlyDecision(epoch="preempt-0", decision="waited", at=1.5e9, why="not every rank acknowledged in time"),
    CutRecord(epoch="preempt-3", node="n1", set_id=4, trigger="timelimit"),
    CutRecord(epoch="preempt-1", node="n2", set_id=None, preempt_time=1.5e9, job=JobRecord(
        job_id=77, restart_count=1, user="alice", nodes=("n2",),
        volumes=(VolumeRecord(path="/scratch/jobs/77", scope="node-local", volume_class="scratch", node="n2"),)),
        parts=(
        CutPart(volume_class="scratch", scope="node-local", node="n2", path="/scratch/jobs/77", backend="btrfs",
                name="slurm-snap-77-r1-0123456789ab", ref="/scratch/jobs/.snapshots/x",
                snapshot_path="/scratch/jobs/.snapshots/x", cut_started_at=T0, cut_at=T0, manifest_ok=True),
        CutPart(volume_class="pfs", scope="shared", node="", path="/pfs/jobs/77", backend="btrfs", name="y",
                state="MISSING", error="did not finish within 3 s"))),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_what_a_writer_writes_parses_back_to_the_same_record(record):
    # Through JSON, as the file holds it.
    assert type(record).parse(json.loads(json.dumps(record.to_json()))) == record


def test_an_acknowledgement_round_trips_through_its_bytes():
    ack = Ack(node="n1", rank=3, local_rank=1, local_size=2, step=7, written_at=T0,
              manifest=(ManifestEntry("/pfs/c/rank-3.pt", 10, "a" * 64),), world_size=4, agreement="collective",
              signalled_at=T0, job_id="77", epoch="s12")
    assert Ack.from_bytes(ack.to_bytes(), "77", "s12") == ack


@pytest.mark.parametrize("cls,doc,field,value", [
    (JobRecord, {"volumes": "all"}, "volumes", "'all'"),
    (JobRecord, {"volumes": [{"class": "pfs"}]}, "volumes[0]", "'class'"),
    (JobRecord, {"volumes": [], "restart_count": -1}, "restart_count", "-1"),
    (JobRecord, {"volumes": [], "nodes": "n1"}, "nodes", "'n1'"),
    (RequestRecord, {"job_id": "77"}, "epoch", "None"),
    (RequestRecord, {"job_id": "77", "epoch": "../x"}, "epoch", "'../x'"),
    (RequestRecord, {"job_id": "77", "epoch": "s1", "deadline": "soon"}, "deadline", "'soon'"),
    (RequestRecord, {"job_id": "77", "epoch": "s1", "requested_at": "2026-12-03T10:00:00"}, "requested_at",
     "2026-12-03T10:00:00"),
    (ReleaseRecord, {"epoch": "s1", "set_id": "twelve"}, "set_id", "'twelve'"),
    (ResumeRecord, {"set_id": 1, "step": True, "checkpoint": {"live": "/a"}}, "step", "True"),
    (ResumeRecord, {"set_id": 1, "step": 1, "checkpoint": {"live": "/a", "snapshot": "b"}}, "checkpoint.snapshot",
     "'b'"),
    (ResumeRecord, {"set_id": 1, "step": 1, "checkpoint": {"live": "/a"}, "ranks": {"x": {}}}, "ranks.x", "{}"),
    (ResumeRecord, {"set_id": 1, "step": 1, "checkpoint": {"live": "/a"}, "ranks": {"0": {"node": 5}}},
     "ranks.0.node", "5"),
    (ResumeRecord, {"set_id": 1, "step": 1, "checkpoint": {"live": "/a"}, "missing": "x"}, "missing", "'x'"),
    (EarlyDecision, {"epoch": "preempt-0", "decision": "maybe", "at": 1}, "decision", "'maybe'"),
    (EarlyDecision, {"epoch": "preempt-0", "decision": "kept", "at": "soon"}, "at", "'soon'"),
    (EarlyDecision, {"epoch": "preempt-0", "decision": "kept", "at": 1, "whence": 2}, "whence", "2"),
    (CutRecord, {"epoch": "preempt-0", "node": "n1", "parts": "all"}, "parts", "'all'"),
    (CutRecord, {"epoch": "preempt-0", "node": "../n1", "parts": []}, "node", "'../n1'"),
    (CutRecord, {"epoch": "preempt-0", "node": "n1", "parts": [], "set_id": -1}, "set_id", "-1"),
    (CutRecord, {"epoch": "preempt-0", "node": "n1", "parts": [], "job": {"volumes": "all"}}, "volumes", "'all'"),
    (CutRecord, {"epoch": "preempt-0", "node": "n1", "parts": [], "trigger": "manual"}, "trigger", "'manual'"),
    (CutPart, {"volume_class": "s", "scope": "local", "node": "n1", "path": "/s", "backend": "b", "name": "x",
               "state": "CUT"}, "scope", "'local'"),
    (CutPart, {"volume_class": "s", "scope": "shared", "node": "", "path": "s", "backend": "b", "name": "x",
               "state": "CUT"}, "path", "'s'"),
    (CutPart, {"volume_class": "s", "scope": "shared", "node": "", "path": "/s", "backend": "b", "name": "x",
               "state": "GONE"}, "state", "'GONE'"),
    (CutPart, {"volume_class": "s", "scope": "shared", "node": "", "path": "/s", "backend": "b", "name": "x",
               "state": "CUT", "cut_at": "noon"}, "cut_at", "'noon'"),
    (CutPart, {"volume_class": "s", "scope": "shared", "node": "", "path": "/s", "backend": "b", "name": "x",
               "state": "CUT", "manifest_ok": "yes"}, "manifest_ok", "'yes'"),
])
def test_a_bad_field_is_named_with_its_file_and_value(cls, doc, field, value):
    with pytest.raises(BadValueError) as info:
        cls.parse(doc, "/b/77/x")
    text = str(info.value)
    assert f"field {field!r}" in text and value in text and "(in /b/77/x)" in text, text


def test_a_request_of_another_job_is_refused_by_its_reader(tmp_path):
    jd = JobDir(str(tmp_path), 77)
    os.makedirs(jd.path)
    jd.write_request(RequestRecord(job_id="78", epoch="s1", requested_at=T0, deadline=T0))
    with pytest.raises(BadValueError, match="belongs to another job"):
        jd.read_request()


def test_the_job_file_gives_this_nodes_volume_before_the_shared_one():
    job = RECORDS[0]
    assert job.volume_path("scratch", "n1") == "/scratch/n1/jobs/77"
    assert job.volume_path("scratch", "n3") is None
    assert job.volume_path("pfs", "n3") == "/pfs/jobs/77"


def test_the_preemption_epoch_is_spelled_once():
    assert preempt_epoch(3) == "preempt-3" and is_preempt_epoch("preempt-3") and not is_preempt_epoch("s3")
    assert preempt_restart(preempt_epoch(3)) == 3 and preempt_restart("s3") is None
    assert preempt_restart("preempt-") is None and preempt_restart("preempt-x") is None


def test_the_records_import_nothing_of_slurm_snap_but_its_errors():
    """The rank client imports them inside training processes: nothing of
    slurm_snap beyond errors and the record decorator, both standard library
    only (test_client_env.py blocks the heavy modules)."""
    code = (f"import sys; sys.path.insert(0, {REPO!r}); import slurm_snap.jobrecords; "
            "print(sorted(m for m in sys.modules if m.startswith('slurm_snap')))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    loaded = set(eval(out.stdout))
    assert loaded <= {"slurm_snap", "slurm_snap.errors", "slurm_snap.record"} | {
        m for m in loaded if m.startswith("slurm_snap.jobrecords")}


def test_the_hook_triggers_are_the_inventorys():
    """jobrecords spells them without importing states (stdlib only)."""
    from slurm_snap import states
    from slurm_snap.jobrecords import HOOK_TRIGGERS

    assert HOOK_TRIGGERS == states.HOOK_TRIGGERS


def test_a_preemptions_cut_record_is_written_as_before_the_time_limit_option():
    """A node not yet upgraded reads what an upgraded one writes at a preemption."""
    assert "trigger" not in CutRecord(epoch="preempt-0", node="n1").to_json()
    assert CutRecord(epoch="preempt-0", node="n1", trigger="timelimit").to_json()["trigger"] == "timelimit"
