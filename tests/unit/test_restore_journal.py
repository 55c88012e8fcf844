"""The drill's crash journal (restore/journal.py): one record, one parser,
one writer. What a drill of the previous release wrote is read the same (a
drill in flight across an upgrade is still swept), and a journal that is not
one a drill wrote is refused with the field named, never half-trusted by
root's cleanup."""
from __future__ import annotations

import json
import os

import pytest

from slurm_snap import errors
from slurm_snap.restore import journal as journal_mod
from slurm_snap.restore.journal import Clone, Copy, Journal, JournalFile

# Written by restore/drill.py before the journal had a type (main 3fe353f):
# a placed drill, submitted with --no-wait.
OLD = {"version": 1, "set_id": 7, "test_id": 3, "host": "ctl", "pid": 4242,
       "started_at": "2026-12-03T08:00:00.123456+00:00",
       "clones": [{"snapshot_id": 11, "path": "/r/7-3/pfs", "ns": "/r/7-3", "live": "/pfs/u/j", "class": "pfs",
                   "node": ""},
                  {"snapshot_id": 12, "path": "/s/jobs/.snapshots/.slurm-snap-restore-7-3/scratch",
                   "ns": "/s/jobs/.snapshots/.slurm-snap-restore-7-3", "live": "/s/jobs/42", "class": "scratch",
                   "node": "n1", "on": "n3"}],
       "namespaces": ["/s/jobs/.snapshots/.slurm-snap-restore-7-3"],
       "copies": [{"snapshot_id": 12, "on": "n3", "class": "scratch", "backend": "btrfs", "volume": "/s/jobs/42",
                   "name": "snap-42-7-12", "ref": "/s/jobs/.snapshots/snap-42-7-12", "path": None, "from": "n1"}],
       "nodes": ["n3"], "slurm_job_id": 77, "detached": True, "deadline": 120.0, "checkpoint_step": 30}


def test_the_previous_releases_journal_reads_and_writes_back_the_same():
    j = journal_mod.parse(OLD)
    assert j.clones[1] == Clone(snapshot_id=12, path=OLD["clones"][1]["path"], ns=OLD["clones"][1]["ns"],
                                live="/s/jobs/42", volume_class="scratch", node="n1", on="n3")
    assert j.copies == (Copy(snapshot_id=12, on="n3", volume_class="scratch", backend="btrfs", volume="/s/jobs/42",
                             name="snap-42-7-12", ref="/s/jobs/.snapshots/snap-42-7-12", path=None, source="n1"),)
    assert (j.slurm_job_id, j.detached, j.deadline, j.checkpoint_step, j.nodes) == (77, True, 120.0, 30, ("n3",))
    assert j.as_json() == OLD


def test_a_drill_adds_to_its_journal_on_disk_before_it_acts(tmp_path):
    ns = str(tmp_path)
    jf = JournalFile(ns, Journal(set_id=7, test_id=3, host="ctl", pid=1, started_at="2026-12-03T08:00:00+00:00"))
    first = json.loads((tmp_path / journal_mod.FILE).read_text())
    assert first["clones"] == [] and "slurm_job_id" not in first and "nodes" not in first
    clone = Clone(snapshot_id=1, path=f"{ns}/pfs", ns=ns, live="/pfs/j", volume_class="pfs", node="")
    jf.record(jf.current.with_clone(clone).with_namespace("/alt").with_namespace("/alt"))
    jf.record(jf.current.submitted(9, detached=False, deadline=60.0, checkpoint_step=None))
    back = journal_mod.read(ns)
    assert back == jf.current and back.clones == (clone,) and back.namespaces == ("/alt",)
    assert back.slurm_job_id == 9 and back.detached is False
    assert oct(os.stat(tmp_path / journal_mod.FILE).st_mode & 0o777) == "0o644"


def test_no_journal_or_an_unreadable_one_is_none(tmp_path):
    assert journal_mod.read(str(tmp_path)) is None
    (tmp_path / journal_mod.FILE).write_text("{")   # killed mid-write before fsio wrote atomically
    assert journal_mod.read(str(tmp_path)) is None


@pytest.mark.parametrize("change, named", [
    (lambda d: d.pop("pid"), "'pid' None: is missing"),
    (lambda d: d.update(pid="4242"), "'pid' '4242': is not an integer"),
    (lambda d: d.update(set_id=True), "'set_id' True: is not an integer"),
    (lambda d: d.update(version=2), "'version' 2: is not 1"),
    (lambda d: d["clones"][1].pop("class"), "'clones[1].class' None: is missing"),
    (lambda d: d["clones"].append("x"), "'clones[2]' 'x': is not an object"),
    (lambda d: d["copies"][0].update(on=None), "'copies[0].on' None: is not a string"),
    (lambda d: d.update(namespaces=[1]), "'namespaces' 1: is not a list of strings"),
    (lambda d: d.update(detached="yes"), "'detached' 'yes': is not true or false"),
])
def test_a_journal_no_drill_wrote_is_refused_naming_the_field(tmp_path, change, named):
    data = json.loads(json.dumps(OLD))
    change(data)
    (tmp_path / journal_mod.FILE).write_text(json.dumps(data))
    with pytest.raises(errors.BadValueError) as info:
        journal_mod.read(str(tmp_path))
    assert named in str(info.value) and journal_mod.FILE in str(info.value)


def test_cleanup_removes_nothing_a_bad_journal_lists(tmp_path):
    from slurm_snap.restore import namespace as nsmod

    ns = nsmod.namespace_path(str(tmp_path), 7, 3)
    nsmod.make_namespace(str(tmp_path), ns, os.getuid(), os.getgid())
    data = json.loads(json.dumps(OLD))
    data["clones"][0]["path"] = 5
    with open(os.path.join(ns, journal_mod.FILE), "w") as f:
        json.dump(data, f)
    (err,) = nsmod.cleanup_namespace(ns, lambda clone: pytest.fail("no backend is asked for"))
    assert "field 'clones[0].path' 5: is not a string" in err and os.path.isdir(ns)
