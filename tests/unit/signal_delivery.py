"""Sending a signal to this very process and waiting until the client saw it.

The client receives its request signals (SIGUSR1, a configured one) in a
sigwait() thread that hands them to the main thread (client/signals.py), so
a handler runs a moment after kill() returns, not inside it. Tests wait for
the handler's effect instead of assuming it."""
from __future__ import annotations

import contextlib
import os
import signal
import time


@contextlib.contextmanager
def handlers_restored():
    """SIGUSR1's and SIGTERM's handlers put back after the block, and every
    Checkpointer appended to the list it gives uninstalled first."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    made = []
    try:
        yield made
    finally:
        for ckpt in made:
            ckpt._flag.uninstall()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _seen(flag) -> tuple:
    return (flag.requests, flag.sigterm_count, flag.owed, flag.terminating)


def deliver(sig, ckpt=None, timeout: float = 2.0) -> None:
    """kill(getpid(), sig); with `ckpt`, return once its handler ran."""
    before = _seen(ckpt._flag) if ckpt is not None else None
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + timeout
    while True:
        # Python runs handlers between bytecodes of the main thread.
        for _ in range(100):
            pass
        if ckpt is None or _seen(ckpt._flag) != before:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{signal.Signals(sig).name} not seen by the client within {timeout} s")
        time.sleep(0.001)
