"""`slurm-snap hook ...`: what the SPANK plugin and the Prolog/Epilog entry
points exec. Exit status follows the hook failure policy (hooks/policy.py)."""
from __future__ import annotations


import click

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
    """Check submit-time options (run by the SPANK plugin inside sbatch, as the user)."""
    from ..hooks.submit import validate_options as validate

    for line in validate(ctx.config, volumes=volumes, consistency=consistency, resume_cmd=resume_cmd, every=every):
        click.echo(line)


def _make(name):
    @click.pass_obj
    def _cmd(ctx):
        from ..hooks.run import run_named

        raise click.exceptions.Exit(run_named(ctx.config_path, name))

    _cmd.__doc__ = f"Run as Slurm's {name} for an opted-in job."
    return click.command(name)(_cmd)


for _name in hooknames.LISTED:
    command.add_command(_make(_name))
