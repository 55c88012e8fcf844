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

The all-reduce of a few integers costs about a millisecond with gloo on two
CPU cores (docs/benchmarks.md), several percent of a short step. So by
default it is *overlapped*: the exchange started at one step boundary is
waited for at the next, where it has long finished; every rank reads the
same result at the same step, one step after the flags were raised.
`overlap=False` waits at once (the decision is for this very step).

torch is imported only when a process group is in use, and only if the
program imported torch.distributed itself: the client stays stdlib-only.
A collective that fails or does not finish within `timeout` is not retried:
the rank says so (`failure`), carries on deciding alone, and its
acknowledgements say `agreement: "failed: ..."` so the set is not called
app-consistent.
"""
from __future__ import annotations

import datetime as dt
import sys
from dataclasses import dataclass

DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Decision:
    checkpoint: bool
    stop: bool
    # Lowest and highest step any rank reported in the same exchange; they
    # differ when the program calls decide() at different steps on different
    # ranks, which is no lockstep at all.
    step_min: int | None = None
    step_max: int | None = None


def distributed():
    """torch.distributed if the program imported it and initialised the
    default process group with more than one rank, else None."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


class StepAgreement:
    """MAX all-reduce of each rank's flags over a process group."""

    def __init__(self, group=None, *, timeout: float = DEFAULT_TIMEOUT, overlap: bool = True):
        self._dist = distributed()
        if self._dist is None:
            raise RuntimeError("no torch.distributed process group with more than one rank")
        import torch

        self._torch = torch
        self._group = group
        self._device = "cpu"
        if group is None:
            # A CUDA-only backend (NCCL) cannot reduce CPU tensors: use a
            # device tensor there rather than a second group that every rank
            # would have to create at the same moment.
            backend = str(self._dist.get_backend()).lower()
            if "nccl" in backend:
                self._device = f"cuda:{torch.cuda.current_device()}"
        self.timeout = float(timeout)
        self.overlap = overlap
        self.world_size = self._dist.get_world_size(group)
        self.rank = self._dist.get_rank(group)
        self._work = None
        self._tensor = None
        self.failure: str = ""
        self.exchanges = 0

    @property
    def failed(self) -> bool:
        return bool(self.failure)

    def send(self, request: bool, terminate: bool, step: int) -> None:
        """Start this boundary's exchange (every rank starts one per boundary)."""
        if self.failed:
            return
        try:
            t = self._torch.tensor([int(request), int(terminate), step, -step], dtype=self._torch.int64,
                                   device=self._device)
            self._work = self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self._group, async_op=True)
            self._tensor = t
        except Exception as exc:  # noqa: BLE001 - any failure of the collective ends the agreement
            self._fail(exc)

    def collect(self) -> Decision | None:
        """Wait (at most `timeout`) for the exchange in flight; the job's
        decision, or None when none was in flight or the collective failed
        (then `failure` says why and the agreement is over)."""
        work, tensor, self._work, self._tensor = self._work, self._tensor, None, None
        if work is None or self.failed:
            return None
        try:
            work.wait(timeout=dt.timedelta(seconds=self.timeout))
            request, terminate, high, neg_low = (int(x) for x in tensor.tolist())
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
            return None
        self.exchanges += 1
        return Decision(checkpoint=bool(request), stop=bool(terminate), step_min=-neg_low, step_max=high)

    def _fail(self, exc: BaseException) -> None:
        self._work = self._tensor = None
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.failure = f"failed: {exc.__class__.__name__}: {text}"[:200]

    def close(self) -> None:
        """Finish the exchange still in flight (every rank started it), so the
        program may destroy its process group."""
        self.collect()
