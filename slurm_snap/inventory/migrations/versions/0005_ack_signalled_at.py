"""when each rank's checkpoint signal reached it

Revision ID: 0005_ack_signalled_at
Revises: 0004_volume_refusal
Create Date: 2026-12-02 00:40:00

A preemption has no request time of its own: Slurm's PreemptTime, as the
Epilogs see it, is the kill at the end of the grace period. The ranks know
when the signal reached them; a preemption set's request time is the earliest
of those, as observed (issue 16). NULL: an older client, or a rank that joined
its peers' checkpoint without a signal of its own.
"""
import sqlalchemy as sa
from alembic import op


revision = '0005_ack_signalled_at'
down_revision = '0004_volume_refusal'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('barrier_ack') as batch:
        batch.add_column(sa.Column('signalled_at', sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('barrier_ack') as batch:
        batch.drop_column('signalled_at')
