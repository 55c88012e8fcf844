"""MariaDB/MySQL: microsecond timestamps and double-precision seconds

Revision ID: 0007_mysql_precision
Revises: 0006_set_release
Create Date: 2026-12-02 04:00:00

MariaDB's DATETIME without a precision keeps whole seconds, and its FLOAT is
4 bytes: on a MariaDB inventory a set's phases collapsed to the second (an
acknowledgement written in the request's second no longer compared as after
it) and a drill's time to first step read back as 2.17629 for 2.1762936.
PostgreSQL (timestamp, double precision) and SQLite (text, REAL) keep both
already: nothing changes there. Values stored before this revision keep the
precision they were stored with.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql


revision = '0007_mysql_precision'
down_revision = '0006_set_release'
branch_labels = None
depends_on = None

# (table, column, nullable) of every timestamp column at revision 0006.
TIMESTAMPS = (
    ("event", "at", False),
    ("job_run", "created_at", False),
    ("snapshot_set", "deadline", True), ("snapshot_set", "requested_at", False),
    ("snapshot_set", "signalled_at", True), ("snapshot_set", "barrier_at", True),
    ("snapshot_set", "cut_started_at", True), ("snapshot_set", "cut_done_at", True),
    ("snapshot_set", "finished_at", True), ("snapshot_set", "verified_at", True),
    ("snapshot_set", "released_at", True),
    ("volume", "prepared_at", True), ("volume", "created_at", False), ("volume", "refused_at", True),
    ("barrier_ack", "written_at", False), ("barrier_ack", "received_at", False),
    ("barrier_ack", "signalled_at", True),
    ("restore_test", "started_at", False), ("restore_test", "finished_at", True),
    ("snapshot", "cut_started_at", False), ("snapshot", "cut_at", False),
)
SECONDS = (("snapshot_set", "skew_seconds"), ("restore_test", "time_to_first_step"))


def _mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if not _mysql():
        return
    for table, column, nullable in TIMESTAMPS:
        op.alter_column(table, column, type_=mysql.DATETIME(fsp=6), existing_type=sa.DateTime(),
                        existing_nullable=nullable)
    for table, column in SECONDS:
        op.alter_column(table, column, type_=mysql.DOUBLE(), existing_type=sa.Float(), existing_nullable=True)


def downgrade() -> None:
    if not _mysql():
        return
    for table, column in SECONDS:
        op.alter_column(table, column, type_=sa.Float(), existing_type=mysql.DOUBLE(), existing_nullable=True)
    for table, column, nullable in TIMESTAMPS:
        op.alter_column(table, column, type_=sa.DateTime(), existing_type=mysql.DATETIME(fsp=6),
                        existing_nullable=nullable)
