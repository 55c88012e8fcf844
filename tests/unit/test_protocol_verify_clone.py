"""The manifest check of a snapshot that has no browsable path (zfs-fuse: no
.zfs directory) goes through a clone of it next to the volume, which is
removed again; without a clone there is still no check (None), never a pass."""
import dataclasses
import os
import shutil

from testkit import doubles
from slurm_snap.backends.transport import LocalTransport
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap.protocol.cutter import VERIFY_CLONE_PREFIX, Entry, verify


class Pathless(doubles.CopyBackend):
    """A copy backend whose snapshots show no path, like zfs-fuse's."""

    name = "test-pathless"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.clones: list[str] = []
        self.removed: list[str] = []

    def create(self, volume, name):
        return dataclasses.replace(super().create(volume, name), path=None)

    def clone(self, ref, target):
        self.clones.append(target)
        return super().clone(ref, target)

    def delete_clone(self, path):
        shutil.rmtree(path)
        self.removed.append(path)
        return True


def _setup(tmp_path):
    vol = tmp_path / "jobs" / "42"
    (vol / "ckpt").mkdir(parents=True)
    (vol / "ckpt" / "m.pt").write_bytes(b"abc")
    backend = Pathless({}, LocalTransport())
    ref = backend.create(str(vol), "slurm-snap-42-1-1")
    assert ref.path is None
    return vol, backend, ref, VolumeRecord(path=str(vol), scope="shared", volume_class="zfs", backend=backend.name,
                                           id=1)


def test_checked_through_a_clone_next_to_the_volume_and_removed(tmp_path):
    vol, backend, ref, info = _setup(tmp_path)
    (vol / "ckpt" / "m.pt").write_bytes(b"changed after the cut")  # the live file moved on
    assert verify(backend, info, ref, [Entry(str(vol / "ckpt" / "m.pt"), 3)]) == (True, "")
    expected = str(tmp_path / "jobs" / (VERIFY_CLONE_PREFIX + ref.name))
    assert backend.clones == backend.removed == [expected]
    assert not os.path.exists(expected)


def test_a_missing_or_short_file_fails_through_the_clone_too(tmp_path):
    vol, backend, ref, info = _setup(tmp_path)
    ok, why = verify(backend, info, ref, [Entry(str(vol / "ckpt" / "m.pt"), 4)])
    assert ok is False and "3 bytes in the snapshot, 4 acknowledged" in why
    ok, why = verify(backend, info, ref, [Entry(str(vol / "ckpt" / "other.pt"), 1)])
    assert ok is False and "missing from the snapshot" in why
    assert len(backend.removed) == 2 and not any(os.path.exists(p) for p in backend.removed)


def test_no_clone_no_check(tmp_path):
    vol, backend, ref, info = _setup(tmp_path)

    class NoClone(Pathless):
        @property
        def capabilities(self):
            return dataclasses.replace(super().capabilities, can_clone=False)

    ok, why = verify(NoClone({}, LocalTransport()), info, ref, [Entry(str(vol / "ckpt" / "m.pt"), 3)])
    assert ok is None and "no visible path" in why
