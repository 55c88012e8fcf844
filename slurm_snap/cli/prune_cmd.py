"""`slurm-snap prune`: apply the retention policy; a dry run unless --apply."""
from __future__ import annotations

import datetime as dt
import json

import click

from .. import errors
from ..clock import utcnow
from .context import DurationType, JobIdType


def _fmt_time(t: dt.datetime | None, tz: dt.tzinfo | None) -> str:
    # The rule of every command's text (docs/report.md): local time, as sacct
    # and report print it, so a set reads the same in prune as in report.
    from ..slurm.slurmtime import format_time

    return format_time(t, tz) if t else "-"


def _live_jobs(cfg) -> frozenset | None:
    """The jobs running now (one squeue): their newest verified set is never
    pruned. None when Slurm cannot say: every job is then treated as running."""
    from ..slurm.api import interface

    try:
        return frozenset(interface().running_jobs(timeout=cfg.timeouts.slurm_command))
    except errors.SnapError as exc:
        click.echo(f"slurm-snap: cannot tell which jobs run ({exc}); every job's newest verified set is kept",
                   err=True)
        return None


@click.command("prune")
@click.option("--job", "job_id", type=JobIdType(), metavar="J",
              help="Only this job's sets (refused, exit 4, for another user's job unless you are an operator).")
@click.option("--user", metavar="U", help="Only this user's sets (operators only for another user).")
@click.option("--keep-last", type=click.IntRange(min=0), default=0, metavar="N", help="Keep the newest N sets.")
@click.option("--keep-daily", type=click.IntRange(min=0), default=0, metavar="N",
              help="Keep the newest set of each of the last N days that have one (UTC).")
@click.option("--keep-weekly", type=click.IntRange(min=0), default=0, metavar="N",
              help="Keep the newest set of each of the last N ISO weeks that have one (UTC).")
@click.option("--keep-within", type=DurationType(), metavar="DURATION",
              help="Keep every set cut within DURATION (7days, 12h, 1d12h, 2-00:00:00: Slurm's forms).")
@click.option("--keep-verified/--no-keep-verified", default=True, show_default=True,
              help="Keep each job's newest VERIFIED set (its RPO base).")
@click.option("--force", is_flag=True, help="Allow deleting a job's last VERIFIED set.")
@click.option("--apply", "apply_", is_flag=True, help="Delete; without it, only print what would happen.")
@click.option("--json", "as_json", is_flag=True, help="Print the decisions as JSON.")
@click.pass_obj
def command(ctx, job_id, user, keep_last, keep_daily, keep_weekly, keep_within, keep_verified, force, apply_,
            as_json):
    """Delete snapshot sets the keep rules do not select (restic-forget-like, per job).

    Sets still in flight are never touched, nor the newest VERIFIED set of a
    job Slurm lists as running (of every job when squeue fails); a set left
    DELETING by an interrupted prune is finished."""
    from ..access import current_caller, is_operator, require_jobs
    from ..restore.parts import backend_resolver
    from ..retention.policy import Policy
    from ..retention.prune import Pruner
    cfg = ctx.config
    tz = getattr(ctx, "tz", None)  # tests fix the zone; None is the system's
    policy = Policy(keep_last=keep_last, keep_daily=keep_daily, keep_weekly=keep_weekly,
                    keep_within=dt.timedelta(seconds=keep_within) if keep_within is not None else None,
                    keep_verified=keep_verified, force=force, live_jobs=_live_jobs(cfg))
    if not policy.has_rule:
        raise errors.UsageError("prune needs at least one of --keep-last, --keep-daily, --keep-weekly, "
                                "--keep-within (refusing to select every set for deletion)")
    caller = current_caller()
    if not is_operator(cfg, caller):
        # Owners may prune their own sets, nobody else's: naming another's
        # job is refused like naming another user, never a silent no-op.
        if user is not None and user != caller.name:
            raise errors.PermissionDenied(why=f"sets of {user} belong to {user}; {caller.name} is not an operator")
        if job_id is not None:
            with ctx.inventory.session(readonly=True) as repo:
                require_jobs(cfg, caller, repo.report_job_owners([job_id]))
        user = caller.name
    from ..backends.factory import backend_on_node

    pruner = Pruner(ctx.inventory, backend_resolver(cfg),
                    copy_backend=lambda vclass, node: backend_on_node(cfg, vclass, node))
    decisions, sets = pruner.plan(policy, utcnow, job_id=job_id, user=user)
    result = None
    if apply_:
        from ..progress import Line

        with Line("prune", live=False if as_json else None):
            result = pruner.apply(decisions)
    if as_json:
        click.echo(json.dumps({
            "applied": bool(apply_),
            "decisions": [{"set_id": d.set_id, "job_id": d.job_id, "action": d.action, "reasons": list(d.reasons),
                           "state": sets[d.set_id].state} for d in decisions],
            "deleted": result.deleted if result else [],
            "failed": {str(k): v for k, v in result.failed.items()} if result else {}}, indent=2))
    else:
        current = None
        for d in decisions:
            st = sets[d.set_id]
            if d.job_id != current:
                current = d.job_id
                click.echo(f"job {d.job_id}:")
            verb = d.action if apply_ or d.action == "keep" else "would delete"
            if apply_ and d.delete:
                verb = "FAILED" if d.set_id in result.failed else "deleted"
            click.echo(f"  {verb:<12} set {st.id:<6} {_fmt_time(st.cut_done_at or st.requested_at, tz)} "
                       f"{st.state:<14} {st.consistency:<16} {'; '.join(d.reasons)}")
        n = sum(1 for d in decisions if d.delete)
        if not apply_:
            click.echo(f"would delete {n} set(s), keep {len(decisions) - n}; run with --apply to delete")
        else:
            click.echo(f"deleted {len(result.deleted)} set(s), failed {len(result.failed)}, "
                       f"kept {len(decisions) - n}")
    if result and result.failed:
        first = next(iter(result.failed.items()))
        raise errors.BackendError(backend="prune", why=f"{len(result.failed)} set(s) stay DELETING "
                                                       f"(rerun prune to finish); first: set {first[0]}: {first[1]}")
