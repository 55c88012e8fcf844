"""The `slurm-snap` command: a click group, one module per command.

main() is the one boundary where SnapError becomes an exit code and a single
line on stderr; anything else escaping is a bug and exits INTERNAL with one
line too (the traceback only with -vv: never a traceback to a user).
"""
from __future__ import annotations

import importlib
import sys

import click

from .. import __version__, errors, forwarding
from .context import Ctx

# name -> module under slurm_snap.cli; each module defines `command`.
# Only commands that work are listed here.
COMMANDS = {
    "config": "config_cmd",
    "db": "db_cmd",
    "doctor": "doctor_cmd",
    "hook": "hook_cmd",
    "metrics": "metrics_cmd",
    "node-tasks": "node_tasks_cmd",
    "node-agent": "node_agent_cmd",
    "prune": "prune_cmd",
    "repair": "repair_cmd",
    "report": "report_cmd",
    "restore-test": "restore_test_cmd",
    "resume-path": "resume_path_cmd",
    "schedule": "schedule_cmd",
    "serve": "serve_cmd",
    "show": "show_cmd",
    "snapshot": "snapshot_cmd",
}


class LazyGroup(click.Group):
    """Import a command's module only when it runs: the hooks' hot path must
    not pay for report formatting or paramiko."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        mod = COMMANDS.get(name)
        if mod is None:
            return None
        return importlib.import_module(f"{__name__}.{mod}").command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="slurm-snap")
@click.option("--config", "config_path", metavar="PATH", envvar="SLURM_SNAP_CONFIG",
              help="Configuration file [default: /etc/slurm-snap/slurm-snap.toml].")
@click.option("-v", "--verbose", count=True, help="More detail on stderr; repeat for debug.")
@click.pass_context
def cli(ctx, config_path, verbose):
    """Application-consistent snapshots of Slurm jobs' storage."""
    ctx.obj = Ctx(config_path=config_path, verbose=verbose)


# What a host whose config names the service forwards or refuses (kept
# there, without click: entry.py asks before it imports this package).
CONTROLLER_COMMANDS = forwarding.CONTROLLER_COMMANDS
ANSWERED_HERE = forwarding.ANSWERED_HERE


def main(argv=None, *, bug_log=None, forward: bool = True) -> int:
    """Run one command; its exit code. `bug_log` receives the traceback of
    an internal error (the service passes its own log). `forward=False`:
    the caller (entry.py) already found that the command runs here."""
    args = list(sys.argv[1:] if argv is None else argv)

    def run() -> int:
        if forward:
            forwarded = forwarding.forwarded(args)
            if forwarded is not None:
                return forwarded
        try:
            # With standalone_mode=False click returns an Exit's code instead of raising.
            rv = cli.main(args=argv, prog_name="slurm-snap", standalone_mode=False)
            return rv if isinstance(rv, int) else 0
        except click.exceptions.Exit as exc:
            return exc.exit_code
        except click.ClickException as exc:
            exc.show()
            return errors.USAGE
        except click.exceptions.Abort:
            click.echo("slurm-snap: aborted", err=True)
            return errors.INTERNAL

    return forwarding.run(run, args, bug_log=bug_log)


def entry() -> None:
    sys.exit(main())
