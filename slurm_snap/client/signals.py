"""The signal side of the client: handlers that only record, nothing else.

Doing I/O (or taking locks) inside a signal handler can hang a training
process (Lightning #21406), so the handler sets attributes and returns; the
rank acts at its next step boundary. Python runs handlers in the main thread
between bytecodes, so plain attribute writes need no lock.

Slurm signals every process of a step, not only the rank: DataLoader
workers, a torchrun agent, helpers. A process that has no handler for
SIGUSR1 dies of it (its default action), and a DataLoader worker started with
`spawn` or `forkserver` starts with the default. So `install()` also
*blocks* the request signals in the rank's main thread and receives them in
a small thread with sigwait(): the blocked mask is inherited through fork and
exec, so every child the rank starts afterwards (spawned workers included)
holds the signal pending instead of dying of it. SIGTERM is never blocked:
children must still end when the job does.
"""
from __future__ import annotations

import _thread
import signal
import threading
import time
import weakref

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
    """State set by the handlers. `SignalFlag.installed` holds the installed
    ones (a process has one signal mask: tests put it back with them).

    `pending`: a checkpoint was requested and not yet served.
    `terminating`: the process is being shut down; stop waiting, exit cleanly.
    SIGTERM is a checkpoint request only when it is in the request signals,
    nothing is pending and no preemption checkpoint was made yet (some
    clusters send only SIGTERM at preemption); otherwise it means terminate
    (the end-of-grace SIGTERM after a SIGUSR1-driven checkpoint).

    `serving`: a checkpoint was decided and its release not yet seen.
    `owed`: this rank took part in a checkpoint its peers were asked for
    before its own copy of the signal arrived (lockstep jobs: the step
    agreement spreads one rank's request to all). That copy (SIGUSR1 or the
    configured signal, never SIGTERM), when it comes before the checkpoint's
    release, is the same request, not a new one.
    """

    def __init__(self, request_signals, *, chain: bool = True, shield_children: bool = True):
        self.request_signals = frozenset(parse_signal(s) for s in request_signals)
        self.chain = chain
        # A framework that stops at the first SIGTERM (Lightning) must not see
        # the one that asks for the checkpoint (sites that preempt with
        # SIGTERM only); it still sees the one that means terminate.
        self.hold_request_sigterm = False
        self.shield_children = shield_children
        # Counters, not a bool: a request arriving while another is being
        # served must not be lost when the first one is cleared.
        self.requests = 0
        self.served = 0
        self.owed = 0
        self.serving = False      # a checkpoint decided, not yet released
        self.signum: int | None = None
        self.signalled_at: float | None = None  # time.monotonic()
        self.signalled_wall: float | None = None  # time.time(), for acknowledgements
        self.terminating = False
        self.terminated_at: float | None = None
        self.sigterm_count = 0
        self.after_preempt = False
        self._previous: dict[int, object] = {}
        self._blocked: frozenset[int] = frozenset()   # blocked by us (unblocked by uninstall)
        self._shielded: frozenset[int] = frozenset()  # received by the sigwait thread
        self._waiter: threading.Thread | None = None
        self._stopping = False

    installed: "weakref.WeakSet[SignalFlag]" = weakref.WeakSet()

    def handler(self, signum, frame) -> None:
        if self.record(signum) and signum == signal.SIGTERM and self.hold_request_sigterm:
            return
        previous = self._previous.get(signum)
        # Chain to whatever was there before (a framework's or the user's own
        # handler); SIG_DFL/SIG_IGN are not callables and are not "called":
        # a default SIGUSR1 would kill the rank.
        if self.chain and callable(previous) and previous is not self.handler:
            previous(signum, frame)

    def record(self, signum) -> bool:
        """Note the signal; True when it asks for a checkpoint."""
        now = time.monotonic()
        if signum == signal.SIGTERM:
            self.sigterm_count += 1
            # While a checkpoint is being served a SIGTERM is the end, even on
            # a rank that joined its peers' checkpoint without a request of
            # its own (nothing pending there).
            if (signal.SIGTERM not in self.request_signals or self.sigterm_count > 1
                    or self.pending or self.after_preempt or self.serving):
                self.terminating = True
                self.terminated_at = now
                return False
        elif self.owed:
            # The late copy of a request already being served with the peers.
            self.owed -= 1
            return False
        self.requests += 1
        self.signum = signum
        self.signalled_at = now
        self.signalled_wall = time.time()
        return True

    @property
    def pending(self) -> bool:
        return self.requests > self.served

    def install(self) -> None:
        """Install on the request signals and SIGTERM (main thread only), keep
        the previous handlers for chaining and uninstall(), and shield the
        children (see the module's docstring)."""
        for sig in sorted(self.request_signals | {signal.SIGTERM}):
            if sig not in self._previous:
                self._previous[sig] = signal.signal(sig, self.handler)
        SignalFlag.installed.add(self)
        shielded = frozenset(self.request_signals - {signal.SIGTERM})
        if self.shield_children and shielded and self._waiter is None:
            already = signal.pthread_sigmask(signal.SIG_BLOCK, shielded)
            # A launcher shim (slurm_snap.client.launch) may have blocked them
            # already: they stay blocked after uninstall(), as found.
            self._blocked = frozenset(s for s in shielded if s not in already)
            self._shielded = shielded
            self._stopping = False
            # Started after blocking, so it inherits the mask sigwait needs.
            self._waiter = threading.Thread(target=self._wait_loop, args=(shielded,),
                                            name="slurm-snap-signals", daemon=True)
            self._waiter.start()

    def _wait_loop(self, signals: frozenset[int]) -> None:
        while True:
            sig = signal.sigwait(signals)
            if self._stopping:
                return
            # Run the handler where Python runs handlers: the main thread.
            _thread.interrupt_main(sig)

    def uninstall(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._stopping = True
            signal.pthread_kill(waiter.ident, min(self._shielded))
            waiter.join(timeout=5)
        if self._blocked:
            # Requests still pending at the process level are ours: take them
            # now, before the old handlers (perhaps the default: death) return.
            while (info := signal.sigtimedwait(self._blocked, 0)) is not None:
                self.record(info.si_signo)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self._blocked)
            self._blocked = frozenset()
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
        SignalFlag.installed.discard(self)

    def clear(self, upto: int, after_preempt: bool) -> None:
        """Mark requests up to number `upto` as served (later ones stay pending)."""
        if after_preempt:
            self.after_preempt = True
        self.served = max(self.served, upto)
        self.owed = 0
        self.serving = False
