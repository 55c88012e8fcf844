"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30 23:04:09.825903
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table('event',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=True),
    sa.Column('set_id', sa.Integer(), nullable=True),
    sa.Column('node', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('level', sa.String(length=8), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('event', schema=None) as batch_op:
        batch_op.create_index('ix_event_job', ['job_id'], unique=False)

    op.create_table('job_run',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=False),
    sa.Column('restart_count', sa.Integer(), nullable=False),
    sa.Column('user_name', sa.String(length=64), nullable=False),
    sa.Column('uid', sa.Integer(), nullable=False),
    sa.Column('partition', sa.String(length=64), nullable=False),
    sa.Column('nodes', sa.JSON(), nullable=False),
    sa.Column('options', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id', 'restart_count', name='uq_job_run')
    )
    with op.batch_alter_table('job_run', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_run_job_id'), ['job_id'], unique=False)
        batch_op.create_index('ix_job_run_user', ['user_name'], unique=False)

    op.create_table('snapshot_set',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_run_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=False),
    sa.Column('user_name', sa.String(length=64), nullable=False),
    sa.Column('epoch', sa.String(length=64), nullable=False),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('wanted', sa.String(length=16), nullable=False),
    sa.Column('consistency', sa.String(length=24), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('owner', sa.String(length=255), nullable=False),
    sa.Column('deadline', sa.DateTime(), nullable=True),
    sa.Column('requested_at', sa.DateTime(), nullable=False),
    sa.Column('signalled_at', sa.DateTime(), nullable=True),
    sa.Column('barrier_at', sa.DateTime(), nullable=True),
    sa.Column('cut_started_at', sa.DateTime(), nullable=True),
    sa.Column('cut_done_at', sa.DateTime(), nullable=True),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('verified_at', sa.DateTime(), nullable=True),
    sa.Column('skew_seconds', sa.Float(), nullable=True),
    sa.Column('checkpoint_step', sa.BigInteger(), nullable=True),
    sa.Column('manifest_ok', sa.Boolean(), nullable=True),
    sa.Column('expected_parts', sa.Integer(), nullable=False),
    sa.Column('failed_nodes', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['job_run_id'], ['job_run.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_run_id', 'epoch', name='uq_set_epoch')
    )
    with op.batch_alter_table('snapshot_set', schema=None) as batch_op:
        batch_op.create_index('ix_set_requested', ['requested_at'], unique=False)
        batch_op.create_index('ix_set_state_requested', ['state', 'requested_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_snapshot_set_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_snapshot_set_job_run_id'), ['job_run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_snapshot_set_user_name'), ['user_name'], unique=False)

    op.create_table('volume',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('job_run_id', sa.Integer(), nullable=False),
    sa.Column('path', sa.String(length=4096), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('node', sa.String(length=64), nullable=False),
    sa.Column('volume_class', sa.String(length=64), nullable=False),
    sa.Column('backend', sa.String(length=64), nullable=False),
    sa.Column('site', sa.String(length=64), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('prepared_at', sa.DateTime(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['job_run_id'], ['job_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_run_id', 'path', 'node', name='uq_volume')
    )
    with op.batch_alter_table('volume', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_volume_job_run_id'), ['job_run_id'], unique=False)

    op.create_table('barrier_ack',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('set_id', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=64), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('local_rank', sa.Integer(), nullable=False),
    sa.Column('local_size', sa.Integer(), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=False),
    sa.Column('written_at', sa.DateTime(), nullable=False),
    sa.Column('received_at', sa.DateTime(), nullable=False),
    sa.Column('manifest', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['set_id'], ['snapshot_set.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('set_id', 'node', 'rank', name='uq_ack')
    )
    with op.batch_alter_table('barrier_ack', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_barrier_ack_set_id'), ['set_id'], unique=False)

    op.create_table('restore_test',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('set_id', sa.Integer(), nullable=False),
    sa.Column('command', sa.Text(), nullable=False),
    sa.Column('target', sa.String(length=4096), nullable=False),
    sa.Column('result', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('finished_at', sa.DateTime(), nullable=True),
    sa.Column('first_step', sa.BigInteger(), nullable=True),
    sa.Column('time_to_first_step', sa.Float(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('slurm_job_id', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['set_id'], ['snapshot_set.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('restore_test', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_restore_test_set_id'), ['set_id'], unique=False)

    op.create_table('snapshot',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('set_id', sa.Integer(), nullable=False),
    sa.Column('volume_id', sa.Integer(), nullable=False),
    sa.Column('backend', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('ref', sa.String(length=4096), nullable=False),
    sa.Column('path', sa.String(length=4096), nullable=False),
    sa.Column('node', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('cut_started_at', sa.DateTime(), nullable=False),
    sa.Column('cut_at', sa.DateTime(), nullable=False),
    sa.Column('site', sa.String(length=64), nullable=False),
    sa.Column('region', sa.String(length=64), nullable=False),
    sa.Column('shared_key', sa.String(length=255), nullable=False),
    sa.Column('manifest_ok', sa.Boolean(), nullable=True),
    sa.Column('error', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['set_id'], ['snapshot_set.id'], ),
    sa.ForeignKeyConstraint(['volume_id'], ['volume.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('set_id', 'volume_id', name='uq_snapshot_part')
    )
    with op.batch_alter_table('snapshot', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_snapshot_set_id'), ['set_id'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('snapshot', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_snapshot_set_id'))

    op.drop_table('snapshot')
    with op.batch_alter_table('restore_test', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_restore_test_set_id'))

    op.drop_table('restore_test')
    with op.batch_alter_table('barrier_ack', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_barrier_ack_set_id'))

    op.drop_table('barrier_ack')
    with op.batch_alter_table('volume', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_volume_job_run_id'))

    op.drop_table('volume')
    with op.batch_alter_table('snapshot_set', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_snapshot_set_user_name'))
        batch_op.drop_index(batch_op.f('ix_snapshot_set_job_run_id'))
        batch_op.drop_index(batch_op.f('ix_snapshot_set_job_id'))
        batch_op.drop_index('ix_set_state_requested')
        batch_op.drop_index('ix_set_requested')

    op.drop_table('snapshot_set')
    with op.batch_alter_table('job_run', schema=None) as batch_op:
        batch_op.drop_index('ix_job_run_user')
        batch_op.drop_index(batch_op.f('ix_job_run_job_id'))

    op.drop_table('job_run')
    with op.batch_alter_table('event', schema=None) as batch_op:
        batch_op.drop_index('ix_event_job')

    op.drop_table('event')

