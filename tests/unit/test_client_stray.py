"""Issue 30 item 4: a checkpoint signal that no slurm-snap request and no
preemption goes with costs a rank nothing: it is ignored at the next step
boundary. A request (current request.json) or Slurm showing a PreemptTime
makes it a checkpoint, and so does a Slurm that cannot be asked (a real
preemption must never be missed). SIGTERM is never filtered. Slurm here is
a stand-in `scontrol` printing what `scontrol show job -o` prints; the dev
cluster's benchmark (benchmarks/stray.py) sends the real signal."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import signal_delivery

from slurm_snap import client
from slurm_snap.client import reason

JOB = "7"


@pytest.fixture(autouse=True)
def restore_handlers():
    with signal_delivery.handlers_restored() as made:
        yield made


def slurm_says(tmp_path, monkeypatch, preempt_time: str | None) -> None:
    """An scontrol on SLURM_SNAP_SLURM_BIN answering for job 7; None: no scontrol works."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    if preempt_time is None:
        script.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
    else:
        script.write_text(f"#!/bin/sh\necho 'JobId={JOB} JobState=RUNNING PreemptTime={preempt_time} Requeue=1'\n")
    script.chmod(0o755)
    monkeypatch.setenv("SLURM_SNAP_SLURM_BIN", str(bin_dir))


def rank(tmp_path, made) -> client.Checkpointer:
    barrier = tmp_path / "barrier"
    (barrier / JOB).mkdir(parents=True, exist_ok=True)
    ckpt = client.Checkpointer(barrier_dir=str(barrier), job_id=JOB, node="n1", rank=0, local_rank=0,
                               local_size=1, env={}).install()
    made.append(ckpt)
    return ckpt


def test_a_stray_signal_is_ignored_and_training_goes_on(tmp_path, monkeypatch, restore_handlers):
    slurm_says(tmp_path, monkeypatch, "None")
    ckpt = rank(tmp_path, restore_handlers)
    signal_delivery.deliver(signal.SIGUSR1, ckpt)
    t0 = time.monotonic()
    assert ckpt.decide(1).checkpoint is False
    assert time.monotonic() - t0 < 2.0 and ckpt.ignored_signals == 1
    # nothing left pending: the next boundaries are ordinary steps
    assert [ckpt.decide(s).checkpoint for s in (2, 3)] == [False, False] and ckpt.ignored_signals == 1
    assert not os.path.exists(tmp_path / "barrier" / JOB / "ack")


def test_a_preemption_or_a_request_makes_it_a_checkpoint(tmp_path, monkeypatch, restore_handlers):
    slurm_says(tmp_path, monkeypatch, "2026-12-03T10:00:00")
    ckpt = rank(tmp_path, restore_handlers)
    signal_delivery.deliver(signal.SIGUSR1, ckpt)
    assert ckpt.decide(1).checkpoint is True and ckpt.ignored_signals == 0
    assert ckpt.epoch() == "preempt-0"


def test_a_current_request_needs_no_question_to_slurm(tmp_path, monkeypatch, restore_handlers):
    slurm_says(tmp_path, monkeypatch, "None")
    ckpt = rank(tmp_path, restore_handlers)
    (tmp_path / "barrier" / JOB / "request.json").write_text(json.dumps(
        {"job_id": JOB, "epoch": "od-3", "requested_at": time.time(), "deadline": time.time() + 60}))
    signal_delivery.deliver(signal.SIGUSR1, ckpt)
    assert ckpt.decide(1).checkpoint is True and ckpt.epoch() == "od-3"


def test_slurm_that_cannot_be_asked_is_no_reason_to_skip(tmp_path, monkeypatch, restore_handlers):
    slurm_says(tmp_path, monkeypatch, None)
    ckpt = rank(tmp_path, restore_handlers)
    assert reason.checkpoint_reason(ckpt.jobdir) == reason.UNKNOWN
    signal_delivery.deliver(signal.SIGUSR1, ckpt)
    assert ckpt.decide(1).checkpoint is True


def test_sigterm_is_never_filtered(tmp_path, monkeypatch, restore_handlers):
    slurm_says(tmp_path, monkeypatch, "None")
    ckpt = rank(tmp_path, restore_handlers)
    signal_delivery.deliver(signal.SIGTERM, ckpt)
    assert ckpt.decide(1).checkpoint is True and ckpt.ignored_signals == 0


def test_the_reason_is_asked_once_per_signal(tmp_path, monkeypatch, restore_handlers):
    calls = []
    real = reason.checkpoint_reason
    monkeypatch.setattr(reason, "checkpoint_reason", lambda jd, **kw: (calls.append(1), real(jd, **kw))[1])
    slurm_says(tmp_path, monkeypatch, "None")
    ckpt = rank(tmp_path, restore_handlers)
    signal_delivery.deliver(signal.SIGUSR1, ckpt)
    for s in range(1, 5):
        ckpt.decide(s)
    assert calls == [1]
    signal_delivery.deliver(signal.SIGUSR1, ckpt)
    ckpt.decide(5)
    assert calls == [1, 1] and ckpt.ignored_signals == 2
