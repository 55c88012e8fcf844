"""The one table of hook names: what `slurm-snap hook NAME` accepts, which
slurm.conf parameter runs it and through which entry point (prolog/,
epilog/). entry.py, hooks/, cli/hook_cmd.py, doctor and the coordinator's
messages read it; tests/unit/test_hook_names.py holds the entry-point
scripts and etc/slurm.conf.slurm-snap to it.

No imports: entry.py reads it on every opted-in job's start path, before
anything else is loaded.
"""

PROLOG = "prolog"
EPILOG = "epilog"
PROLOG_SLURMCTLD = "prolog-slurmctld"
# What the PrologSlurmctld entry point starts in its own session after
# handing the launch back (RECORD=background): the same recording.
PROLOG_SLURMCTLD_RECORD = "prolog-slurmctld-record"
EPILOG_SLURMCTLD = "epilog-slurmctld"

# hook name -> the slurm.conf parameter whose entry point execs it
SLURM_KEY = {
    PROLOG: "Prolog",
    EPILOG: "Epilog",
    PROLOG_SLURMCTLD: "PrologSlurmctld",
    PROLOG_SLURMCTLD_RECORD: "PrologSlurmctld",
    EPILOG_SLURMCTLD: "EpilogSlurmctld",
}
NAMES = tuple(SLURM_KEY)

# What `slurm-snap hook --help` offers: the background recording is the
# entry point's own, never run by hand.
LISTED = (PROLOG, EPILOG, PROLOG_SLURMCTLD, EPILOG_SLURMCTLD)

# What the SPANK plugin execs under `slurm-snap hook`, besides the hooks: the
# submit-time check (local context) and the requeue watch for ranks without
# scontrol (remote context, spank/remote.c).
VALIDATE_OPTIONS = "validate-options"
WATCH_REQUEUE = "watch-requeue"
PLUGIN_COMMANDS = (VALIDATE_OPTIONS, WATCH_REQUEUE)

# slurm.conf parameter -> its entry point, as a path in the source tree (the
# install step copies it to the site's libexec directory under its basename)
ENTRY_POINTS = {
    "Prolog": "prolog/slurm-snap-prolog",
    "Epilog": "epilog/slurm-snap-epilog",
    "PrologSlurmctld": "prolog/slurm-snap-prolog-slurmctld",
    "EpilogSlurmctld": "epilog/slurm-snap-epilog-slurmctld",
}


def entry_point_name(slurm_key: str) -> str:
    """The installed file's name, e.g. slurm-snap-prolog-slurmctld."""
    return ENTRY_POINTS[slurm_key].rsplit("/", 1)[-1]
