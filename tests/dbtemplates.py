"""Migrated inventories for tests, built once per test session and copied
per test, instead of running every migration for every test.

Migrating is what a fresh inventory costs: on this 2-core machine about
0.4 s on SQLite, 0.4 s on PostgreSQL and 3 to 8 s on MariaDB (each ALTER
rebuilds its table), for every test of ~600 that start from an empty
inventory. The template is made by the product's own `Inventory.upgrade()`
(so the migrations still build every test's schema, and
test_the_migrations_build_exactly_the_models_schema still compares that
schema with the models), then given to each test as a copy:

  SQLite      a file copy of the checkpointed template (about 1 ms);
  PostgreSQL  CREATE DATABASE ... TEMPLATE into this test process's own
              database (0.1 s idle, 1 s under load); the next test of the
              process takes the same copy when it still is what the
              template gave (tables, columns, indexes, constraints, Alembic
              version, a digest of every table's rows, every sequence's
              position; the other sessions on it ended first), or, for the
              plain migrated template, once its rows are deleted and its
              sequences put back (a few ms); anything else gets a new copy;
  MariaDB     it has no template databases and the test account owns one
              database (one per pytest-xdist worker): the migrated tables
              are emptied (DELETE) and their AUTO_INCREMENT counters put
              back to 1 (about 0.05 s), after
              checking that the schema is still the migrated one (a test
              that changed it gets a full reset and migration instead).

`build` (e.g. report's seed) runs on the template after the migration, so
a seeded inventory is copied too; builders must be deterministic (fixed
times), as copies of one template are the same for every test.
tests/ is on sys.path (conftest.py): import this as `dbtemplates`.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import tempfile
from typing import Callable

_DIR: str | None = None
_SQLITE: dict[str, str] = {}
_PG: dict[tuple[str, str], str] = {}
_PG_COPIES: dict[str, int] = {}
_PG_SHAPES: dict[str, tuple] = {}    # copy -> its state as copied (_pg_state)
_MARIADB_MIGRATED: dict[str, frozenset[str]] = {}
_BUILT: dict[tuple[str, str], object] = {}


def _workdir() -> str:
    global _DIR
    if _DIR is None:
        _DIR = tempfile.mkdtemp(prefix="slurm-snap-dbtemplates-")
        atexit.register(shutil.rmtree, _DIR, True)
    return _DIR


def _migrate(url: str, build: Callable[[str], object] | None, kind: str, key: str) -> None:
    from slurm_snap.inventory.repository import Inventory

    inv = Inventory(url)
    inv.upgrade()
    inv.dispose()
    if build is not None:
        _BUILT[(kind, key)] = build(url)


def built(kind: str, key: str):
    """What `build` returned when it made the template of `key` on `kind`
    ("sqlite" or "postgresql"), e.g. the ids of the rows it seeded."""
    return _BUILT[(kind, key)]


# --- SQLite ----------------------------------------------------------------------------------------

def sqlite(path, *, key: str = "migrated", build: Callable[[str], object] | None = None) -> str:
    """A migrated (then `build`-ed) SQLite inventory at `path`, which must not
    exist yet; returns its URL."""
    path = str(path)
    if os.path.exists(path):
        raise FileExistsError(path)
    template = _SQLITE.get(key)
    if template is None:
        template = os.path.join(_workdir(), f"{key}.db")
        _migrate(f"sqlite:///{template}", build, "sqlite", key)
        # Everything into the main file: a copy of it alone is the whole database.
        conn = sqlite3.connect(template)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        _SQLITE[key] = template
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    shutil.copyfile(template, path)
    os.chmod(path, 0o600)      # as the product leaves it
    return f"sqlite:///{path}"


# --- PostgreSQL ------------------------------------------------------------------------------------

def _pg_admin(url: str):
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    # Through the maintenance database: no session may linger in a template.
    return create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")


def _pg_drop_at_exit(admin, name: str) -> None:
    from sqlalchemy import text

    def drop():
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        except Exception as exc:  # the server was stopped first: nothing left to drop
            print(f"dbtemplates: could not drop {name}: {exc}")

    atexit.register(drop)


def postgresql(server_url: str, *, key: str = "migrated", build: Callable[[str], object] | None = None) -> str:
    """A fresh database of this process on the server of `server_url`, made
    from the migrated (then `build`-ed) template; returns its URL. The
    previous copy of `key` is dropped first (its sessions with it), unless
    it still is what the template gave (then kept) or, the plain migrated
    one, can be emptied in place (_pg_as_copied says when)."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    copy = f"slurmsnap_test_{key}_{os.getpid()}"
    copy_url = make_url(server_url).set(database=copy).render_as_string(hide_password=False)
    if copy in _PG_SHAPES and _pg_as_copied(copy_url, _PG_SHAPES[copy], empty=build is None):
        return copy_url
    _PG_SHAPES.pop(copy, None)
    admin = _pg_admin(server_url)
    try:
        template = _PG.get((server_url, key))
        with admin.connect() as conn:
            if template is None:
                template = f"slurmsnap_tmpl_{key}_{os.getpid()}"
                conn.execute(text(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{template}"'))
                _pg_drop_at_exit(_pg_admin(server_url), template)
                _migrate(make_url(server_url).set(database=template).render_as_string(hide_password=False), build,
                         "postgresql", key)
                _PG[(server_url, key)] = template
            if copy not in _PG_COPIES:
                _pg_drop_at_exit(_pg_admin(server_url), copy)
            _PG_COPIES[copy] = _PG_COPIES.get(copy, 0) + 1
            conn.execute(text(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{copy}" TEMPLATE "{template}"'))
    finally:
        admin.dispose()
    _PG_SHAPES[copy] = _pg_fingerprint(copy_url, empty=build is None)
    return copy_url


_PG_SCHEMA = (
    "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
    "WHERE table_schema = 'public'",
    "SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = 'public'",
    "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE connamespace = 'public'::regnamespace",
    "SELECT version_num FROM alembic_version",
)
_PG_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
_PG_SEQUENCES = "SELECT c.oid::regclass::text FROM pg_class c WHERE c.relkind = 'S' " \
                "AND c.relnamespace = 'public'::regnamespace ORDER BY 1"


def _pg_state(conn, schema: tuple | None = None) -> tuple:
    """What a test could change of a copy: its tables, columns, indexes,
    constraints and Alembic version (`schema` when known), every table's
    rows (a digest, in any order) and every sequence's position."""
    if schema is None:
        schema = tuple(frozenset(conn.exec_driver_sql(q).all()) for q in _PG_SCHEMA)
    rows = tuple((t, conn.exec_driver_sql(
        f'SELECT count(*), md5(coalesce(string_agg(md5(r::text), \'\' ORDER BY md5(r::text)), \'\')) FROM "{t}" r'
    ).one()) for t in conn.exec_driver_sql(_PG_TABLES).scalars().all())
    sequences = tuple((q, conn.exec_driver_sql(f'SELECT last_value, is_called FROM {q}').one())
                      for q in conn.exec_driver_sql(_PG_SEQUENCES).scalars().all())
    return schema, rows, sequences


def _pg_fingerprint(url: str, *, empty: bool) -> tuple:
    from sqlalchemy import create_engine

    eng = create_engine(url)
    try:
        with eng.connect() as conn:
            state = _pg_state(conn)
    finally:
        eng.dispose()
    if empty:
        # Emptying is a faithful reset only while migrations insert no rows.
        left = {t: n for t, (n, _digest) in state[1] if t != "alembic_version" and n}
        assert not left, f"migrations left rows in {left}: dbtemplates.postgresql must restore them"
    return state


def _pg_as_copied(url: str, state: tuple, *, empty: bool) -> bool:
    """Whether the copy at `url` is again what CREATE DATABASE ... TEMPLATE
    gave (`state`): True when it still is, or (`empty`: the migrated
    template, which holds no rows) once its rows are deleted and its
    sequences put back; False where only a new copy will do."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    eng = create_engine(url)
    try:
        with eng.begin() as conn:
            # What DROP DATABASE ... WITH (FORCE) did: nobody else holds a
            # lock, a transaction or a session's setting on it.
            conn.execute(text("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
            now = _pg_state(conn)
            if now == state:
                return True
            if not empty or now[0] != state[0] or [q for q, _v in now[2]] != [q for q, _v in state[2]]:
                return False
            conn.execute(text("SET LOCAL lock_timeout = '5s'"))
            conn.execute(text("SET LOCAL session_replication_role = replica"))   # no foreign-key order to follow
            for table, (n, _digest) in now[1]:
                if n and table != "alembic_version":
                    conn.exec_driver_sql(f'DELETE FROM "{table}"')
            for (seq, value), (_same, was) in zip(now[2], state[2]):
                if value != was:
                    conn.execute(text("SELECT setval(CAST(:seq AS regclass), :v, :called)"),
                                 {"seq": seq, "v": was[0], "called": was[1]})
            return _pg_state(conn, now[0]) == state
    except DBAPIError:
        return False
    finally:
        eng.dispose()


# --- MariaDB ---------------------------------------------------------------------------------------

def _mariadb_tables(conn) -> frozenset[str]:
    from sqlalchemy import text

    return frozenset(r[0] for r in conn.execute(text(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")))


def _mariadb_drop_all(conn) -> None:
    from sqlalchemy import text

    conn.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
    for name in _mariadb_tables(conn):
        conn.execute(text(f"DROP TABLE `{name}`"))
    conn.execute(text("SET FOREIGN_KEY_CHECKS = 1"))


def _mariadb_worker_database(url: str) -> str:
    """`url`'s database, or under pytest-xdist this worker's own
    slurmsnap_test_WORKER on the same server (made if missing: the test
    account owns those names when scripts/test started the server with
    --test-databases), so two workers never empty each other's tables."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker:
        return url
    if not worker.isalnum():
        raise ValueError(f"PYTEST_XDIST_WORKER={worker!r}: not a database name part")
    name = f"slurmsnap_test_{worker}"
    eng = create_engine(url)
    try:
        with eng.begin() as conn:
            conn.execute(text(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4"))
    finally:
        eng.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def mariadb(url: str) -> str:
    """The database of `url` (this worker's own under xdist), as `db upgrade`
    leaves it: migrated once, then emptied per test; returns its URL."""
    from sqlalchemy import create_engine, text

    from slurm_snap.inventory.db import SCHEMA_HEAD

    url = _mariadb_worker_database(url)
    eng = create_engine(url)
    try:
        with eng.begin() as conn:
            tables = _MARIADB_MIGRATED.get(url)
            intact = tables is not None and _mariadb_tables(conn) == tables and conn.execute(
                text("SELECT version_num FROM alembic_version")).scalars().all() == [SCHEMA_HEAD]
            if not intact:
                _mariadb_drop_all(conn)
        if not intact:
            _migrate(url, None, "mariadb", "migrated")
            with eng.begin() as conn:
                tables = _mariadb_tables(conn)
                # Emptying is a faithful reset only while migrations insert no rows.
                for name in sorted(tables - {"alembic_version"}):
                    n = conn.execute(text(f"SELECT count(*) FROM `{name}`")).scalar()
                    assert n == 0, f"migrations left {n} row(s) in {name}: dbtemplates.mariadb must restore them"
            _MARIADB_MIGRATED[url] = tables
            return url
        with eng.begin() as conn:
            conn.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
            for name in sorted(tables - {"alembic_version"}):
                conn.execute(text(f"DELETE FROM `{name}`"))
            conn.execute(text("SET FOREIGN_KEY_CHECKS = 1"))
            # Ids start at 1 again, as in a fresh database (an ALTER per table
            # costs ~50 ms: only those a test wrote to).
            used = conn.execute(text(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE() "
                "AND auto_increment > 1")).scalars().all()
            for name in used:
                conn.execute(text(f"ALTER TABLE `{name}` AUTO_INCREMENT = 1"))
    finally:
        eng.dispose()
    return url
