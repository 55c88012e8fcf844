"""drills as Slurm jobs: where and when the program ran, and each node's share

Revision ID: 0011_drill_nodes
Revises: 0010_part_copies
Create Date: 2026-12-04 10:00:00

restore_test.submitted_at, queued_seconds, ran_on: a drill runs as a Slurm
job of the owner on compute nodes (issue 31); the time it waited (queue and
the nodes' Prologs) is kept apart from time_to_first_step, which the node
measures from the program's start, and ran_on names that node.

restore_node: one row per node of such a drill. Its Prolog (root on the
node, started by Slurm) clones the node-local parts the node holds and
reports READY or FAILED (blames_set: the snapshot itself was unusable);
its Epilog removes them and reports cleanup CLEANED or LEFT. Rows of earlier drills:
none (they ran in one process).
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# As migration 0007 made every other time and duration on MariaDB.
TIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mysql', 'mariadb')
SECONDS = sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), 'mysql', 'mariadb')


revision = '0011_drill_nodes'
down_revision = '0010_part_copies'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('restore_test') as batch:
        batch.add_column(sa.Column('submitted_at', TIME, nullable=True))
        batch.add_column(sa.Column('queued_seconds', SECONDS, nullable=True))
        batch.add_column(sa.Column('ran_on', sa.String(64), nullable=False, server_default=''))
    op.create_table(
        'restore_node',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('test_id', sa.Integer(), sa.ForeignKey('restore_test.id'), nullable=False),
        sa.Column('node', sa.String(64), nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('snapshot_ids', sa.JSON(), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('blames_set', sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column('error', sa.Text(), nullable=False),
        sa.Column('seconds', SECONDS, nullable=True),
        sa.Column('cleanup', sa.String(16), nullable=False, server_default=''),
        sa.Column('cleanup_error', sa.Text(), nullable=False),
        sa.Column('updated_at', TIME, nullable=False),
        sa.UniqueConstraint('test_id', 'node', name='uq_restore_node'),
    )
    op.create_index('ix_restore_node_test_id', 'restore_node', ['test_id'])


def downgrade() -> None:
    op.drop_index('ix_restore_node_test_id', table_name='restore_node')
    op.drop_table('restore_node')
    with op.batch_alter_table('restore_test') as batch:
        batch.drop_column('ran_on')
        batch.drop_column('queued_seconds')
        batch.drop_column('submitted_at')
