"""Retention: which snapshot sets to keep (policy.py, pure, an injected clock)
and deleting the others through their backends (prune.py), for `slurm-snap
prune`. Its own package, not part of restore/: it reads restore drills'
results (a VERIFIED set is the base of the RPO) but is not a drill."""
