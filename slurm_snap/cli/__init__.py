"""The `slurm-snap` command: a click group, one module per command.

main() is the one boundary where SnapError becomes an exit code and a single
line on stderr; anything else escaping is a bug and exits INTERNAL with one
line too (the traceback only with -vv: never a traceback to a user).
"""
from __future__ import annotations

import importlib
import sys

import click

from .. import __version__, errors
from .context import Ctx

# name -> module under slurm_snap.cli; each module defines `command`.
# Only commands that work are listed here.
COMMANDS = {
    "config": "config_cmd",
    "db": "db_cmd",
    "doctor": "doctor_cmd",
    "hook": "hook_cmd",
    "metrics": "metrics_cmd",
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


# Commands that open the inventory themselves: on a host whose config names
# the service they are refused before anything else (who asks, which
# options), with one exit code (errors.CONTROLLER).
CONTROLLER_COMMANDS = frozenset({"db", "metrics", "prune", "repair", "schedule", "serve"})

# Options a command answers from its own definitions, on any host and
# without a configuration (as `sacct -e` lists its fields anywhere).
ANSWERED_HERE = frozenset({"-h", "--help", "-e", "--helpformat"})


def _forwarded(argv: list[str]) -> int | None:
    """On a host whose config names the slurm-snap service (a login host or
    a node), a user's command runs on the controller, as this user, and a
    controller's command is refused; None when the command runs here."""
    from ..service.server import USER_COMMANDS

    i, config_path = 0, None
    while i < len(argv):
        a = argv[i]
        if a == "--config" and i + 1 < len(argv):
            config_path, i = argv[i + 1], i + 2
        elif a.startswith("--config="):
            config_path, i = a.split("=", 1)[1], i + 1
        elif a == "--verbose" or (a.startswith("-v") and set(a[1:]) == {"v"}):
            i += 1
        else:
            break
    rest = argv[i:]
    if not rest or rest[0] not in USER_COMMANDS + tuple(CONTROLLER_COMMANDS) \
            or any(a in ANSWERED_HERE for a in rest):
        return None
    from .. import config as config_mod

    cfg = config_mod.load(config_path)
    if not cfg.via_service:
        return None
    if rest[0] in CONTROLLER_COMMANDS:
        raise errors.ControllerOnly(command=rest[0], url=cfg.inventory.url)
    from ..service.client import forward

    return forward(cfg, rest)


def _debug(argv: list[str]) -> bool:
    """-vv before the command: an internal error then shows its traceback."""
    n = 0
    for a in argv:
        if a == "--verbose":
            n += 1
        elif a.startswith("-v") and set(a[1:]) == {"v"}:
            n += len(a) - 1
        elif not a.startswith("-"):
            break
    return n >= 2


def main(argv=None, *, bug_log=None) -> int:
    """Run one command; its exit code. `bug_log` receives the traceback of
    an internal error (the service passes its own log)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        forwarded = _forwarded(args)
        if forwarded is not None:
            return forwarded
        # With standalone_mode=False click returns an Exit's code instead of raising.
        rv = cli.main(args=argv, prog_name="slurm-snap", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except errors.SnapError as exc:
        click.echo(f"slurm-snap: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return errors.USAGE
    except click.exceptions.Abort:
        click.echo("slurm-snap: aborted", err=True)
        return errors.INTERNAL
    except (BrokenPipeError, KeyboardInterrupt):
        return errors.INTERNAL
    except Exception as exc:
        # A bug: one sentence for the user, never a traceback (-vv shows it).
        import traceback

        if bug_log is not None:
            bug_log(traceback.format_exc())
        if _debug(args):
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        click.echo(f"slurm-snap: internal error (a bug: please report it): {type(exc).__name__}: {first} "
                   "(rerun with -vv for the traceback)", err=True)
        return errors.INTERNAL


def entry() -> None:
    sys.exit(main())
