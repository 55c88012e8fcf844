"""acknowledgements say the launcher's world size, whether ranks are
independent, and how the rank agreed on its step

Revision ID: 0003_ack_layout
Revises: 0002_report_indexes
Create Date: 2026-12-01 14:00:00

A lockstep job's ranks must all acknowledge one step; the verdict needs to
know how many ranks the launcher started (never how many happened to
acknowledge), whether the job declared its ranks independent, and whether a
rank's agreement with its peers failed.
"""
import sqlalchemy as sa
from alembic import op


revision = '0003_ack_layout'
down_revision = '0002_report_indexes'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('barrier_ack') as batch:
        batch.add_column(sa.Column('world_size', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('independent', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.add_column(sa.Column('agreement', sa.String(length=255), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('barrier_ack') as batch:
        batch.drop_column('agreement')
        batch.drop_column('independent')
        batch.drop_column('world_size')
