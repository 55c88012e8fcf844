"""commit(): checkpoint files and directories fsynced, then one atomic ack."""
from __future__ import annotations

import hashlib
import os
import stat

import pytest

from slurm_snap.client import Checkpointer
from slurm_snap.jobrecords import Ack
from slurm_snap.errors import BadValueError, NotFound, UsageError


@pytest.fixture
def setup(tmp_path):
    barrier = tmp_path / "barrier"
    (barrier / "42").mkdir(parents=True, mode=0o700)
    ckpt_root = tmp_path / "pfs" / "ckpt"
    step_dir = ckpt_root / "step-7"
    step_dir.mkdir(parents=True)
    weights = step_dir / "rank-3.pt"
    weights.write_bytes(b"w" * 1000)
    pointer = ckpt_root / "latest.rank-3"
    pointer.write_text("step-7/rank-3.pt\n")
    ckpt = Checkpointer(env={}, barrier_dir=str(barrier), job_id="42", node="n2", rank=3,
                        local_rank=1, local_size=2)
    return ckpt, barrier / "42", ckpt_root, [weights, pointer]


@pytest.fixture
def fsync_log(monkeypatch):
    """(inode, is_dir) of every fd fsynced, in order, while still calling the real fsync."""
    log = []
    real = os.fsync

    def recording(fd):
        info = os.fstat(fd)
        log.append((info.st_ino, stat.S_ISDIR(info.st_mode)))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return log


def test_commit_writes_a_valid_ack(setup):
    ckpt, job_dir, _, files = setup
    path = ckpt.commit(7, files)
    assert path == str(job_dir / "ack" / "n2.3.json")
    ack = Ack.from_bytes(open(path, "rb").read(), "42", "preempt-0")
    assert (ack.node, ack.rank, ack.local_rank, ack.local_size, ack.step) == ("n2", 3, 1, 2, 7)
    assert [(e.path, e.size, e.sha256) for e in ack.manifest] == [
        (str(files[0]), 1000, None), (str(files[1]), len("step-7/rank-3.pt\n"), None)]
    # Atomic: nothing but the ack is left in the directory.
    assert os.listdir(job_dir / "ack") == ["n2.3.json"]
    assert stat.S_IMODE(os.stat(job_dir / "ack").st_mode) == 0o700


def test_commit_fsyncs_files_dirs_and_ack(setup, fsync_log):
    ckpt, job_dir, ckpt_root, files = setup
    path = ckpt.commit(7, files, root=str(ckpt_root))
    inode = lambda p: os.stat(p).st_ino  # noqa: E731
    synced = [ino for ino, _ in fsync_log]
    for must in (files[0], files[1], files[0].parent, ckpt_root, path, job_dir / "ack"):
        assert inode(must) in synced, must
    # The root bounds the walk: its parent is not part of the checkpoint.
    assert inode(ckpt_root.parent) not in synced
    # Checkpoint data is durable before the ack exists, and the ack before its directory entry.
    assert synced.index(inode(files[0])) < synced.index(inode(path)) < len(synced) - 1
    assert fsync_log[-1] == (inode(job_dir / "ack"), True)


def test_commit_without_root_walks_to_the_mount_point(setup, fsync_log):
    ckpt, _, ckpt_root, files = setup
    ckpt.commit(7, files[:1])
    synced = {ino for ino, _ in fsync_log}
    assert os.stat(ckpt_root).st_ino in synced and os.stat(ckpt_root.parent).st_ino in synced


def test_commit_with_hash(setup):
    ckpt, _, _, files = setup
    ack = Ack.from_bytes(open(ckpt.commit(7, files, hash=True), "rb").read(), "42", "preempt-0")
    assert ack.manifest[0].sha256 == hashlib.sha256(b"w" * 1000).hexdigest()


def test_commit_rewrites_the_ack_atomically(setup):
    ckpt, job_dir, _, files = setup
    ckpt.commit(7, files)
    first = os.stat(job_dir / "ack" / "n2.3.json").st_ino
    ckpt.commit(8, files)
    assert os.stat(job_dir / "ack" / "n2.3.json").st_ino != first  # replaced, not rewritten in place
    assert Ack.from_bytes((job_dir / "ack" / "n2.3.json").read_bytes(), "42", "preempt-0").step == 8


def test_commit_empty_manifest_is_allowed(setup):
    ckpt, _, _, _ = setup
    assert Ack.from_bytes(open(ckpt.commit(0, []), "rb").read(), "42", "preempt-0").manifest == ()


def test_commit_rejects_missing_file(setup):
    ckpt, job_dir, _, files = setup
    with pytest.raises(NotFound, match="nope.pt"):
        ckpt.commit(7, [files[0], files[0].parent / "nope.pt"])
    assert not (job_dir / "ack").exists()


def test_commit_rejects_directory_and_bad_step(setup):
    ckpt, _, ckpt_root, files = setup
    with pytest.raises(BadValueError, match="not a regular file"):
        ckpt.commit(7, [ckpt_root])
    with pytest.raises(BadValueError, match="'7'"):
        ckpt.commit("7", files)
    with pytest.raises(BadValueError, match="-1"):
        ckpt.commit(-1, files)
    with pytest.raises(BadValueError, match="not under the checkpoint root"):
        ckpt.commit(7, files, root=str(ckpt_root / "step-7"))
    with pytest.raises(BadValueError, match="list of paths"):
        ckpt.commit(7, str(files[0]))


def test_commit_outside_slurm_snap_is_a_usage_error(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(UsageError, match="SLURM_SNAP_BARRIER_DIR"):
        Checkpointer(env={"SLURM_JOB_ID": "5"}).commit(1, [tmp_path / "f"])
