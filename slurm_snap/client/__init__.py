"""Rank-side client of slurm-snap: standard library only.

Importing this package must not import click, SQLAlchemy or paramiko: it runs
inside training processes (and containers) that have none of them. The
coordinator imports `parse_ack` and `node_barrier_complete` from here, so both
sides of the barrier share one definition of an acknowledgement.
See docs/client.md.
"""
from slurm_snap.client.ack import (
    ACK_VERSION,
    MAX_ACK_BYTES,
    Ack,
    ManifestEntry,
    ack_filename,
    build_ack,
    check_name,
    node_barrier_complete,
    parse_ack,
)
from slurm_snap.client.agree import Decision, StepAgreement
from slurm_snap.client.checkpointer import Action, Checkpointer
from slurm_snap.client.marker import FIRST_STEP_MARKER, MARKER_FILE_ENV, mark_first_step
from slurm_snap.client.signals import parse_signal
from slurm_snap.client.slurmenv import Identity, identity_from_env, parse_tasks_per_node

__all__ = [
    "ACK_VERSION", "MAX_ACK_BYTES", "Ack", "ManifestEntry", "ack_filename", "build_ack",
    "check_name", "node_barrier_complete", "parse_ack", "Action", "Checkpointer", "Decision", "StepAgreement",
    "Identity", "identity_from_env", "FIRST_STEP_MARKER",
    "MARKER_FILE_ENV", "mark_first_step", "parse_tasks_per_node", "parse_signal",
]
