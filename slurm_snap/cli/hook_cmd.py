"""`slurm-snap hook ...`: what the SPANK plugin and the Prolog/Epilog entry
points exec. Exit status follows the hook failure policy (hooks/policy.py)."""
from __future__ import annotations


import click

from .. import errors
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
    from ..hooks.volumes import validate_submit

    if volumes is not None and volumes.strip() == "":
        raise errors.BadValueError(what="--snapshot-volumes", value=volumes, why="empty list")
    items = volumes.split(",") if volumes else []
    if len(resume_cmd) > 4096 or any(ord(c) < 0x20 for c in resume_cmd):
        raise errors.BadValueError(what="--snapshot-resume-cmd", value=resume_cmd[:80],
                                   why="longer than 4096 characters or contains control characters")
    if every is not None:
        from ..config import MIN_EVERY_SECONDS
        from ..slurm.duration import parse_duration

        seconds = parse_duration(every, what="--snapshot-every").total_seconds()
        if seconds < MIN_EVERY_SECONDS:
            raise errors.BadValueError(what="--snapshot-every", value=every,
                                       why=f"under {MIN_EVERY_SECONDS} s: too frequent to be worth a snapshot")
    margin = None
    if before_timelimit is not None:
        margin = _timelimit_margin(before_timelimit)
    declared = validate_submit(ctx.config, items, consistency)
    # Result on stdout, one KEY=VALUE per line: the plugin copies these into
    # the job's environment so ranks find the barrier area and the signal.
    click.echo(f"SLURM_SNAP_BARRIER_DIR={ctx.config.paths.barrier_dir}")
    click.echo(f"SLURM_SNAP_SIGNAL={ctx.config.protocol.checkpoint_signal}")
    click.echo(f"SLURM_SNAP_EARLY_RELEASE={int(ctx.config.protocol.early_release)}")
    click.echo(f"SLURM_SNAP_CLASSES={','.join(sorted({d.vc.name for d in declared}))}")
    if margin is not None:
        # Rank 0 tells the time limit's signal from a preemption's by it (client/early.py).
        click.echo(f"SLURM_SNAP_TIMELIMIT_MARGIN={margin}")
    if ctx.config.slurm.bin_dir:
        # Rank 0's early release runs scontrol: the site's, not another version's in /usr/bin.
        click.echo(f"SLURM_SNAP_SLURM_BIN={ctx.config.slurm.bin_dir}")


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


# Slurm's --signal time is 16 bits (sig_time in job_desc_msg_t).
MAX_TIMELIMIT_MARGIN = 65535
MIN_TIMELIMIT_MARGIN = 10


def _timelimit_margin(value: str) -> int:
    """--snapshot-before-timelimit's MARGIN in seconds: a duration in the one
    grammar, within what Slurm's --signal can carry."""
    from ..slurm.duration import parse_duration

    seconds = int(parse_duration(value, what="--snapshot-before-timelimit").total_seconds())
    if not MIN_TIMELIMIT_MARGIN <= seconds <= MAX_TIMELIMIT_MARGIN:
        raise errors.BadValueError(what="--snapshot-before-timelimit", value=value,
                                   why=f"must be {MIN_TIMELIMIT_MARGIN} s to {MAX_TIMELIMIT_MARGIN} s "
                                       "(Slurm's --signal time)")
    return seconds


def _make(name):
    @click.pass_obj
    def _cmd(ctx):
        from ..hooks.run import run_named

        raise click.exceptions.Exit(run_named(ctx.config_path, name))

    _cmd.__doc__ = f"Run as Slurm's {name} for an opted-in job."
    return click.command(name)(_cmd)


for _name in hooknames.LISTED:
    command.add_command(_make(_name))
