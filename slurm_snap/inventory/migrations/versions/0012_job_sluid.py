"""job_run.sluid: Slurm's SLUID of the job (25.11+)

Revision ID: 0012_job_sluid
Revises: 0011_parts_label
Create Date: 2026-12-03 10:00:00

Slurm 25.11 gives each run of a job a SLUID ("s" and 13 base32 characters) in
the hooks' SLURM_JOB_SLUID, unique on the cluster after job ids wrap around
MaxJobId; a requeued run gets a new one (measured on 25.11.7). Nullable: runs recorded before
this migration, or on an older Slurm, have none. Indexed: `report -j SLUID`.
"""
import sqlalchemy as sa
from alembic import op

revision = '0012_job_sluid'
down_revision = '0011_parts_label'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_run') as batch:
        batch.add_column(sa.Column('sluid', sa.String(14), nullable=True))
        batch.create_index('ix_job_run_sluid', ['sluid'])


def downgrade() -> None:
    with op.batch_alter_table('job_run') as batch:
        batch.drop_index('ix_job_run_sluid')
        batch.drop_column('sluid')
