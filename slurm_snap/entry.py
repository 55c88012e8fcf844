"""The `slurm-snap` console script.

The Prolog/Epilog entry points exec `slurm-snap --config FILE hook NAME` for
every opted-in job, on its start path: that exact argv skips click (about
25 ms of imports) and goes straight to the hook runner. Everything else is
the click CLI in slurm_snap.cli.
"""
from __future__ import annotations

import sys

from .slurm.hooknames import NAMES as HOOK_NAMES


def entry() -> None:
    argv = sys.argv[1:]
    if len(argv) == 4 and argv[0] == "--config" and argv[2] == "hook" and argv[3] in HOOK_NAMES:
        from .hooks.run import run_named

        sys.exit(run_named(argv[1], argv[3]))
    from .cli import main

    sys.exit(main())
