"""Whole-filesystem backends (Lustre): sets cut together share one snapshot,
the inventory says so, and a set that arrives after it was cut is judged by
the shared snapshot's own time (against the fake lctl: untested on real Lustre)."""
import datetime as dt
import os
import subprocess
from pathlib import Path

from slurm_snap.backends.registry import get_backend
from slurm_snap.backends.transport import LocalTransport
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap.protocol.cutter import coalesced_name, cut_one

FAKES = str(Path(__file__).resolve().parent.parent / "fakes")


def _lustre(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    env = {"SLURM_SNAP_FAKE_STATE": str(state)}
    subprocess.run([os.path.join(FAKES, "lctl"), "__fake_mkfs", "fs1"], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", **env})
    return get_backend("lustre", {"tool_dir": FAKES, "fsname": "fs1", "mountpoint": "/lustre/fs1"},
                       LocalTransport(extra_env=env))


def test_two_jobs_in_one_window_share_one_snapshot(tmp_path):
    backend = _lustre(tmp_path)
    t = dt.datetime(2026, 11, 30, 12, 0, 1, tzinfo=dt.timezone.utc)
    clock = lambda: t  # noqa: E731 - both sets cut "at the same moment"
    a = VolumeRecord(path="/lustre/fs1/projects/a", scope="shared", volume_class="pfs", backend="lustre", id=1)
    b = VolumeRecord(path="/lustre/fs1/projects/b", scope="shared", volume_class="pfs", backend="lustre", id=2)
    ra = cut_one(a, job_id=10, set_id=1, backend_for=lambda v: backend, entries=[], clock=clock)
    rb = cut_one(b, job_id=11, set_id=2, backend_for=lambda v: backend, entries=[], clock=clock)
    assert ra.ok and rb.ok, (ra.error, rb.error)
    assert ra.name == rb.name == coalesced_name("lustre:fs1", t)
    assert ra.ref.ref == rb.ref.ref
    assert ra.shared_key == rb.shared_key == "lustre:fs1"
    assert len(backend.list("/lustre/fs1/projects/a")) == 1  # one snapshot, not two


def test_next_window_cuts_a_new_snapshot(tmp_path):
    backend = _lustre(tmp_path)
    t = dt.datetime(2026, 11, 30, 12, 0, 1, tzinfo=dt.timezone.utc)
    v = VolumeRecord(path="/lustre/fs1/p", scope="shared", volume_class="pfs", backend="lustre", id=1)
    r1 = cut_one(v, job_id=10, set_id=1, backend_for=lambda _: backend, entries=[], clock=lambda: t)
    later = t + dt.timedelta(seconds=30)
    r2 = cut_one(v, job_id=11, set_id=2, backend_for=lambda _: backend, entries=[], clock=lambda: later)
    assert r1.name != r2.name and r1.ref.ref != r2.ref.ref


def test_volume_scoped_backends_never_coalesce(tmp_path):
    from testkit import doubles

    doubles.register_test_backends()
    vol = tmp_path / "vol"
    vol.mkdir()
    backend = get_backend(doubles.CopyBackend.name, {})
    assert backend.coalesce_key(str(vol)) is None
    r = cut_one(VolumeRecord(path=str(vol), scope="shared", volume_class="pfs", backend=doubles.CopyBackend.name,
                             id=1), job_id=1, set_id=1,
                backend_for=lambda _: backend, entries=[], clock=lambda: dt.datetime.now(dt.timezone.utc))
    assert r.ok and r.shared_key == "" and r.name == "slurm-snap-1-1-1"
