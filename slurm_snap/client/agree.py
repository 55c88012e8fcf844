"""One decision for every rank of a lockstep job, at one point of the step.

A data-parallel job's ranks hold one model: if one rank checkpoints at step 7
and another at step 8 the checkpoints are two points, and a rank that sees
the signal a step later than its peers enters the next step's all-reduce
while they wait for the release, so nobody moves again. The field's answer
(Megatron's dist_signal_handler all-gathers every rank's flag after each
iteration; NeMo broadcasts rank 0's; NVIDIA's resiliency examples all-reduce
with MAX; SCR broadcasts rank 0's halt check) is that the signal handler only
sets a flag and the ranks agree at a fixed point of the step. Here: one MAX
all-reduce of (request, terminate, step, -step).

The all-reduce of a few integers is not free: with gloo on this project's
2-core machines about 0.7 ms, most of it the caller's own work to issue it
(docs/benchmarks.md), over a percent of a 50 ms step. So by default it is
*overlapped* and *paced*: the exchange is issued without waiting and read at
the boundary where the next one is issued, and every rank proposes how many
step boundaries apart exchanges may be so that they cost at most
`budget` (0.2%) of its measured step time; the MAX of the proposals, part of
each exchange's result, is the pace every rank uses from then on. Every rank
therefore reads the same decision at the same step: within `pace` steps of
the signal (1 for long steps, a few for very short ones). The exchange runs
on a gloo process group of its own (created collectively at the first
decision), so it never mixes with the training's collectives and works
beside NCCL without touching the GPU. `overlap=False` exchanges at every
boundary and waits at once (the decision is for this very step).

torch is imported only when a process group is in use, and only if the
program imported torch.distributed itself: the client stays stdlib-only.
A collective that fails or does not finish within `timeout` is not retried:
the rank says so (`failure`), carries on deciding alone, and its
acknowledgements say `agreement: "failed: ..."` so the set is not called
app-consistent.

The exchange also carries rank 0's verdict on a checkpoint request (VERDICT_GO
or VERDICT_STRAY; 0 from every other rank, so the MAX is rank 0's): whether a
slurm-snap request (request.json) or a preemption (Slurm's PreemptTime) goes
with the signal. A stray signal (a user's `scancel -s USR1`, a --signal
warning) then costs every rank nothing but the exchange it rides on.
"""
from __future__ import annotations

import datetime as dt
import math
import sys
import time
from dataclasses import dataclass

DEFAULT_TIMEOUT = 120.0
# Rank 0's verdict on a checkpoint request, carried in the exchange.
VERDICT_NONE = 0     # not yet given (rank 0 has not seen the request)
VERDICT_GO = 1       # a request or a preemption goes with it (or Slurm could not be asked)
VERDICT_STRAY = 2    # neither: the ranks go on
# At most this share of a step goes to exchanging (the target is 1%).
DEFAULT_BUDGET = 0.002
MAX_PACE = 16


@dataclass(frozen=True)
class Decision:
    checkpoint: bool
    stop: bool
    # Lowest and highest step any rank reported in the same exchange; they
    # differ when the program calls decide() at different steps on different
    # ranks, which is no lockstep at all.
    step_min: int | None = None
    step_max: int | None = None
    pace: int = 1
    verdict: int = VERDICT_NONE


def distributed():
    """torch.distributed if the program imported it and initialised the
    default process group with more than one rank, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


class StepAgreement:
    """MAX all-reduce of each rank's flags over a process group of its own."""

    def __init__(self, group=None, *, timeout: float = DEFAULT_TIMEOUT, overlap: bool = True,
                 budget: float = DEFAULT_BUDGET, max_pace: int = MAX_PACE):
        self._dist = distributed()
        if self._dist is None:
            raise RuntimeError("no torch.distributed process group with more than one rank")
        import torch

        self._torch = torch
        # Collective: every rank creates it at its first decision, the same
        # point of the same step.
        self._group = group if group is not None else self._dist.new_group(backend="gloo")
        self.timeout = float(timeout)
        self.overlap = overlap
        self.budget = float(budget)
        self.max_pace = max(1, int(max_pace))
        self.world_size = self._dist.get_world_size(self._group)
        self.rank = self._dist.get_rank(self._group)
        self.failure: str = ""
        self.exchanges = 0
        self.pace = 1                     # boundaries between exchanges, agreed
        self._work = None
        self._tensor = None
        self._boundary = 0                # boundaries since the last exchange was sent
        self._last_boundary: float | None = None
        self._step_time: float | None = None   # smoothed time between boundaries
        self._cost: float | None = None        # smoothed time this rank spends exchanging
        self._pending_cost = 0.0               # the send's share of the exchange in flight

    @property
    def failed(self) -> bool:
        return bool(self.failure)

    def due(self) -> bool:
        """Count a boundary; True when this one exchanges (the same boundaries
        on every rank: the pace is agreed)."""
        now = time.perf_counter()
        if self._last_boundary is not None:
            gap = now - self._last_boundary
            self._step_time = gap if self._step_time is None else 0.9 * self._step_time + 0.1 * gap
        self._last_boundary = now
        if not self.overlap:
            return True
        self._boundary += 1
        if self._work is None or self._boundary >= self.pace:
            self._boundary = 0
            return True
        return False

    def _proposal(self) -> int:
        if not self.overlap or self._cost is None or not self._step_time:
            return 1
        per_step = self.budget * self._step_time
        return max(1, min(self.max_pace, math.ceil(self._cost / per_step))) if per_step > 0 else self.max_pace

    def send(self, request: bool, terminate: bool, step: int, verdict: int = VERDICT_NONE) -> None:
        """Start this exchange (every rank starts one at the same boundary)."""
        if self.failed:
            return
        t0 = time.perf_counter()
        try:
            t = self._torch.tensor([int(request), int(terminate), step, -step, self._proposal(), int(verdict)],
                                   dtype=self._torch.int64)
            self._work = self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self._group, async_op=True)
            self._tensor = t
        except Exception as exc:  # noqa: BLE001 - any failure of the collective ends the agreement
            self._fail(exc)
        self._spent(t0)

    def collect(self) -> Decision | None:
        """Wait (at most `timeout`) for the exchange in flight; the job's
        decision, or None when none was in flight or the collective failed
        (then `failure` says why and the agreement is over)."""
        work, tensor, self._work, self._tensor = self._work, self._tensor, None, None
        if work is None or self.failed:
            return None
        t0 = time.perf_counter()
        try:
            work.wait(timeout=dt.timedelta(seconds=self.timeout))
            request, terminate, high, neg_low, pace, verdict = (int(x) for x in tensor.tolist())
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return None
        self._spent(t0)
        self.exchanges += 1
        self.pace = max(1, min(self.max_pace, pace))
        return Decision(checkpoint=bool(request), stop=bool(terminate), step_min=-neg_low, step_max=high,
                        pace=self.pace, verdict=verdict)

    def _spent(self, t0: float) -> None:
        cost = time.perf_counter() - t0
        # send and collect of one exchange both count: sum them per exchange.
        if self._work is not None:       # a send: start this exchange's cost
            self._pending_cost = cost
            return
        total = self._pending_cost + cost
        self._cost = total if self._cost is None else 0.8 * self._cost + 0.2 * total

    def _fail(self, exc: BaseException) -> None:
        self._work = self._tensor = None
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.give_up(f"failed: {exc.__class__.__name__}: {text}")

    def give_up(self, why: str) -> None:
        """End the agreement (every rank does so at the same exchange when
        `why` comes from an exchange's result): no more collectives."""
        self.failure = why[:200]

    def close(self) -> None:
        """Finish the exchange still in flight (every rank started it), so the
        program may destroy its process groups."""
        self.collect()
