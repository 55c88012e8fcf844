"""One pass of a node's agent: every pass of PASSES in order, then exit.

The node's side of "nothing lost, nothing stuck": what the node did while
the service or the database was away reaches the inventory when it answers
again, without a person. Started three ways, all running this one pass:
  - the shipped systemd timer (etc/slurm-snap-node-agent.timer, every 30 s
    and at boot: the case of a node rebooted with an undelivered spool);
  - every slurm-snap hook on the node, on its way out, when the spool holds
    something (kick(): one scandir when it is empty, ~10 us);
  - on the dev cluster, which has no systemd, a loop per node that
    scripts/dev-cluster starts and stops by PID (`node-agent --loop`), the
    timer's stand-in.
One pass at a time per node (flock on the spool's agent.lock).

Backoff: a pass that finds the service away stops there (the next entries
would only wait out the same timeout) and the next pass may try only after
5 s, doubling to at most 60 s, each with +-20% jitter so a cluster's nodes
do not all come back in the same second; the first pass that gets through
resets it. `--now` (and a hook that just reached the service) ignores it.

The extension point: PASSES, a tuple of Pass(name, run, needs_service).
Each run(ctx) returns a PassResult; a pass that finds the service away says
so in `away`, and the passes after it that need the service are skipped in
that pass. Today: "deliver-spool". Node tasks (prune's deletes, partner
copies: slurm_snap/nodetasks, `slurm-snap node-tasks`) are not a pass here:
one of theirs may last minutes (a copy streams for up to [restore]
partner_budget) and a delivery, which a requeued run's Prolog waits for,
must never wait behind it under this pass's lock; they have a timer of their
own (etc/slurm-snap-node-tasks.timer; docs/design.md, "Who runs what where").
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import subprocess
import sys
import time
from typing import Callable

from ..errors import BadValueError, SnapError
from ..spool import has_entries
from ..spool.outbox import Outbox
from ..spool.records import AgentState

log = logging.getLogger(__name__)

BACKOFF_FIRST = 5.0
BACKOFF_MAX = 60.0
JITTER = 0.2


@dataclasses.dataclass(frozen=True)
class PassResult:
    name: str
    done: int = 0                   # items handled (entries delivered, tasks done)
    left: int = 0                   # items still waiting after this pass
    away: str = ""                  # the service (or its database) did not answer: why
    lines: tuple[str, ...] = ()     # what was done, one line each
    errors: tuple[str, ...] = ()    # items refused (kept for a later pass, or set aside)


@dataclasses.dataclass
class AgentContext:
    cfg: object
    recorder: object
    clock: Callable[[], float] = time.time


@dataclasses.dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[AgentContext], PassResult]
    needs_service: bool = True


@dataclasses.dataclass(frozen=True)
class AgentReport:
    results: tuple[PassResult, ...] = ()
    skipped: str = ""               # why no pass ran (another holds the lock, backing off)
    state: AgentState = AgentState()

    @property
    def away(self) -> str:
        return next((r.away for r in self.results if r.away), "")


def deliver_spool(ctx: AgentContext) -> PassResult:
    """Deliver the spool's entries, oldest first; stop at the first one the
    service could not take because it (or its database) is away."""
    from ..protocol.preempt import away

    outbox = Outbox.of(ctx.cfg).prepare()
    outbox.ensure_reserve()
    done, lines, errors = 0, [], []
    pending = list(outbox.pending())
    for i, (name, entry) in enumerate(pending):
        if isinstance(entry, BadValueError):
            outbox.reject(name, str(entry))
            errors.append(f"{name}: set aside in {outbox.rejected_dir}: {entry}")
            continue
        try:
            delivered = ctx.recorder.deliver(entry=entry)
        except SnapError as exc:
            if away(exc):
                return PassResult("deliver-spool", done=done, left=len(pending) - i, away=str(exc),
                                  lines=tuple(lines), errors=tuple(errors))
            # Refused for what it says (e.g. its job run is not recorded yet):
            # kept, and the later entries go on.
            errors.append(f"{name}: not taken: {exc}")
            continue
        outbox.remove(name)
        done += 1
        lines.append(f"{name}: {delivered.summary}")
    return PassResult("deliver-spool", done=done, left=len(outbox.names()), lines=tuple(lines),
                      errors=tuple(errors))


# The agent's passes, in order: the extension point (module docstring).
PASSES: tuple[Pass, ...] = (Pass("deliver-spool", deliver_spool),)


def backoff(failures: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before the next try after `failures` passes in a row found the service away."""
    base = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, failures - 1))
    return base * (1 - JITTER + 2 * JITTER * rand())


def default_recorder(cfg):
    from ..protocol.recorder import LocalRecorder, RemoteRecorder

    if cfg.via_service:
        # An answer may wait on the database: bounded, so a hung controller
        # cannot hold the node's one pass for [service] timeout.
        return RemoteRecorder(cfg, reply_timeout=120.0)
    from ..inventory.repository import Inventory

    return LocalRecorder(cfg, Inventory.from_config(cfg))


def run_once(cfg, *, force: bool = False, passes: tuple[Pass, ...] | None = None, recorder=None,
             clock: Callable[[], float] = time.time) -> AgentReport:
    """One pass: every pass of `passes` (PASSES) unless another pass holds
    the lock or the backoff says wait (`force` ignores it)."""
    outbox = Outbox.of(cfg)
    fd = outbox.lock()
    if fd is None:
        return AgentReport(skipped="another node-agent pass is running")
    try:
        state = outbox.read_state()
        now = clock()
        if not force and state.failures and now < state.next_try:
            return AgentReport(skipped=f"backing off: the service was away {state.failures} time(s) in a row, next "
                                       f"try in {state.next_try - now:.0f} s ({state.last_error[:200]})",
                               state=state)
        ctx = AgentContext(cfg=cfg, recorder=recorder if recorder is not None else _Lazy(cfg), clock=clock)
        results: list[PassResult] = []
        away = ""
        for p in PASSES if passes is None else passes:
            if away and p.needs_service:
                results.append(PassResult(p.name, away=f"skipped: {away}"))
                continue
            try:
                r = p.run(ctx)
            except SnapError as exc:   # e.g. the spool directory itself: say so, go on
                r = PassResult(p.name, errors=(str(exc),))
            results.append(r)
            away = away or r.away
        if away:
            failures = state.failures + 1
            state = AgentState(failures=failures, next_try=clock() + backoff(failures), last_error=away[:1000],
                               last_delivered=state.last_delivered)
        else:
            delivered = any(r.done for r in results)
            state = AgentState(failures=0, next_try=0.0, last_error="",
                               last_delivered=clock() if delivered else state.last_delivered)
        outbox.write_state(state)
        return AgentReport(results=tuple(results), state=state)
    finally:
        os.close(fd)


class _Lazy:
    """The recorder, made only when a pass uses it: a pass with nothing to
    deliver needs neither the ORM nor a connection."""

    def __init__(self, cfg):
        self._cfg, self._rec = cfg, None

    def __getattr__(self, name):
        if self._rec is None:
            self._rec = default_recorder(self._cfg)
        return getattr(self._rec, name)


def kick(cfg, *, reached_service: bool = False) -> bool:
    """Called by every hook on its way out: start one pass in the background
    when the spool holds something (nothing when it is empty: one scandir).
    `reached_service`: this hook just talked to the service (or is a
    requeued run's Prolog, whose resume point waits for the delivery), so the
    pass ignores the backoff. Never raises; True when a pass was started."""
    try:
        if not has_entries(cfg.spool.directory):
            return False
        argv = [sys.executable, "-m", "slurm_snap", "--config", cfg.path, "node-agent", "--quiet"]
        if reached_service:
            argv.append("--now")
        # Its own session: slurmd may end the hook's process group when the
        # hook exits; the pass is bounded by its own timeouts.
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         close_fds=True, start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        return True
    except Exception as exc:  # noqa: BLE001 - a hook's exit must never fail for this
        log.warning("node agent not started: %s", exc)
        return False
