"""`slurm-snap metrics`: Prometheus text for node_exporter's textfile collector."""
from __future__ import annotations

import click

from .. import access
from ..errors import PermissionDenied
from .report_cmd import caller_and_clock


@click.command("metrics")
@click.option("--textfile", metavar="PATH.prom",
              help="Write atomically to this file (tmp + rename) instead of stdout.")
@click.option("--job-window", default="now-7days", show_default=True, metavar="TIME",
              help="Per-job RPO series cover jobs with a set requested since TIME (Slurm time syntax).")
@click.pass_obj
def command(ctx, textfile, job_window):
    """Print inventory metrics in the Prometheus text format (operators only:
    the series name every user's jobs)."""
    from ..report.metrics import collect, write_textfile
    from ..slurm.slurmtime import parse_time

    caller, now, tz = caller_and_clock(ctx)
    if not access.is_operator(ctx.config, caller):
        raise PermissionDenied(why=f"metrics cover every user's jobs; {caller.name} is not an operator")
    since = parse_time(job_window, now=now, tz=tz, what="job window (--job-window)")
    with ctx.inventory.session(readonly=True) as repo:
        text = collect(repo, now=now, jobs_since=since, cfg=ctx.config)
    if textfile:
        write_textfile(textfile, text)
    else:
        click.echo(text, nl=False)
