"""node-local parts that follow the job: copies of a part on other nodes

Revision ID: 0010_part_copies
Revises: 0009_periodic
Create Date: 2026-12-02 15:30:00

part_copy: one row per attempt to put a node-local part of a set on another
node: "restore" when a requeued run's Prolog brought the part to the node
its ranks now run on (for_restart = that run), "partner" for a second copy
kept against the loss of the first node. state OK (the copy exists), FAILED
(it could not be made: error says why; the run started without it) or LOST
(its node was lost). Indexed by set (show, repair) and by (part, node) (is
it already there?).
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# As migration 0007 made every other time and duration on MariaDB.
TIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mysql', 'mariadb')
SECONDS = sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), 'mysql', 'mariadb')


revision = '0010_part_copies'
down_revision = '0009_periodic'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'part_copy',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('snapshot_id', sa.Integer(), sa.ForeignKey('snapshot.id'), nullable=False),
        sa.Column('set_id', sa.Integer(), nullable=False),
        sa.Column('node', sa.String(64), nullable=False),
        sa.Column('ref', sa.String(4096), nullable=False),
        sa.Column('path', sa.String(4096), nullable=False),
        sa.Column('purpose', sa.String(16), nullable=False),
        sa.Column('for_restart', sa.Integer(), nullable=True),
        sa.Column('ranks', sa.JSON(), nullable=False),
        sa.Column('source_node', sa.String(64), nullable=False),
        sa.Column('method', sa.String(24), nullable=False),
        sa.Column('bytes', sa.BigInteger(), nullable=True),
        sa.Column('seconds', SECONDS, nullable=True),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('error', sa.Text(), nullable=False),
        sa.Column('created_at', TIME, nullable=False),
    )
    op.create_index('ix_part_copy_set', 'part_copy', ['set_id'])
    op.create_index('ix_part_copy_snapshot_node', 'part_copy', ['snapshot_id', 'node'])


def downgrade() -> None:
    op.drop_index('ix_part_copy_snapshot_node', table_name='part_copy')
    op.drop_index('ix_part_copy_set', table_name='part_copy')
    op.drop_table('part_copy')
