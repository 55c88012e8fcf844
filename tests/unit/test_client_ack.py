"""jobrecords.Ack.from_bytes (the coordinator's gate on acknowledgements, the
record the client writes) and the per-node barrier verdict."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from slurm_snap.jobdir import ack_filename
from slurm_snap.jobrecords import Ack, ManifestEntry
from slurm_snap.protocol.barrier import node_barrier_complete
from slurm_snap.errors import BadValueError

WHEN = datetime(2025, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def good(**changes) -> dict:
    doc = {"version": 1, "job_id": "42", "epoch": "od-3", "node": "n1", "rank": 4,
           "local_rank": 1, "local_size": 2, "step": 100, "written_at": WHEN.isoformat(),
           "manifest": [{"path": "/pfs/ckpt/step-100/rank-4.pt", "size": 10, "sha256": "a" * 64},
                        {"path": "/pfs/ckpt/latest.rank-4", "size": 3}]}
    doc.update(changes)
    return doc


def raw(doc) -> bytes:
    return json.dumps(doc).encode()


def test_round_trip_with_build_ack():
    data = Ack(job_id="42", epoch="od-3", node="n1", rank=4, local_rank=1, local_size=2,
               step=100, written_at=WHEN,
               manifest=[ManifestEntry("/a/b", 5, None), ManifestEntry("/a/c", 0, "b" * 64)],
               world_size=8, agreement="collective").to_bytes()
    ack = Ack.from_bytes(data, "42", "od-3")
    assert ack == Ack(version=2, job_id="42", epoch="od-3", node="n1", rank=4, local_rank=1,
                      local_size=2, step=100, written_at=WHEN,
                      manifest=(ManifestEntry("/a/b", 5, None), ManifestEntry("/a/c", 0, "b" * 64)),
                      world_size=8, independent=False, agreement="collective")


def test_version_1_from_an_older_client_still_parses_with_lockstep_fields_unknown():
    ack = Ack.from_bytes(raw(good()), "42", "od-3")
    assert (ack.version, ack.world_size, ack.independent, ack.agreement) == (1, None, False, "")
    with pytest.raises(BadValueError, match="'world_size'.*unknown key"):
        Ack.from_bytes(raw(good(world_size=8)), "42", "od-3")


def v2(**changes) -> dict:
    return good(**{"version": 2, "world_size": 8, "independent": False, "agreement": "", **changes})


@pytest.mark.parametrize("doc,named", [
    (v2(world_size=0), "'world_size' 0"),
    (v2(rank=8), "'rank' 8: must be < world_size 8"),
    (v2(world_size=1), "'rank' 4"),
    (v2(independent="yes"), "'yes'"),
    (v2(agreement="maybe"), "'maybe'"),
    (v2(agreement="failed: " + "x" * 300), "'agreement'"),
])
def test_version_2_fields_are_checked(doc, named):
    with pytest.raises(BadValueError) as info:
        Ack.from_bytes(raw(doc), "42", "od-3")
    assert named in str(info.value)


def test_version_2_world_size_may_be_unknown():
    ack = Ack.from_bytes(raw(v2(world_size=None, independent=True, agreement="failed: timed out")), "42", "od-3")
    assert (ack.world_size, ack.independent, ack.agreement) == (None, True, "failed: timed out")


def test_numeric_job_id_is_accepted_and_normalised():
    assert Ack.from_bytes(raw(good(job_id=42)), 42, "od-3").job_id == "42"


@pytest.mark.parametrize("doc,named", [
    (good(epoch="preempt-0"), "'preempt-0'"),
    (good(job_id="43"), "'43'"),
    (good(version=3), "3"),
    (good(version=True), "True"),
    (good(rank="4"), "'4'"),
    (good(rank=-1), "-1"),
    (good(local_rank=2), "local_rank"),
    (good(local_size=0), "local_size"),
    (good(step=1.5), "1.5"),
    (good(node="../etc"), "'../etc'"),
    (good(written_at="yesterday"), "'yesterday'"),
    (good(written_at="2025-01-02T03:04:05"), "2025-01-02T03:04:05"),  # no offset
    (good(manifest={"path": "/x"}), "manifest"),
    (good(manifest=[{"path": "relative/file", "size": 1}]), "'relative/file'"),
    (good(manifest=[{"path": "/x", "size": -5}]), "-5"),
    (good(manifest=[{"path": "/x", "size": 1, "sha256": "XYZ"}]), "'XYZ'"),
    (good(manifest=[{"path": "/x", "size": 1, "mode": 5}]), "'mode'"),
    (good(manifest=[{"size": 1}]), "manifest[0].path"),
    (good(extra=1), "'extra'"),
    (good(signalled_at="2025-01-02T03:04:05"), "'signalled_at'"),   # v1 has no such field
    (good(version=2, signalled_at="2025-01-02T03:04:05"), "2025-01-02T03:04:05"),  # no offset
    (good(version=2, signalled_at=5), "signalled_at"),
])
def test_rejects_bad_field_naming_the_value(doc, named):
    with pytest.raises(BadValueError) as info:
        Ack.from_bytes(raw(doc), "42", "od-3")
    assert named in str(info.value)


@pytest.mark.parametrize("field", ["version", "job_id", "epoch", "node", "rank", "local_rank",
                                   "local_size", "step", "written_at", "manifest"])
def test_rejects_missing_field(field):
    doc = good()
    del doc[field]
    with pytest.raises(BadValueError, match=f"'{field}'.*missing"):
        Ack.from_bytes(raw(doc), "42", "od-3")


def test_rejects_unparseable():
    with pytest.raises(BadValueError, match="not valid JSON") as info:
        Ack.from_bytes(b'{"version": 1, ', "42", "od-3")
    assert "version" in str(info.value)  # the offending bytes are quoted
    with pytest.raises(BadValueError, match="not valid JSON"):
        Ack.from_bytes(b"\xff\xfe garbage", "42", "od-3")


def test_rejects_non_object():
    with pytest.raises(BadValueError, match=r"\[1, 2\]"):
        Ack.from_bytes(b"[1, 2]", "42", "od-3")


def test_rejects_oversized_before_parsing():
    big = raw(good(manifest=[{"path": "/x" * 400, "size": 1}] * 2000))
    assert len(big) > 1 << 20
    with pytest.raises(BadValueError, match=f"'{len(big)} bytes'.*limit of 1048576"):
        Ack.from_bytes(big, "42", "od-3")
    with pytest.raises(BadValueError, match="limit of 100 bytes"):
        Ack.from_bytes(raw(good()), "42", "od-3", max_bytes=100)


def test_ack_filename():
    assert ack_filename("n1", 3) == "n1.3.json"
    with pytest.raises(BadValueError, match="'a/b'"):
        ack_filename("a/b", 0)


def ack(local_rank, local_size=2, epoch="e1", node="n1", rank=None) -> Ack:
    return Ack(version=1, job_id="1", epoch=epoch, node=node,
               rank=local_rank if rank is None else rank, local_rank=local_rank,
               local_size=local_size, step=1, written_at=WHEN, manifest=())


def test_node_barrier_complete():
    assert node_barrier_complete([ack(0), ack(1)]) is True
    assert node_barrier_complete([ack(1), ack(0)]) is True
    assert node_barrier_complete([ack(0, local_size=1)]) is True


@pytest.mark.parametrize("acks", [
    [],
    [ack(0)],                                    # local rank 1 missing
    [ack(0), ack(1, local_size=3)],              # disagreeing local sizes
    [ack(0, local_size=3), ack(1, local_size=3)],
    [ack(0), ack(0, rank=7), ack(1)],            # two ranks claim local rank 0
])
def test_node_barrier_incomplete(acks):
    assert node_barrier_complete(acks) is False


def test_node_barrier_rejects_acks_of_several_nodes():
    with pytest.raises(BadValueError, match="n2"):
        node_barrier_complete([ack(0), ack(1, node="n2")])
