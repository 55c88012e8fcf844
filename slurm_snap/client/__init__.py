"""Rank-side client of slurm-snap: standard library only.

Importing this package must not import click, SQLAlchemy or paramiko: it runs
inside training processes (and containers) that have none of them. What it
exports is what docs/client.md documents, and nothing more
(tests/unit/test_client_surface.py holds the two together): the
Checkpointer, the Action its decide() returns, and mark_first_step; the
framework helpers are the submodules `dcp` and `lightning`, and
`python -m slurm_snap.client.launch` is the launcher wrapper. The per-job
files' formats are slurm_snap.jobrecords', shared with the coordinator and
not part of this API.
"""
from slurm_snap.client.checkpointer import Action, Checkpointer
from slurm_snap.client.marker import mark_first_step

__all__ = ["Action", "Checkpointer", "mark_first_step"]
