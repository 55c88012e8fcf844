"""wait_for_release: prompt wake-up on the release file, timeouts, termination."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from signal_delivery import deliver

from slurm_snap.client import Checkpointer
from slurm_snap.watch import wait_for_path
from slurm_snap.errors import BadValueError


@pytest.fixture(autouse=True)
def restore_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def later(seconds, action):
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("use_inotify", [True, False], ids=["inotify", "poll"])
@pytest.mark.parametrize("release_dir_exists", [True, False], ids=["dir-exists", "dir-created-later"])
def test_wakes_promptly_when_release_appears(tmp_path, use_inotify, release_dir_exists):
    job_dir = tmp_path / "9"
    job_dir.mkdir()
    if release_dir_exists:
        (job_dir / "release").mkdir()
    ckpt = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="9").install()
    deliver(signal.SIGUSR1, ckpt)
    assert ckpt.should_checkpoint()

    def release():
        (job_dir / "release").mkdir(exist_ok=True)
        (job_dir / "release" / "preempt-0").write_text("")

    thread = later(0.3, release)
    start = time.monotonic()
    assert ckpt.wait_for_release(timeout=20) is True
    elapsed = time.monotonic() - start
    thread.join()
    # The poll is capped at 50 ms and inotify is faster; the rest is slack for a busy machine.
    assert 0.25 <= elapsed < 0.3 + 0.3, elapsed
    assert ckpt.should_checkpoint() is False  # served: training continues


def test_times_out(tmp_path):
    ckpt = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="9")
    start = time.monotonic()
    assert ckpt.wait_for_release(timeout=0.3) is False
    assert 0.3 <= time.monotonic() - start < 0.9


def test_returns_promptly_on_termination(tmp_path):
    ckpt = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="9").install()
    deliver(signal.SIGUSR1, ckpt)
    assert ckpt.should_checkpoint()
    # From another thread, as Slurm would: the main thread is blocked waiting.
    later(0.2, lambda: os.kill(os.getpid(), signal.SIGTERM))
    start = time.monotonic()
    assert ckpt.wait_for_release(timeout=20) is False
    assert time.monotonic() - start < 0.2 + 0.3
    assert ckpt.terminating is True


def test_already_released_returns_at_once(tmp_path):
    (tmp_path / "9" / "release").mkdir(parents=True)
    (tmp_path / "9" / "release" / "od-1").touch()
    start = time.monotonic()
    assert wait_for_path(str(tmp_path / "9" / "release" / "od-1"), 5) is True
    assert time.monotonic() - start < 0.2


def test_no_inotify_fd_leak(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        wait_for_path(str(tmp_path / "x" / "y"), 0.001)
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("timeout", [-1, "5", None, True])
def test_rejects_bad_timeout(tmp_path, timeout):
    with pytest.raises(BadValueError, match="release timeout"):
        Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="9").wait_for_release(timeout)


def test_inotify_wakes_before_the_poll_would(tmp_path):
    target = tmp_path / "release" / "e1"
    (tmp_path / "release").mkdir()
    # Polls would look at ~0.51 s and ~1.02 s; only inotify explains a wake-up near 0.6 s.
    later(0.6, lambda: target.write_text(""))
    start = time.monotonic()
    assert wait_for_path(str(target), 10, poll_cap=10) is True
    assert 0.59 <= time.monotonic() - start < 0.9
