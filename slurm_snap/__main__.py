from slurm_snap.entry import entry

entry()
