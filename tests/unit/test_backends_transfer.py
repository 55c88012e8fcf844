"""backends.transfer with plain tools through LocalTransport: the stream is
moved whole, a slow end times out, a failing end is named, a partial copy is
discarded, and the means is chosen from capabilities alone."""
from __future__ import annotations

import os
import time

import pytest

from slurm_snap import errors
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef
from slurm_snap.backends.transfer import method_for, placed, transfer
from slurm_snap.backends.transport import LocalTransport


class FileCopyBackend(Backend):
    """A 'snapshot' is a file; its copy is made by cat into a partial file, then renamed."""

    name = "filecopy"
    UTILS = ("cat", "tee", "mv", "rm", "sleep", "false")

    def __init__(self, options=None, *, out=None, into=None, send=False):
        self.out, self.into, self.send = out, into, send
        super().__init__(options or {}, LocalTransport())

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=False, instant=False, per_file_cost=False, scope="volume",
                            needs_root=False, can_clone=False, can_send=self.send, can_copy=True)

    def create(self, volume, name):
        raise NotImplementedError

    def list(self, volume):
        return []

    def exists(self, ref):
        return os.path.exists(ref.ref)

    def delete(self, ref):
        return False

    def copy_out_argv(self, ref):
        return self.out or [self.tools["cat"], ref.ref]

    def copy_in_argv(self, ref):
        return self.into or [self.tools["tee"], ref.ref + ".partial"]

    def finish_copy_in(self, ref):
        self.run("mv", ref.ref + ".partial", ref.ref)
        return ref

    def discard_partial(self, ref):
        if os.path.exists(ref.ref + ".partial"):
            os.unlink(ref.ref + ".partial")


def _ref(path: str) -> SnapshotRef:
    return SnapshotRef("filecopy", "/vol", os.path.basename(path), path, path)


def test_the_whole_stream_arrives_and_is_counted(tmp_path):
    src = tmp_path / "a" / "s1"
    src.parent.mkdir()
    data = os.urandom(3 << 20) + b"tail"
    src.write_bytes(data)
    (tmp_path / "b").mkdir()
    got = transfer(FileCopyBackend(), _ref(str(src)), FileCopyBackend(), timeout=30, into=str(tmp_path / "b"))
    assert got.method == "copy" and got.bytes == len(data)
    assert (tmp_path / "b" / "s1").read_bytes() == data and got.ref.ref == str(tmp_path / "b" / "s1")
    again = transfer(FileCopyBackend(), _ref(str(src)), FileCopyBackend(), timeout=30, into=str(tmp_path / "b"))
    assert (again.method, again.bytes) == ("present", 0)


def test_a_source_that_hangs_times_out_and_leaves_no_partial(tmp_path):
    src = tmp_path / "s1"
    src.write_bytes(b"x")
    (tmp_path / "b").mkdir()
    slow = FileCopyBackend(out=["/bin/sleep", "30"])
    t0 = time.monotonic()
    with pytest.raises(errors.Timeout):
        transfer(slow, _ref(str(src)), FileCopyBackend(), timeout=1.0, into=str(tmp_path / "b"))
    assert time.monotonic() - t0 < 10
    assert os.listdir(tmp_path / "b") == []


def test_a_failing_receiver_is_named_with_its_status(tmp_path):
    src = tmp_path / "s1"
    src.write_bytes(os.urandom(1 << 20))
    (tmp_path / "b").mkdir()
    failing = FileCopyBackend(into=["/bin/false"])
    with pytest.raises((errors.CommandFailed, errors.TransportError)) as e:
        transfer(FileCopyBackend(), _ref(str(src)), failing, timeout=30, into=str(tmp_path / "b"))
    assert "false" in str(e.value) or "stream broken" in str(e.value)
    assert not (tmp_path / "b" / "s1").exists()


def test_means_is_chosen_from_capabilities():
    assert method_for(FileCopyBackend(send=True), FileCopyBackend(send=True)) == "send"
    assert method_for(FileCopyBackend(send=True), FileCopyBackend()) == "copy"
    assert placed(_ref("/x/.snapshots/s1"), "/y/.snapshots").ref == "/y/.snapshots/s1"
    assert placed(_ref("/x/.snapshots/s1")).ref == "/x/.snapshots/s1"
    with pytest.raises(errors.BadValueError):
        placed(_ref("/x/s1"), "relative/dir")
