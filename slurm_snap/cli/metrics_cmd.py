"""`slurm-snap metrics`: Prometheus text for node_exporter's textfile collector."""
from __future__ import annotations

import datetime as dt

import click

from .. import access
from ..errors import PermissionDenied
from ..report.metrics import MAX_JOBS
from .context import DurationType
from .report_cmd import caller_and_clock


@click.command("metrics")
@click.option("--textfile", metavar="PATH.prom",
              help="Write atomically to this file (tmp + rename) instead of stdout.")
@click.option("--job-window", type=DurationType(), default="1day", show_default=True, metavar="DURATION",
              help="Jobs with a set requested within DURATION are counted, and periodic ones get per-job RPO "
                   "series (1day, 12h, 7days; above the longest --snapshot-every).")
@click.option("--max-jobs", type=click.IntRange(min=0), default=MAX_JOBS, show_default=True, metavar="N",
              help="At most N periodic jobs get per-job series, those furthest past their objective first.")
@click.pass_obj
def command(ctx, textfile, job_window, max_jobs):
    """Print inventory metrics in the Prometheus text format (operators only:
    the series name every user's jobs)."""
    from ..report.metrics import collect, write_textfile

    caller, now, _tz = caller_and_clock(ctx)
    if not access.is_operator(ctx.config, caller):
        raise PermissionDenied(why=f"metrics cover every user's jobs; {caller.name} is not an operator")
    since = now - dt.timedelta(seconds=job_window)
    with ctx.inventory.session(readonly=True) as repo:
        text = collect(repo, now=now, jobs_since=since, cfg=ctx.config, max_jobs=max_jobs)
    if textfile:
        write_textfile(textfile, text)
    else:
        click.echo(text, nl=False)
