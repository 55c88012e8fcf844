"""periodic snapshots: the interval a job run is snapshotted at

Revision ID: 0009_periodic
Revises: 0008_failure_counts
Create Date: 2026-12-02 07:00:00

job_run.snapshot_every: seconds between the periodic snapshots the schedule
runner takes of the run (--snapshot-every, or the partition's default, never
under the partition's minimum); NULL for runs without periodic snapshots
and for runs recorded before this revision. Indexed: the runner's one query
per pass reads only these runs.
"""
import sqlalchemy as sa
from alembic import op


revision = '0009_periodic'
down_revision = '0008_failure_counts'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_run') as batch:
        batch.add_column(sa.Column('snapshot_every', sa.Integer(), nullable=True))
        batch.create_index('ix_job_run_every', ['snapshot_every'])


def downgrade() -> None:
    with op.batch_alter_table('job_run') as batch:
        batch.drop_index('ix_job_run_every')
        batch.drop_column('snapshot_every')
