"""A drill's outcome: judged from what the program did, then recorded.

`verdict` is pure (the program's run result, the set's checkpoint step, the
deadline -> passed and why); `record` closes the restore test and moves the
set. Only a drill that finished records: one abandoned for our own reasons
(setup, network, an interruption) closes its test without touching the set.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field

from ..clock import utcnow
from .. import states as S
from .runner import RunResult


@dataclass
class Outcome:
    set_id: int
    job_id: int
    test_id: int
    passed: bool
    reason: str
    first_step: int | None = None
    time_to_first_step: float | None = None
    namespace: str = ""
    restore_map: dict = field(default_factory=dict)
    kept: bool = False
    cleanup_errors: list = field(default_factory=list)
    slurm_job_id: int | None = None
    pending: bool = False   # submitted with --no-wait: no verdict yet
    nodes: list = field(default_factory=list)    # placed drills: where the ranks ran
    moved: list = field(default_factory=list)    # placed drills: one line per part brought


def verdict(result: RunResult, checkpoint_step: int | None, deadline: float) -> tuple[bool, str]:
    if not result.started:
        return False, result.error or "the command did not start"
    if result.first_step is not None:
        if checkpoint_step is not None and result.first_step < checkpoint_step:
            return False, (f"resumed at step {result.first_step}, before the set's checkpoint step "
                           f"{checkpoint_step}: the program did not resume from the snapshot")
        return True, ""
    tail = _tail(result.stderr_tail)
    if result.error:
        return False, result.error + tail
    if result.timed_out:
        return False, f"deadline: no first step within {deadline:g} s" + tail
    status = result.exit_status
    if status == 0:
        return False, "exited with status 0 without reporting a first step (SLURM_SNAP_FIRST_STEP <step>)" + tail
    if status is not None and status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = str(-status)
        return False, f"killed by {name} before the first step" + tail
    return False, f"exit status {status} before the first step" + tail


def _tail(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()][-3:]
    return f"; stderr: {' | '.join(lines)[-600:]}" if lines else ""


def record(inventory, out: Outcome) -> None:
    """The drill's test row closed with its verdict, and the set's state from
    it: PASSED -> VERIFIED, FAILED -> FAILED_RESTORE (a set that moved on
    while the drill ran keeps its state); one event either way."""
    set_id, job_id = out.set_id, out.job_id
    with inventory.session() as repo:
        repo.finish_restore_test(out.test_id, passed=out.passed, first_step=out.first_step,
                                 time_to_first_step=out.time_to_first_step, reason=out.reason,
                                 slurm_job_id=out.slurm_job_id)
        st = repo.get_set(set_id)
        if st.state not in S.RESTORABLE:
            # Pruned (or otherwise moved on) while we ran: record the test only.
            repo.event("restore_test", f"restore test {out.test_id}: set is {st.state} now; state unchanged",
                       job_id=job_id, set_id=set_id, level="warning")
        elif out.passed:
            # verified_at is the latest passing drill; a reason left by an
            # earlier failed drill no longer applies, any other reason does.
            reason = "" if st.reason.startswith("restore test ") else st.reason
            repo.transition(set_id, S.VERIFIED, verified_at=utcnow(), reason=reason)
        else:
            # A failed drill revokes the verification: RPO must not count this set.
            repo.transition(set_id, S.FAILED_RESTORE, verified_at=None,
                            reason=f"restore test {out.test_id}: {out.reason}"[:4000])
        msg = (f"restore test {out.test_id} of set {set_id}: "
               + (f"PASSED, first step {out.first_step} after {out.time_to_first_step:.2f} s"
                  if out.passed else f"FAILED: {out.reason}"))
        if out.cleanup_errors:
            msg += f"; cleanup left: {'; '.join(out.cleanup_errors)}"
        repo.event("restore_test", msg, job_id=job_id, set_id=set_id,
                   level="info" if out.passed and not out.cleanup_errors else "warning")
