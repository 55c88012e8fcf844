"""A preemption set's opening and its times, shared by the hooks' gateway
(protocol/recorder.py) and the delivery of a node's spool entry
(protocol/delivery.py): which run was preempted, the set opened once for
it, the request time the ranks observed, and when the nodes came back.
A job stopped before its time limit (--snapshot-before-timelimit) gets the
same kind of set, trigger "timelimit" (states.HOOK_TRIGGERS), under the
same epoch rule."""
from __future__ import annotations

import datetime as dt

from .. import states as S
from ..clock import aware
from ..errors import BadValueError, NotFound
from ..jobrecords import EarlyDecision, preempt_epoch

# Not host:pid: no single process owns a preemption set.
PREEMPT_OWNER = "slurm:preempt"


def as_time(t) -> dt.datetime | None:
    """Unix seconds (0: unknown) or a datetime, as an aware time."""
    if t is None or t == 0:
        return None
    if isinstance(t, dt.datetime):
        return aware(t)
    return dt.datetime.fromtimestamp(float(t), dt.timezone.utc)


def _wanted(run) -> str:
    c = (run.options or {}).get("consistency", S.WANT_APP)
    return c if c in S.WANTED else S.WANT_APP


def _deadline(cfg, now: dt.datetime) -> dt.datetime:
    # Every node's Epilog should have run well within this.
    return now + dt.timedelta(seconds=cfg.timeouts.hook_budget + cfg.timeouts.barrier)


def _preempted_run(repo, job_id: int, restart_count: int, preempt_time: dt.datetime | None):
    """The run that was preempted. Its hooks see SLURM_JOB_RESTART_COUNT
    already incremented, and a late Epilog may even run after the requeued
    run's Prolog recorded the next run: a run whose preemption set is still
    open wins, then a run that existed before the preemption."""
    run = repo.open_preempt_run(job_id, restart_count)
    if run is not None:
        return run
    run = repo.preempted_run(job_id, restart_count)
    if run is None:
        raise NotFound(what="job", value=f"{job_id}.{restart_count}")
    if preempt_time is not None and run.created_at > preempt_time and run.restart_count > 0:
        earlier = repo.preempted_run(job_id, run.restart_count - 1)
        if earlier is not None:
            return earlier
    return run


def open_set(repo, cfg, job_id: int, restart_count: int, *, preempt_time: dt.datetime | None, now: dt.datetime,
             run=None, trigger: str = "preempt"):
    """(run, set, created): the preemption (or time-limit: `trigger`) set of
    the run that ended (`run`, or the one the hook's restart count points
    at), opened if no hook has yet. The first opener's trigger stays."""
    if trigger not in S.HOOK_TRIGGERS:
        raise BadValueError(what="trigger", value=trigger, why=f"the hooks open {' or '.join(S.HOOK_TRIGGERS)} sets")
    run = run or _preempted_run(repo, job_id, restart_count, preempt_time)
    # Unknown preemption time: the run's start is the honest lower bound for
    # "acknowledged after the request".
    requested = preempt_time or run.created_at
    st, created = repo.create_set(run, epoch=preempt_epoch(run.restart_count), trigger=trigger,
                                  wanted=_wanted(run), deadline=_deadline(cfg, now), owner=PREEMPT_OWNER,
                                  requested_at=requested)
    if not created and preempt_time is not None and st.state in S.ACTIVE \
            and repo.ack_span(st.id)[0] is None:
        # Slurm's PreemptTime is a guess at the request; once a rank said when
        # its signal came (LocalRecorder.cutting), the observation stands.
        fields = {}
        if st.requested_at > preempt_time:
            fields["requested_at"] = preempt_time
        if st.signalled_at is None:
            fields["signalled_at"] = preempt_time
        if fields:
            repo.update_set(st.id, **fields)
    return run, st, created


def early_text(early: EarlyDecision, requested_at: dt.datetime | None) -> str:
    """One line for the set's events: what rank 0 decided about giving the
    nodes back, and how long after the first rank's signal."""
    def after(at: float | None) -> str:
        if at is None or requested_at is None:
            return ""
        return f" {at - requested_at.timestamp():.1f} s after the first signal"
    why = early.why[:300]
    if early.released:
        return (f"released early: every rank acknowledged{after(early.all_acknowledged_at)}, rank 0 requeued the job"
                f"{after(early.at)} ({why})")
    return f"not released early ({early.decision}): {why}"


def release_of(early: EarlyDecision | None, preempt_time: dt.datetime | None,
               trigger: str = "preempt") -> tuple[dt.datetime, str] | None:
    """When and how the preempted job gave its nodes back: rank 0's requeue
    (jobrecords.EARLY_RELEASED), else Slurm's PreemptTime, which the Epilogs
    see as the kill at the end of GraceTime; for a time-limit set, the time
    limit ("limit": Slurm ended the job there)."""
    if early is not None and early.released:
        return as_time(early.at), "early"
    if preempt_time is not None:
        return preempt_time, ("limit" if trigger == "timelimit" else "grace")
    return None


def observed_times(repo, st) -> dict:
    """The set's request and barrier times as its recorded acknowledgements
    say (LocalRecorder.cutting, deliver)."""
    observed, last = repo.ack_span(st.id)
    fields = {}
    if observed is not None:
        # The request time of a preemption is when the first rank got the
        # signal, as the ranks observed it, not PreemptTime less GraceTime
        # less a slack (Slurm shows the kill's time there).
        fields.update(requested_at=observed, signalled_at=observed)
    if last is not None:
        # Its barrier time is the last acknowledgement as written (each node's
        # Epilog adds its own); with the request time it is the checkpoint
        # time GraceTime must hold.
        fields.update(barrier_at=last)
    return {k: v for k, v in fields.items() if getattr(st, k) != v}


