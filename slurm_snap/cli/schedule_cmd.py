"""`slurm-snap schedule`: one pass of the schedule runner (slurm_snap/schedule.py)."""
from __future__ import annotations

import json

import click

from .. import errors


@click.command("schedule")
@click.option("--dry-run", is_flag=True, help="Say what is due and what would be drilled; signal nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass as JSON.")
@click.pass_obj
def command(ctx, dry_run, as_json):
    """Take the periodic snapshots that are due and run the scheduled drills.

    One pass, for a systemd timer or a scrontab line every minute (on the
    controller, as root or an operator): one squeue call, two inventory
    queries per 500 running jobs, then the due sets through the on-demand path (at most
    schedule.concurrency at once, schedule.signal_gap seconds between two
    signals; a job with a set in flight is skipped), and drills of the newest
    never-drilled COMPLETE sets when restore.verify_within is set, and with
    restore.partner_copies a copy of every node-local part of a restorable
    set on the job's next node (incremental where the backend can). Exit 0
    when the pass ran, whatever the sets and drills ended as: they are
    recorded, and report, show and the metrics say so.

    A run is due when DURATION has passed since the later of its start and
    its newest set of any kind (a requeued run counts from its own start, not
    from the set its preemption cut).
    """
    from ..access import current_caller, is_operator
    from ..schedule import Runner

    if not is_operator(ctx.config, current_caller()):
        raise errors.PermissionDenied(why="the schedule runner acts on every user's jobs; operators only")
    from ..progress import Line

    with Line("schedule", live=False if as_json else None):
        report = Runner(ctx.config, ctx.inventory).pass_once(dry_run=dry_run)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, sort_keys=True, default=str))
        return
    click.echo(f"{report.running} running jobs, {report.periodic} with periodic snapshots, "
               f"{len(report.due)} due, {len(report.in_flight)} with a set in flight"
               + (" (dry run)" if dry_run else ""))
    if dry_run:
        for d in report.due:
            click.echo(f"due: job {d.job_id} (every {d.every} s, due since {d.due_at:%Y-%m-%dT%H:%M:%SZ})")
    for t in report.taken:
        if t.error:
            click.echo(f"job {t.job_id}: no set: {t.error}")
        else:
            click.echo(f"job {t.job_id}: set {t.set_id} {t.state} {t.consistency} ({t.late_seconds:.0f} s after due)")
    for line in report.partners:
        click.echo(f"partner: {line}")
    for d in report.drills:
        if dry_run:
            click.echo(f"would drill: set {d.set_id} of job {d.job_id}")
        elif d.error:
            click.echo(f"drill of set {d.set_id} (job {d.job_id}): not run: {d.error}")
        else:
            click.echo(f"drill of set {d.set_id} (job {d.job_id}): {'PASSED' if d.passed else 'FAILED'}"
                       + (f", first step after {d.time_to_first_step:.2f} s" if d.time_to_first_step else "")
                       + (f": {d.reason}" if d.reason and not d.passed else ""))
