from slurm_snap.cli import entry

entry()
