"""failure counters that only go up; events found by kind

Revision ID: 0008_failure_counts
Revises: 0007_mysql_precision
Create Date: 2026-12-02 05:00:00

`slurm_snap_failures_total` counted the sets now in a failure state, so it
fell whenever prune deleted one (Prometheus takes that for a restart).
failure_count holds, per (state, reason class), how many times a set went
into FAILED, PARTIAL, ROLLED_BACK or FAILED_RESTORE; the state change itself
increments it from now on. It starts from the sets in those states today, so
the series does not drop at the upgrade; failures whose sets were already
pruned, or whose drills later passed, are not known any more and are not
counted. ix_event_kind: metrics count hook failures (kind hook-failed) on
every run.
"""
import re

import sqlalchemy as sa
from alembic import op


revision = '0008_failure_counts'
down_revision = '0007_mysql_precision'
branch_labels = None
depends_on = None

_FAILURE_STATES = ('FAILED', 'PARTIAL', 'ROLLED_BACK', 'FAILED_RESTORE')


def _reason_class(reason):
    # Frozen copy of inventory.failures.reason_class as of this revision: a
    # migration must build the same rows whatever the code does later.
    head = re.split(r"[:;(]", reason or "", maxsplit=1)[0]
    head = " ".join(re.sub(r"\d+(?:\.\d+)?", "N", head).split())
    return (head or "unknown")[:64]


def upgrade() -> None:
    table = op.create_table(
        'failure_count',
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('reason', sa.String(64), nullable=False),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('state', 'reason'),
    )
    op.create_index('ix_event_kind', 'event', ['kind'], unique=False)
    sets = sa.table('snapshot_set', sa.column('state', sa.String), sa.column('reason', sa.Text))
    counts = {}
    rows = op.get_bind().execute(sa.select(sets.c.state, sets.c.reason, sa.func.count())
                                 .where(sets.c.state.in_(_FAILURE_STATES))
                                 .group_by(sets.c.state, sets.c.reason))
    for state, reason, n in rows:
        key = (state, _reason_class(reason))
        counts[key] = counts.get(key, 0) + n
    if counts:
        op.bulk_insert(table, [{'state': s, 'reason': r, 'count': n} for (s, r), n in sorted(counts.items())])


def downgrade() -> None:
    op.drop_index('ix_event_kind', table_name='event')
    op.drop_table('failure_count')
