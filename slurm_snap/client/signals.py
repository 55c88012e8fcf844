"""The signal side of the client: handlers that only record, nothing else.

Doing I/O (or taking locks) inside a signal handler can hang a training
process (Lightning #21406), so the handler sets attributes and returns; the
rank acts at its next step boundary. Python runs handlers in the main thread
between bytecodes, so plain attribute writes need no lock.
"""
from __future__ import annotations

import signal
import time

from slurm_snap.errors import BadValueError

_FORBIDDEN = {signal.SIGKILL, signal.SIGSTOP}


def parse_signal(value) -> signal.Signals:
    """'USR1', 'SIGUSR1', '10', 10 or a signal.Signals -> signal.Signals."""
    if isinstance(value, signal.Signals):
        sig = value
    else:
        text = str(value).strip().upper()
        try:
            if text.isdigit():
                sig = signal.Signals(int(text))
            else:
                sig = signal.Signals[text if text.startswith("SIG") else "SIG" + text]
        except (KeyError, ValueError):
            raise BadValueError(what="signal", value=value, why="not a signal name or number") from None
    if sig in _FORBIDDEN:
        raise BadValueError(what="signal", value=value, why="cannot be caught")
    return sig


class SignalFlag:
    """State set by the handlers.

    `pending`: a checkpoint was requested and not yet served.
    `terminating`: the process is being shut down; stop waiting, exit cleanly.
    SIGTERM is a checkpoint request only when it is in the request signals,
    nothing is pending and no preemption checkpoint was made yet (some
    clusters send only SIGTERM at preemption); otherwise it means terminate
    (the end-of-grace SIGTERM after a SIGUSR1-driven checkpoint).
    """

    def __init__(self, request_signals):
        self.request_signals = frozenset(parse_signal(s) for s in request_signals)
        # Counters, not a bool: a request arriving while another is being
        # served must not be lost when the first one is cleared.
        self.requests = 0
        self.served = 0
        self.signum: int | None = None
        self.signalled_at: float | None = None  # time.monotonic()
        self.terminating = False
        self.terminated_at: float | None = None
        self.sigterm_count = 0
        self.after_preempt = False
        self._previous: dict[int, object] = {}

    def handler(self, signum, frame) -> None:  # noqa: ARG002 - signal API
        now = time.monotonic()
        if signum == signal.SIGTERM:
            self.sigterm_count += 1
            if (signal.SIGTERM not in self.request_signals or self.sigterm_count > 1
                    or self.pending or self.after_preempt):
                self.terminating = True
                self.terminated_at = now
                return
        self.requests += 1
        self.signum = signum
        self.signalled_at = now

    @property
    def pending(self) -> bool:
        return self.requests > self.served

    def install(self) -> None:
        """Install on the request signals and SIGTERM (main thread only).
        The previous handlers are not chained to: a default SIGUSR1 action
        would kill the rank. They are kept for uninstall()."""
        for sig in sorted(self.request_signals | {signal.SIGTERM}):
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self.handler)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def clear(self, upto: int, after_preempt: bool) -> None:
        """Mark requests up to number `upto` as served (later ones stay pending)."""
        if after_preempt:
            self.after_preempt = True
        self.served = max(self.served, upto)
