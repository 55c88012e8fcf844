"""The hook operations' typed arguments and results across the service's
JSON (service/records.py): what a node's RemoteRecorder encodes, the
service decodes by the LocalRecorder's type hints into the same records,
and back. A bad field is named, never a traceback."""
from __future__ import annotations

import datetime as dt
import json

import pytest

from slurm_snap.errors import BadValueError
from slurm_snap.inventory.records import Refusal, SnapshotRecord
from slurm_snap.jobrecords import (Ack, CutPart, EarlyDecision, ManifestEntry, ResumeRank, ResumeRecord,
                                   VolumeRecord)
from slurm_snap.protocol.recorder import OPS, OPS_METHODS, Delivered, JobFacts, LocalRecorder, OpenedSet
from slurm_snap.spool.records import SpoolEntry
from slurm_snap.protocol.resume import ResumePoint
from slurm_snap.service.records import decode_call, decode_result, encode

T0 = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.timezone.utc)
ACK = Ack(node="n1", rank=0, local_rank=0, local_size=1, step=5, written_at=T0,
          manifest=(ManifestEntry("/pfs/c/rank-0.pt", 9),), world_size=2, signalled_at=T0, job_id="7",
          epoch="preempt-0", seen_at=T0 + dt.timedelta(seconds=1))
CUT = CutPart(volume_class="scratch", scope="node-local", node="n1", path="/s/jobs/7", backend="btrfs",
              name="slurm-snap-7-r0-abc", ref="/s/.snap/x", snapshot_path="/s/.snap/x", cut_started_at=T0, cut_at=T0,
              manifest_ok=True)
ENTRY = SpoolEntry(job_id=7, restart_count=0, node="n1", nodes=("n1", "n2"), uid=1000, written_at=T0, parts=(CUT,),
                   acks=(ACK,), set_id=None, preempt_time=1.5e9, killed_at=None,
                   early=EarlyDecision(epoch="preempt-0", decision="requeued", at=1.5e9, why="x"),
                   offline="cannot reach the slurm-snap service at ctl:6830: timed out after 5 s")
VOLUME = VolumeRecord(path="/s/jobs/7", scope="node-local", volume_class="scratch", backend="btrfs", node="n1", id=3)

CALLS = {
    "preempt-open": dict(job_id=7, restart_count=1, node="n1", nodes=["n1", "n2"], preempt_time=1.5e9),
    "preempt-cutting": dict(set_id=4, acks=[ACK]),
    "preempt-deliver": dict(entry=ENTRY),
    # A node on the version before the spool (LocalRecorder.record).
    "preempt-record": dict(set_id=4, job_id=7, node="n1", preempt_known=True, early=ENTRY.early, preempt_time=1.5e9,
                           parts=[SnapshotRecord(volume_id=3, backend="btrfs", name="slurm-snap-7-r0-abc",
                                                 ref="/s/.snap/x", path="/s/.snap/x", node="n1", cut_started_at=T0,
                                                 cut_at=T0, manifest_ok=True)]),
    "resume-point": dict(job_id=7, nodes=["n3"], restart_count=1, budget=7.0),
    "hook-failed": dict(hook="epilog", detail="boom", job_id=7, node="n1"),
    "volume-refused": dict(job=JobFacts(job_id=7, restart_count=0, user="alice", uid=1000, partition="low",
                                        nodes=("n1",), volumes=("scratch",), options={"consistency": "app"}),
                           node="n1", refused=[Refusal(node="n1", path="/s/jobs/7", why="a link")], specs=[VOLUME]),
}
RESULTS = {
    "preempt-open": OpenedSet(set_id=4, epoch="preempt-1", state="QUIESCING", nodes=("n1", "n2"), volumes=(VOLUME,),
                              uid=1000),
    "preempt-cutting": "",
    "preempt-deliver": Delivered(set_id=4, state="COMPLETE", summary="set 4 COMPLETE app-consistent", late=True),
    "preempt-record": "set 4 COMPLETE app-consistent",
    "resume-point": ResumePoint(resume=ResumeRecord(set_id=4, step=5, live="/pfs/c", snapshot=None,
                                                    ranks=(ResumeRank(0, "n3", "n1", "/s/c", None, "gone"),),
                                                    missing=("gone",)), uid=1000),
    "hook-failed": None,
    "volume-refused": 1,
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_arguments_and_results_cross_the_wire_as_the_same_records(op):
    method = getattr(LocalRecorder, OPS_METHODS[op])
    wire = json.loads(json.dumps({k: encode(v) for k, v in CALLS[op].items()}))
    assert decode_call(method, wire, op) == CALLS[op]
    assert decode_result(method, json.loads(json.dumps(encode(RESULTS[op]))), op) == RESULTS[op]


def test_every_operation_has_a_call_here():
    assert set(CALLS) == set(OPS) == set(RESULTS)


@pytest.mark.parametrize("args,named", [
    ({"set_id": 4, "acks": [{"ack": ACK.to_json(), "seen_at": "yesterday"}]}, "preempt-cutting.acks[0].seen_at"),
    ({"set_id": 4, "acks": [{"ack": {**ACK.to_json(), "rank": -1}, "seen_at": None}]}, "'rank'"),
    ({"set_id": "4", "acks": []}, "preempt-cutting.set_id"),
    ({"set_id": 4, "acks": [], "extra": 1}, "preempt-cutting.extra"),
])
def test_a_bad_argument_is_named(args, named):
    with pytest.raises(BadValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        decode_call(LocalRecorder.cutting, args, "preempt-cutting")


def test_a_part_with_an_unknown_field_is_named():
    entry = encode(ENTRY)
    entry["parts"] = [{**entry["parts"][0], "colour": "red"}]
    with pytest.raises(BadValueError, match="'colour'.*parts\\[0\\]"):
        decode_call(LocalRecorder.deliver, {"entry": entry}, "preempt-deliver")


def test_an_acknowledgement_from_a_node_on_the_older_version_is_read():
    """Nodes on the version before the typed records send an acknowledgement
    as its fields with seen_at beside them (found by the mixed-version test)."""
    from slurm_snap.jobrecords import Ack
    from slurm_snap.service.records import decode

    legacy = {"agreement": "collective", "independent": False, "local_rank": 0, "local_size": 1, "manifest": [],
              "node": "n3", "rank": 2, "seen_at": "2026-12-03T16:07:57.236377+00:00",
              "signalled_at": "2026-12-03T16:07:55.948648+00:00", "step": 7, "world_size": 3,
              "written_at": "2026-12-03T16:07:56.183065+00:00"}
    ack = decode(Ack, legacy, "acks[0]")
    assert (ack.node, ack.rank, ack.step, ack.world_size) == ("n3", 2, 7, 3)
    assert ack.seen_at.isoformat() == legacy["seen_at"]
    with pytest.raises(BadValueError, match="acks\\[0\\]"):
        decode(Ack, {**legacy, "extra": 1}, "acks[0]")
    with pytest.raises(BadValueError, match="rank"):
        decode(Ack, {**legacy, "rank": "two"}, "acks[0]")
