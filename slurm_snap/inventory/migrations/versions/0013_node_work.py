"""node-local work done on the node: drills as Slurm jobs, and node tasks

Revision ID: 0013_node_work
Revises: 0012_job_sluid
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

node_task: work on a node's own disk that no job rides on, pulled by the
node's agent from the service (nodetasks/): `delete` a node-local part or
a copy of one (prune), `send`/`receive` a part between two nodes' agents
(partner copies: pair_id links the halves; the receiver listens at
`address` and both prove themselves root with a MUNGE credential bound to
`token`). state PENDING, LISTENING (a receive waiting for its sender),
DONE or FAILED (error says why). Indexed by (node, state): each pass of a
node's agent asks for its open tasks.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

# As migration 0007 made every other time and duration on MariaDB.
TIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mysql', 'mariadb')
SECONDS = sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), 'mysql', 'mariadb')


revision = '0013_node_work'
down_revision = '0012_job_sluid'
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
    op.create_table(
        'node_task',
        sa.Column('id', sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column('node', sa.String(64), nullable=False),
        sa.Column('kind', sa.String(16), nullable=False),
        sa.Column('purpose', sa.String(16), nullable=False),
        sa.Column('set_id', sa.Integer(), nullable=False),
        sa.Column('snapshot_id', sa.Integer(), sa.ForeignKey('snapshot.id'), nullable=False),
        sa.Column('copy_id', sa.Integer(), nullable=True),
        sa.Column('parent_id', sa.Integer(), nullable=True),
        sa.Column('peer', sa.String(64), nullable=False),
        sa.Column('pair_id', sa.Integer(), nullable=True),
        sa.Column('address', sa.String(255), nullable=False),
        sa.Column('token', sa.String(64), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('error', sa.Text(), nullable=False),
        sa.Column('method', sa.String(24), nullable=False),
        sa.Column('bytes', sa.BigInteger(), nullable=True),
        sa.Column('seconds', SECONDS, nullable=True),
        sa.Column('created_at', TIME, nullable=False),
        sa.Column('updated_at', TIME, nullable=False),
    )
    op.create_index('ix_node_task_node_state', 'node_task', ['node', 'state'])
    op.create_index('ix_node_task_set', 'node_task', ['set_id'])


def downgrade() -> None:
    op.drop_index('ix_node_task_set', table_name='node_task')
    op.drop_index('ix_node_task_node_state', table_name='node_task')
    op.drop_table('node_task')
    op.drop_index('ix_restore_node_test_id', table_name='restore_node')
    op.drop_table('restore_node')
    with op.batch_alter_table('restore_test') as batch:
        batch.drop_column('ran_on')
        batch.drop_column('queued_seconds')
        batch.drop_column('submitted_at')
