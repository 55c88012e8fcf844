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


@command.command("validate-options")
@click.option("--volumes", default=None, help="The --snapshot-volumes value as given.")
@click.option("--consistency", default=S.WANT_APP, show_default=True)
@click.option("--resume-cmd", default="", help="The --snapshot-resume-cmd value as given.")
@click.option("--every", default=None, help="The --snapshot-every value as given.")
@click.pass_obj
def validate_options(ctx, volumes, consistency, resume_cmd, every):
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
    declared = validate_submit(ctx.config, items, consistency)
    # Result on stdout, one KEY=VALUE per line: the plugin copies these into
    # the job's environment so ranks find the barrier area and the signal.
    click.echo(f"SLURM_SNAP_BARRIER_DIR={ctx.config.paths.barrier_dir}")
    click.echo(f"SLURM_SNAP_SIGNAL={ctx.config.protocol.checkpoint_signal}")
    click.echo(f"SLURM_SNAP_EARLY_RELEASE={int(ctx.config.protocol.early_release)}")
    click.echo(f"SLURM_SNAP_CLASSES={','.join(sorted({d.vc.name for d in declared}))}")
    if ctx.config.slurm.bin_dir:
        # Rank 0's early release runs scontrol: the site's, not another version's in /usr/bin.
        click.echo(f"SLURM_SNAP_SLURM_BIN={ctx.config.slurm.bin_dir}")


def _make(name):
    @click.pass_obj
    def _cmd(ctx):
        from ..hooks.run import run_named

        raise click.exceptions.Exit(run_named(ctx.config_path, name))

    _cmd.__doc__ = f"Run as Slurm's {name} for an opted-in job."
    return click.command(name)(_cmd)


for _name in hooknames.LISTED:
    command.add_command(_make(_name))
