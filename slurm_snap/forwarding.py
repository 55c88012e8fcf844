"""A command on a host whose configuration names the slurm-snap service (a
login host, a node): a user's command runs on the controller, as this user,
through the service; a controller's command is refused here.

Standard library and the service's client only, no click: entry.py asks
this before it imports the CLI, so what users run on a login host pays for
the forwarding and nothing else (issue 36: `report` and `show` there within
100 ms wall; click and the CLI's modules were ~45 ms of it). cli.main asks
it too when called without entry.py (tests, the service's children).

The boundary (`run`) is the CLI's, for everything that can fail without
click: a SnapError is its message on stderr and its exit code, a bug one
sentence (its traceback with -vv, or into `bug_log`). cli.main wraps click's
own exceptions inside it.
"""
from __future__ import annotations

import sys

from . import errors
from .service import USER_COMMANDS

# Commands that open the inventory themselves: on a host whose config names
# the service they are refused before anything else (who asks, which
# options), with one exit code (errors.CONTROLLER).
CONTROLLER_COMMANDS = frozenset({"db", "metrics", "prune", "repair", "schedule", "serve"})

# Options a command answers from its own definitions, on any host and
# without a configuration (as `sacct -e` lists its fields anywhere).
ANSWERED_HERE = frozenset({"-h", "--help", "-e", "--helpformat"})


def forwarded(argv: list[str]) -> int | None:
    """The exit status of `argv` run on the controller through the service,
    or None when the command runs here."""
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
    from . import config as config_mod

    cfg = config_mod.load(config_path)
    if not cfg.via_service:
        return None
    if rest[0] in CONTROLLER_COMMANDS:
        raise errors.ControllerOnly(command=rest[0], url=cfg.inventory.url)
    from .service.client import forward

    return forward(cfg, rest)


def debug(argv: list[str]) -> bool:
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


def run(fn, argv: list[str], *, bug_log=None):
    """fn()'s result, or the exit status of what it raised (the boundary)."""
    try:
        return fn()
    except errors.SnapError as exc:
        _say(f"slurm-snap: {exc}")
        return exc.exit_code
    except (BrokenPipeError, KeyboardInterrupt):
        return errors.INTERNAL
    except Exception as exc:
        # A bug: one sentence for the user, never a traceback (-vv shows it).
        import traceback

        if bug_log is not None:
            bug_log(traceback.format_exc())
        if debug(argv):
            traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        _say(f"slurm-snap: internal error (a bug: please report it): {type(exc).__name__}: {first} "
             "(rerun with -vv for the traceback)")
        return errors.INTERNAL


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
