"""a volume the node Prolog refused: when and why

Revision ID: 0004_volume_refusal
Revises: 0003_ack_layout
Create Date: 2026-12-01 22:00:00

The Prolog refuses a declared path it must not act on (a symlink, another
user's directory, a directory the backend cannot cut alone). The job then
runs without that volume's protection; report and show must say so instead
of the job being silently absent, and no later cut may act on the path.
"""
import sqlalchemy as sa
from alembic import op


revision = '0004_volume_refusal'
down_revision = '0003_ack_layout'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('volume') as batch:
        batch.add_column(sa.Column('refused_at', sa.DateTime(), nullable=True))
        batch.add_column(sa.Column('refusal', sa.String(length=2000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('volume') as batch:
        batch.drop_column('refusal')
        batch.drop_column('refused_at')
