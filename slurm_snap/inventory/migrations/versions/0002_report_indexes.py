"""report indexes: per-job RPO lookup and per-user windows

Revision ID: 0002_report_indexes
Revises: 0001
Create Date: 2026-12-01 00:15:00

Without them `report` over a million sets spends most of its time finding
each job's newest VERIFIED set (benchmarks/report.py: 1.1 s -> 0.3 s).
"""
from alembic import op


revision = '0002_report_indexes'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_set_job_state_cut', 'snapshot_set', ['job_id', 'state', 'cut_done_at'], unique=False)
    op.create_index('ix_set_user_requested', 'snapshot_set', ['user_name', 'requested_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_set_user_requested', table_name='snapshot_set')
    op.drop_index('ix_set_job_state_cut', table_name='snapshot_set')
