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
    nodes: list = field(default_factory=list)    # drill jobs: where the ranks ran, by position
    moved: list = field(default_factory=list)    # placed drills: one line per part brought
    queued_seconds: float | None = None          # drill jobs: submission -> the program's start
    ran_on: str = ""                             # drill jobs: the node the program started on


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


@dataclass(frozen=True)
class NodeWord:
    """What a drill job's node reported (restore_node), as the verdict reads it."""
    node: str
    state: str
    error: str = ""
    blames_set: bool = False
    cleanup: str = ""
    cleanup_error: str = ""


def node_failure(nodes: list[NodeWord]) -> tuple[str, bool] | None:
    """Why the drill job's nodes could not run the program, and whether that
    is the set's fault (a snapshot the Prolog could not clone); None when
    every node made its clones. A node that never reported is no fault of
    the set (its Prolog did not run, or could not reach the service)."""
    failed = [n for n in nodes if n.state == S.NODE_FAILED]
    if failed:
        return "; ".join(n.error or f"the Prolog on {n.node} failed" for n in failed), any(n.blames_set for n in failed)
    silent = [n.node for n in nodes if n.state == S.NODE_PLANNED]
    if silent:
        return (f"the Prolog on {', '.join(silent)} never reported its clones (is the slurm-snap Prolog "
                "configured there, and the service reachable?)"), False
    return None


def left_on_nodes(nodes: list[NodeWord]) -> list[str]:
    """Cleanup errors: nodes whose Epilog did not say every clone is gone."""
    out = []
    for n in nodes:
        if n.cleanup != S.NODE_CLEANED and n.state != S.NODE_PLANNED:
            why = n.cleanup_error or "its Epilog never reported"
            out.append(f"clones on {n.node}: {why} (its Epilog or the node agent removes them)")
    return out


def judge_job(inventory, out: Outcome, result: RunResult, checkpoint_step: int | None, deadline: float) -> None:
    """A drill job's verdict into `out`: the nodes' reports first (a node
    that could not prepare decides; if not for the set's fault the drill is
    abandoned: errors.BackendError), then the program's result; the queue
    wait and the node it ran on; what the Epilogs left."""
    from .. import errors

    with inventory.session(readonly=True) as repo:
        rt = repo.restore_test(out.test_id)
        words = [NodeWord(node=n.node, state=n.state, error=n.error, blames_set=n.blames_set, cleanup=n.cleanup,
                          cleanup_error=n.cleanup_error) for n in repo.restore_nodes(out.test_id)]
        submitted = rt.submitted_at
    out.nodes = out.nodes or [w.node for w in words]
    out.cleanup_errors = out.cleanup_errors + left_on_nodes(words)
    failure = node_failure(words)
    if failure is not None:
        why, blames = failure
        if not blames:
            raise errors.BackendError(backend="restore drill", why=why)
        out.passed, out.reason = False, why
        return
    out.passed, out.reason = verdict(result, checkpoint_step, deadline)
    out.first_step, out.time_to_first_step = result.first_step, result.time_to_first_step
    out.ran_on = result.host
    if submitted is not None and result.started_at is not None:
        out.queued_seconds = max(0.0, round(result.started_at - submitted.timestamp(), 6))


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
                                 slurm_job_id=out.slurm_job_id, queued_seconds=out.queued_seconds,
                                 ran_on=out.ran_on)
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
                  + (f" on {out.ran_on}" if out.ran_on else "")
                  + (f" (queued {out.queued_seconds:.1f} s)" if out.queued_seconds is not None else "")
                  if out.passed else f"FAILED: {out.reason}"))
        if out.cleanup_errors:
            msg += f"; cleanup left: {'; '.join(out.cleanup_errors)}"
        repo.event("restore_test", msg, job_id=job_id, set_id=set_id,
                   level="info" if out.passed and not out.cleanup_errors else "warning")
