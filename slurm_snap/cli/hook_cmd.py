"""`slurm-snap hook ...`: what the SPANK plugin and the Prolog/Epilog entry
points exec. Exit status follows the hook failure policy (hooks/policy.py)."""
from __future__ import annotations

import click

from .. import states as S
from ..slurm import hooknames


@click.group("hook")
def command():
    """Entry points for Slurm (not for interactive use)."""


@command.command(hooknames.VALIDATE_OPTIONS)
@click.option("--volumes", default=None, help="The --snapshot-volumes value as given.")
@click.option("--consistency", default=S.WANT_APP, show_default=True)
@click.option("--resume-cmd", default="", help="The --snapshot-resume-cmd value as given.")
@click.option("--every", default=None, help="The --snapshot-every value as given.")
@click.option("--before-timelimit", default=None, help="The --snapshot-before-timelimit value as given.")
@click.pass_obj
def validate_options(ctx, volumes, consistency, resume_cmd, every, before_timelimit):
    """Check submit-time options (run by the SPANK plugin inside sbatch, as the user).
    Never for a restore drill's own job (--snapshot-drill): the plugin checks
    that one alone, reading no configuration (spank/local.c)."""
    from ..hooks.submit import validate_options as validate

    for line in validate(ctx.config, volumes=volumes, consistency=consistency, resume_cmd=resume_cmd, every=every,
                         before_timelimit=before_timelimit):
        click.echo(line)


@command.command(hooknames.WATCH_REQUEUE)
@click.option("--job", required=True, help="The job id.")
@click.option("--epoch", required=True, help="The run's epoch, preempt-<restart count>.")
@click.option("--barrier-dir", required=True, help="The barrier area (SLURM_SNAP_BARRIER_DIR).")
@click.option("--parent", required=True, type=int, help="slurmstepd's pid: the watch ends with it.")
@click.option("--margin", type=int, default=None, help="SLURM_SNAP_TIMELIMIT_MARGIN, if the job has one.")
@click.option("--early-release/--no-early-release", default=False, help="SLURM_SNAP_EARLY_RELEASE.")
def watch_requeue(job, epoch, barrier_dir, parent, margin, early_release):
    """Requeue for a rank 0 that has no scontrol (run by the SPANK plugin, as the job's user, outside containers)."""
    from ..client.early import watch_for_asked
    from ..jobdir import JobDir
    from ..jobrecords import check_name

    outcome = watch_for_asked(JobDir(barrier_dir, job), check_name("epoch", epoch), parent=parent,
                              early_release=early_release, margin=margin)
    if outcome:
        click.echo(f"slurm-snap: job {job} {epoch}: {outcome}", err=True)


def _make(name):
    @click.pass_obj
    def _cmd(ctx):
        from ..hooks.run import run_named

        raise click.exceptions.Exit(run_named(ctx.config_path, name))

    _cmd.__doc__ = f"Run as Slurm's {name} for an opted-in job."
    return click.command(name)(_cmd)


for _name in hooknames.LISTED:
    command.add_command(_make(_name))
