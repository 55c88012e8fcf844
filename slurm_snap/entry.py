"""The `slurm-snap` console script.

The Prolog/Epilog entry points exec `slurm-snap --config FILE hook NAME` for
every opted-in job, on its start path, and the SPANK plugin `slurm-snap
--config FILE hook validate-options ...` inside every sbatch with slurm-snap
options: those exact argvs skip click (about 25 ms of imports) and go
straight to the hook runner or the submit check. `--version`, `--help` and
`report --helpformat` are answered without click too (slurm_snap/helptext.py),
and so is a user's command forwarded to the service (slurm_snap/forwarding.py).
Everything else is the click CLI in slurm_snap.cli.
"""
from __future__ import annotations

import sys

from .slurm.hooknames import NAMES as HOOK_NAMES


def entry() -> None:
    argv = sys.argv[1:]
    if len(argv) >= 4 and argv[0] == "--config" and argv[2] == "hook":
        if len(argv) == 4 and argv[3] in HOOK_NAMES:
            from .hooks.run import run_named

            sys.exit(run_named(argv[1], argv[3]))
        if argv[3] == "validate-options":
            from .hooks.submit import parse_argv

            options = parse_argv(argv[4:])
            if options is not None:
                sys.exit(_validate(argv[1], options))
    rest = _after_global_options(argv)
    if rest in (["--version"], ["--help"], ["-h"], ["report", "--helpformat"], ["report", "-e"]):
        text = _without_click(rest)
        if text is not None:
            sys.stdout.write(text)
            sys.exit(0)
    # A user's command on a login host or node goes to the service without
    # click (forwarding.py says why); None: it runs here, through the CLI.
    from . import forwarding

    rc = forwarding.run(lambda: forwarding.forwarded(argv), argv)
    if rc is not None:
        sys.exit(rc)
    from .cli import main

    sys.exit(main(forward=False))


def _after_global_options(argv: list[str]) -> list[str]:
    """argv past the group's own --config/-v options (as forwarding.forwarded reads them)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--config" and i + 1 < len(argv):
            i += 2
        elif a.startswith("--config=") or a == "--verbose" or (a.startswith("-v") and set(a[1:]) == {"v"}):
            i += 1
        else:
            break
    return argv[i:]


def _without_click(rest: list[str]) -> str | None:
    """What click would print for --version, --help and report --helpformat,
    without importing it (helptext.py says why); None where only click knows
    (a terminal narrower than the stored help)."""
    from . import helptext

    if rest == ["--version"]:
        return helptext.VERSION + "\n"
    if rest[0] == "report":
        from .report.columns import COLUMNS, helpformat

        return helpformat(COLUMNS) + "\n"
    return helptext.HELP if _columns() >= helptext.MIN_COLUMNS else None


def _columns() -> int:
    """The terminal width click's help formatter would see (shutil.get_terminal_size's rule)."""
    import os

    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80


def _validate(config_path: str, options: dict) -> int:
    """The SPANK plugin's check at sbatch time, without click, under the
    same rule as the CLI's boundary: a SnapError is one line on stderr and
    its exit code."""
    from . import config, errors
    from .hooks.submit import validate_options

    try:
        lines = validate_options(config.load(config_path), **options)
    except errors.SnapError as exc:
        print(f"slurm-snap: {exc}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0
