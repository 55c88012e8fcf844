"""when a preemption gave the nodes back, and how

Revision ID: 0006_set_release
Revises: 0005_ack_signalled_at
Create Date: 2026-12-02 04:00:00

Sites tune GraceTime with two numbers per preemption: how long the ranks took
to checkpoint and acknowledge (the set's barrier time, now also recorded for
preemption sets) and when the nodes were given back: released_at, with
release "early" (rank 0 requeued the job once every rank had acknowledged) or
"grace" (Slurm killed the job at the end of GraceTime). NULL/"" for sets that
are not preemptions and for sets recorded before this revision.
"""
import sqlalchemy as sa
from alembic import op


revision = '0006_set_release'
down_revision = '0005_ack_signalled_at'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('snapshot_set') as batch:
        batch.add_column(sa.Column('released_at', sa.DateTime(), nullable=True))
        batch.add_column(sa.Column('release', sa.String(16), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('snapshot_set') as batch:
        batch.drop_column('release')
        batch.drop_column('released_at')
