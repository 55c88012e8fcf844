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
from slurm_snap.client.signals import parse_signal
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


def test_handlers_chain_to_the_ones_installed_before_them():
    """A framework's or the user's own handler keeps running after ours."""
    seen = []
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append(("usr1", s)))
    signal.signal(signal.SIGTERM, lambda s, f: seen.append(("term", s)))
    ckpt = Checkpointer(env={}).install()
    deliver(signal.SIGUSR1, ckpt)
    assert ckpt.should_checkpoint() and seen == [("usr1", signal.SIGUSR1)]
    deliver(signal.SIGTERM, ckpt)
    assert ckpt.terminating and seen[-1] == ("term", signal.SIGTERM)


def test_no_chaining_when_asked_and_never_to_the_default_action():
    seen = []
    signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    ckpt = Checkpointer(env={}, chain=False).install()
    deliver(signal.SIGUSR1, ckpt)
    assert ckpt.should_checkpoint() and seen == []
    ckpt.uninstall()
    # SIG_DFL before us: chaining would mean dying of SIGUSR1. We live.
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    ckpt = Checkpointer(env={}).install()
    deliver(signal.SIGUSR1, ckpt)
    assert ckpt.should_checkpoint()


def test_request_signals_are_blocked_for_children_and_the_mask_is_put_back():
    """Children inherit the blocked mask (fork and exec), so a SIGUSR1 sent to
    the whole task cannot kill a DataLoader worker or a helper; SIGTERM stays
    deliverable. uninstall() restores the mask it found."""
    import subprocess
    import sys

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    ckpt = Checkpointer(env={}).install()
    assert signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    child = subprocess.run([sys.executable, "-c",
                            "import os, signal, time; os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.1); "
                            "print(signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, []))"],
                           capture_output=True, text=True, timeout=30)
    assert (child.returncode, child.stdout.strip()) == (0, "True"), child.stderr
    ckpt.uninstall()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_a_request_pending_at_uninstall_is_counted_not_fatal():
    ckpt = Checkpointer(env={}).install()
    waiter = ckpt._flag._waiter
    # Stop the waiter first so the signal stays pending at the process level.
    ckpt._flag._stopping = True
    signal.pthread_kill(waiter.ident, signal.SIGUSR1)
    waiter.join(5)
    ckpt._flag._waiter = None
    os.kill(os.getpid(), signal.SIGUSR1)     # pending: blocked everywhere, nobody waits
    ckpt.uninstall()                          # takes it before the default action returns
    assert ckpt._flag.requests == 1


def test_late_copy_after_joining_a_peers_checkpoint_is_not_a_new_request(tmp_path):
    """The agreement made this rank checkpoint before its own SIGUSR1 came:
    that copy, arriving before the release, is the same request; a SIGTERM
    meanwhile is the end, not a checkpoint request."""
    ckpt = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="7").install()
    flag = ckpt._flag
    flag.owed, flag.serving = 1, True        # what _apply() sets for a rank asked by its peers
    deliver(signal.SIGUSR1, ckpt)
    assert (flag.requests, flag.owed, flag.pending) == (0, 0, False)
    deliver(signal.SIGTERM, ckpt)
    assert ckpt.terminating


def test_acknowledgement_says_when_the_signal_reached_the_rank(tmp_path):
    """The observed request time (issue 16): the moment this rank's signal
    arrived, not a guess from Slurm's PreemptTime."""
    from datetime import datetime, timezone

    from slurm_snap.jobrecords import Ack

    ckpt = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="7").install()
    f = tmp_path / "w.pt"
    f.write_bytes(b"w")
    before = datetime.now(timezone.utc)
    deliver(signal.SIGUSR1, ckpt)
    after = datetime.now(timezone.utc)
    assert ckpt.should_checkpoint()
    ack = Ack.from_bytes(open(ckpt.commit(3, [f]), "rb").read(), "7", "preempt-0")
    assert before <= ack.signalled_at <= after
    # A rank that joined its peers' checkpoint without a signal says so: null.
    joined = Checkpointer(env={}, barrier_dir=str(tmp_path), job_id="7", rank=1)
    ack = Ack.from_bytes(open(joined.commit(3, [f]), "rb").read(), "7", "preempt-0")
    assert ack.signalled_at is None
