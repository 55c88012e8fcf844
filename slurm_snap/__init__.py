"""slurm-snap: application-consistent snapshots of Slurm jobs' storage."""

__version__ = "0.1.0"
