"""The client's signal handlers: they only record, and SIGTERM is a request
first and a termination after that."""
from __future__ import annotations

import builtins
import os
import signal
import time

import pytest
import signal_delivery

from slurm_snap import client
from slurm_snap.client import parse_signal
from slurm_snap.errors import BadValueError

HANDLED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


_current: list = []


def Checkpointer(*args, **kwargs):
    """The client's Checkpointer, remembered so deliver() knows whose handler to wait for."""
    ckpt = client.Checkpointer(*args, **kwargs)
    _current.append(ckpt)
    return ckpt


@pytest.fixture(autouse=True)
def restore_handlers():
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}
    yield
    while _current:
        _current.pop()._flag.uninstall()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def deliver(sig, ckpt=None):
    signal_delivery.deliver(sig, ckpt or _current[-1])


def test_handler_only_sets_a_flag_without_io(monkeypatch):
    ckpt = Checkpointer(env={}).install()
    calls = []
    for module, name in ((builtins, "open"), (os, "open"), (os, "write"), (os, "fsync"), (builtins, "print")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _r=real, **k: (calls.append(_n), _r(*a, **k))[1])
    before = time.monotonic()
    deliver(signal.SIGUSR1)
    after = time.monotonic()
    monkeypatch.undo()
    assert calls == []
    name, when = ckpt.last_signal
    assert name == "SIGUSR1" and before <= when <= after
    assert ckpt.should_checkpoint() is True
    assert ckpt.terminating is False


def test_install_replaces_and_uninstall_restores():
    previous = signal.getsignal(signal.SIGUSR1)
    ckpt = Checkpointer(env={}).install()
    assert signal.getsignal(signal.SIGUSR1) == ckpt._flag.handler
    assert signal.getsignal(signal.SIGTERM) == ckpt._flag.handler
    ckpt.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == previous


def test_no_request_without_signal():
    ckpt = Checkpointer(env={}).install()
    assert ckpt.should_checkpoint() is False
    assert ckpt.last_signal is None


def test_first_sigterm_requests_second_terminates():
    ckpt = Checkpointer(env={}).install()
    deliver(signal.SIGTERM)
    assert ckpt.terminating is False
    assert ckpt.last_signal[0] == "SIGTERM"
    deliver(signal.SIGTERM)
    assert ckpt.terminating is True
    # No checkpoint may start once termination began.
    assert ckpt.should_checkpoint() is False


def test_sigterm_while_usr1_request_pending_means_terminate():
    ckpt = Checkpointer(env={}).install()
    deliver(signal.SIGUSR1)
    assert ckpt.should_checkpoint() is True
    deliver(signal.SIGTERM)
    assert ckpt.terminating is True


def test_sigterm_after_served_preemption_checkpoint_means_terminate(tmp_path):
    ckpt = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="7").install()
    deliver(signal.SIGUSR1)
    assert ckpt.should_checkpoint()
    (tmp_path / "7" / "release").mkdir(parents=True)
    (tmp_path / "7" / "release" / "preempt-0").touch()
    assert ckpt.wait_for_release(1) is True
    assert ckpt.should_checkpoint() is False  # served
    deliver(signal.SIGTERM)
    assert ckpt.terminating is True


def test_request_arriving_while_serving_is_not_lost(tmp_path):
    ckpt = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="7").install()
    (tmp_path / "7" / "release").mkdir(parents=True)
    (tmp_path / "7" / "release" / "preempt-0").touch()
    deliver(signal.SIGUSR1)
    assert ckpt.should_checkpoint()
    deliver(signal.SIGUSR1)  # a second request during the checkpoint
    assert ckpt.wait_for_release(1)
    assert ckpt.should_checkpoint() is True


def test_only_sigusr1_configured_makes_sigterm_terminate():
    ckpt = Checkpointer(signals=("USR1",), env={}).install()
    deliver(signal.SIGTERM)
    assert ckpt.terminating is True


def test_signal_from_environment():
    previous = signal.getsignal(signal.SIGUSR1)
    ckpt = Checkpointer(env={"SLURM_SNAP_SIGNAL": "USR2"}).install()
    assert signal.getsignal(signal.SIGUSR1) == previous
    deliver(signal.SIGUSR2)
    assert ckpt.should_checkpoint() and ckpt.last_signal[0] == "SIGUSR2"


@pytest.mark.parametrize("value,expected", [("USR1", signal.SIGUSR1), ("sigusr2", signal.SIGUSR2),
                                            ("15", signal.SIGTERM), (signal.SIGHUP, signal.SIGHUP)])
def test_parse_signal(value, expected):
    assert parse_signal(value) == expected


@pytest.mark.parametrize("value", ["USR9", "KILL", "9", "SIGSTOP", ""])
def test_parse_signal_rejects(value):
    with pytest.raises(BadValueError) as info:
        parse_signal(value)
    assert repr(value) in str(info.value)


def test_bad_signal_in_environment_is_named():
    with pytest.raises(BadValueError, match="'BOGUS'"):
        Checkpointer(env={"SLURM_SNAP_SIGNAL": "BOGUS"})
