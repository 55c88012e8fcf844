"""What tests and benchmarks need from the inventory beyond the product's
verbs: reads composed of those verbs (so the tests exercise the queries the
product runs), and bulk seeding for large synthetic inventories.

Imported as `testkit.inventory_helpers` by both.
"""
from __future__ import annotations

from typing import Sequence

from slurm_snap.inventory.models import JobRun, Snapshot, SnapshotSet, Volume
from slurm_snap.inventory.records import SetFilter

_TABLES = {"job_run": JobRun, "snapshot_set": SnapshotSet, "snapshot": Snapshot, "volume": Volume}


def sets_of_job(repo, job_id: int, restart_count: int | None = None) -> list[SnapshotSet]:
    """Every set of the job (or of one run), in creation order, through the
    report's own query."""
    f = SetFilter(job_runs=[(job_id, restart_count)]) if restart_count is not None else SetFilter(job_ids=[job_id])
    rows = repo.report_set_rows(f, with_parts=False)
    return sorted((repo.get_set(r["set_id"]) for r in rows), key=lambda st: st.id)


def restore_tests(repo, set_id: int) -> list:
    """The set's restore drills, oldest first, as `show` loads them."""
    return sorted(repo.report_set_detail(set_id).restore_tests, key=lambda rt: rt.id)


def bulk_seed(repo, table: str, rows: Sequence[dict]) -> None:
    """Insert many rows in one executemany: synthetic data for benchmarks and
    load tests, never how the product writes (its verbs keep the invariants)."""
    if rows:
        repo.s.execute(_TABLES[table].__table__.insert(), list(rows))


def reset_pg(url: str) -> None:
    """An empty public schema: a server database as `db upgrade` first finds it."""
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    eng.dispose()


def reset_mariadb(url: str) -> None:
    """Every table of the database dropped: as `db upgrade` first finds it."""
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.begin() as conn:
        names = [r[0] for r in conn.execute(text(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"))]
        conn.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
        for name in names:
            conn.execute(text(f"DROP TABLE `{name}`"))
        conn.execute(text("SET FOREIGN_KEY_CHECKS = 1"))
    eng.dispose()
