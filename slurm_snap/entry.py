"""The `slurm-snap` console script.

The Prolog/Epilog entry points exec `slurm-snap --config FILE hook NAME` for
every opted-in job, on its start path, and the SPANK plugin `slurm-snap
--config FILE hook validate-options ...` inside every sbatch with slurm-snap
options: those exact argvs skip click (about 25 ms of imports) and go
straight to the hook runner or the submit check. Everything else is the
click CLI in slurm_snap.cli.
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
    from .cli import main

    sys.exit(main())


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
