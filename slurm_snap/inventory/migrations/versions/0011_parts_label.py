"""a set's label versus the label of the parts that were cut

Revision ID: 0011_parts_label
Revises: 0010_part_copies
Create Date: 2026-12-04 09:00:00

report showed State PARTIAL beside Consistency app-consistent, and a user
scanning that column took the set for a restorable point (issue 30). From
this revision `consistency` is the set's label as a point to restore from,
"none" for PARTIAL, FAILED and ROLLED_BACK sets, and the new
`parts_consistency` keeps what the verdict said of the parts that were cut
(states.labels_for). Existing rows: parts_consistency takes the old label;
PARTIAL sets' consistency becomes "none" (FAILED and ROLLED_BACK sets were
"none" already).
"""
import sqlalchemy as sa
from alembic import op


revision = '0011_parts_label'
down_revision = '0010_part_copies'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('snapshot_set') as batch:
        batch.add_column(sa.Column('parts_consistency', sa.String(24), nullable=False, server_default='none'))
    sets = sa.table('snapshot_set', sa.column('state', sa.String), sa.column('consistency', sa.String),
                    sa.column('parts_consistency', sa.String))
    op.execute(sets.update().values(parts_consistency=sets.c.consistency))
    op.execute(sets.update().where(sets.c.state.in_(('PARTIAL', 'FAILED', 'ROLLED_BACK')))
               .values(consistency='none'))


def downgrade() -> None:
    sets = sa.table('snapshot_set', sa.column('state', sa.String), sa.column('consistency', sa.String),
                    sa.column('parts_consistency', sa.String))
    op.execute(sets.update().where(sets.c.state == 'PARTIAL').values(consistency=sets.c.parts_consistency))
    with op.batch_alter_table('snapshot_set') as batch:
        batch.drop_column('parts_consistency')
