"""The one failure policy every hook runs under.

A non-zero Prolog or Epilog drains the node, and a drained node costs a site
far more than a missing snapshot. So by default (`open`) a hook that fails
records why (stderr, which slurmd logs, the hook log file, and an inventory
event when the inventory is reachable) and exits 0. `closed` makes it exit 1,
for sites that prefer to fail the job over running it unprotected.

Every hook also has a time budget well under Slurm's timeouts: SIGALRM ends a
hook that overruns, under the same policy.
"""
from __future__ import annotations

import _signal  # the C module: `signal` imports enum, ~5 ms of every opted-in Prolog
import os
import sys
import time

from ..errors import SnapError, Timeout
from ..lazylog import getLogger
from ..plainjson import dumps

TYPE_CHECKING = False   # typing's import costs the hook path more than the hook's own work
if TYPE_CHECKING:
    from typing import Callable

log = getLogger("slurm_snap.hooks")


class OverBudget(BaseException):
    """BaseException so no `except Exception` inside a hook swallows it."""


# When the running hook must be done (time.monotonic()); None outside one.
_deadline: float | None = None


def remaining() -> float | None:
    """Seconds left of the running hook's budget: work that can end early
    with a recorded result (the Epilog's cut) plans with this, so the alarm
    never cuts it off with nothing recorded."""
    return None if _deadline is None else max(0.0, _deadline - time.monotonic())


def run_hook(name: str, body: Callable[[], str | None], *, cfg=None, job_id: int | None = None,
             node: str = "", record_failure: Callable[[str, str], None] | None = None) -> int:
    policy = cfg.hooks.failure_policy if cfg is not None else "open"
    budget = cfg.timeouts.hook_budget if cfg is not None else 25.0

    def on_alarm(_sig, _frame):
        raise OverBudget()

    global _deadline
    old = _signal.signal(_signal.SIGALRM, on_alarm)
    _deadline = time.monotonic() + budget
    _signal.setitimer(_signal.ITIMER_REAL, budget)
    try:
        summary = body()
        _log_line(cfg, name, job_id, node, "ok", summary or "")
        return 0
    except OverBudget:
        err: BaseException = Timeout(what=f"hook {name}", seconds=budget)
        detail = str(err)
    except SnapError as exc:
        err, detail = exc, str(exc)
    except Exception as exc:  # a bug: keep the traceback in the log, never drain silently
        err, detail = exc, f"internal error: {exc.__class__.__name__}: {exc}"
        import traceback

        _log_line(cfg, name, job_id, node, "traceback", traceback.format_exc())
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, old)
        _deadline = None

    print(f"slurm-snap: {name} job {job_id}: {detail} (policy {policy})", file=sys.stderr)
    _log_line(cfg, name, job_id, node, "failed", detail)
    if record_failure is not None:
        try:
            record_failure(name, detail)
        except Exception as exc:  # inventory down: the log line above is the record
            _log_line(cfg, name, job_id, node, "failed", f"could not record in inventory: {exc}")
    return 1 if policy == "closed" else 0


def _utc_stamp() -> str:
    """Now, as clock.utcnow().isoformat() writes it, without importing
    datetime (~2 ms of an opted-in Prolog, for this one line)."""
    us = time.time_ns() // 1000
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000))
    return f"{stamp}.{us % 1_000_000:06d}+00:00" if us % 1_000_000 else f"{stamp}+00:00"


def _log_line(cfg, name, job_id, node, status, message) -> None:
    """Append one JSON line to <log_dir>/hooks.log; never raises."""
    if cfg is None:
        return
    try:
        os.makedirs(cfg.paths.log_dir, mode=0o750, exist_ok=True)
        rec = {"at": _utc_stamp(), "hook": name, "job_id": job_id,
               "node": node, "status": status, "message": message, "pid": os.getpid()}
        fd = os.open(os.path.join(cfg.paths.log_dir, "hooks.log"),
                     os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            os.write(fd, (dumps(rec) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass
