"""What `slurm-snap --help` and `--version` print, kept here so that entry.py
answers them without importing click (issue 36: at most x5 of a bare
`python -c pass`; click's import alone is x4.6, and listing the commands
imported every command's module, x40). The text is click's own rendering
of slurm_snap.cli at the width click uses for any terminal of 80 columns
or more (and for output that is not a terminal);
tests/unit/test_start_path.py holds it to what click prints, so it cannot
drift, and entry.py leaves narrower terminals to click.
"""
from . import __version__

VERSION = f"slurm-snap, version {__version__}"

HELP = """\
Usage: slurm-snap [OPTIONS] COMMAND [ARGS]...

  Application-consistent snapshots of Slurm jobs' storage.

Options:
  --version      Show the version and exit.
  --config PATH  Configuration file [default: /etc/slurm-snap/slurm-
                 snap.toml].
  -v, --verbose  More detail on stderr; repeat for debug.
  -h, --help     Show this message and exit.

Commands:
  config        Inspect the configuration.
  db            Manage the inventory database.
  doctor        Check Slurm's and slurm-snap's configuration together.
  hook          Entry points for Slurm (not for interactive use).
  metrics       Print inventory metrics in the Prometheus text format...
  node-agent    Deliver this node's spool to the inventory, oldest first:...
  node-tasks    Do what the service has for this node ([node] name, else...
  prune         Delete snapshot sets the keep rules do not select...
  repair        Find sets still in flight whose coordinator died or whose...
  report        Snapshot sets of jobs, like sacct: which jobs have a...
  restore-test  Clone the set into a spare namespace, run the resume...
  resume-path   Print what this run of the job resumes from (nothing on a...
  schedule      Take the periodic snapshots that are due and run the...
  serve         Serve users' report/show/snapshot/restore-test and the...
  show          Show one snapshot set: phases, barriers, volumes, drills,...
  snapshot      Snapshot every declared volume of JOBID as one labelled set.
"""

# click wraps help at min(terminal columns, 80) - 2; HELP is the 78-column text.
MIN_COLUMNS = 80
