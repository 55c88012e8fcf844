"""What each Slurm hook does for a restore drill's own Slurm job
(--snapshot-drill, restore/submit.py), which is no job to protect:

  Prolog           (each node, root)   clone this node's parts of the drilled set (restore/onnode.py)
  Epilog           (each node, root)   remove them
  the slurmctld hooks                  record nothing

Run by hooks.run in place of jobhooks.HOOKS when the job carries the option,
under the same failure policy.
"""
from __future__ import annotations

from ..config import Config
from ..slurm import hooknames
from ..slurm.jobenv import JobEnv


def drill_prolog(cfg: Config, inv, job: JobEnv) -> str:
    from ..restore import onnode

    return onnode.prepare(cfg, inv, job)


def drill_epilog(cfg: Config, inv, job: JobEnv) -> str:
    from ..restore import onnode

    return onnode.cleanup(cfg, inv, job)


def _not_for_drills(cfg: Config, inv, job: JobEnv) -> str:
    return f"restore drill {job.drill}'s job: nothing to record"


DRILL_HOOKS = {
    hooknames.PROLOG: drill_prolog,
    hooknames.EPILOG: drill_epilog,
    hooknames.PROLOG_SLURMCTLD: _not_for_drills,
    hooknames.PROLOG_SLURMCTLD_RECORD: _not_for_drills,
    hooknames.EPILOG_SLURMCTLD: _not_for_drills,
}
