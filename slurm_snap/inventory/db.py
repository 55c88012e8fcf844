"""Engine and session for the inventory, and schema migrations.

SQLite is the default and must live on a local disk: WAL needs shared memory
that network filesystems do not provide, so a SQLite file on NFS or Lustre is
refused here rather than corrupted later.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sqlite3
import urllib.parse
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InventoryError, InventoryNotInitialised, InventoryNotReadable

# The newest migration (migrations/versions). Commands and hooks compare the
# database's revision with this before their first transaction instead of
# asking alembic, whose import alone would cost a hook more than its query;
# a unit test keeps it equal to alembic's head.
SCHEMA_HEAD = "0012_job_sluid"

# statfs f_type of filesystems where SQLite's locking and WAL are unsafe.
NETWORK_FS = {
    0x6969: "nfs",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x00C36400: "cephfs",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x65735546: "fuse",
    0x564C: "ncpfs",
}


_libc = None


def _statfs_type(path: str) -> int | None:
    global _libc
    if _libc is None:
        # The running program's own symbols (libc among them): no
        # ctypes.util.find_library, which forks `ldconfig -p` on every call
        # (~10 ms; it ran for every SQLite engine a command or hook made).
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            return None
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64
    if _libc.statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def network_fs_of(path: str) -> str | None:
    """Name of the network filesystem `path` (or its nearest existing parent) is on."""
    p = Path(path)
    # os.path.exists, not Path.exists: a parent this user may not search
    # (EACCES) means "look higher", never an exception.
    while not os.path.exists(p) and p != p.parent:
        p = p.parent
    return NETWORK_FS.get(_statfs_type(str(p)) or 0)


def sqlite_path(url: str) -> str | None:
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return None
    return u.database or ":memory:"


def make_engine(url: str, *, busy_timeout: float = 30.0, create: bool = False) -> Engine:
    """An engine for the inventory at `url`. Only `create=True` (db upgrade)
    may make a SQLite file or its directory: for everyone else a missing
    file is an inventory not initialised, never an empty one made on the
    spot for the next query to fail on."""
    try:
        u = make_url(url)
    except ArgumentError:
        raise InventoryError(url=url, why="not a database URL") from None
    if u.get_backend_name() == "sqlite":
        return _sqlite_engine(url, u.database or ":memory:", busy_timeout, create)
    extra = {}
    if u.get_backend_name() in ("mysql", "mariadb"):
        # InnoDB's default REPEATABLE READ reads every SELECT of a transaction
        # from its first snapshot: a node Epilog whose insert of the preemption
        # set lost the race to EpilogSlurmctld's then could not see the winner's
        # row (seen on the dev cluster: "internal error in preempt-open").
        # READ COMMITTED is PostgreSQL's default: one semantics on both servers.
        extra["isolation_level"] = "READ COMMITTED"
    try:
        return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4,
                             connect_args=_server_connect_args(u), **extra)
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise InventoryError(url=_redact(url), why=f"database driver missing ({exc})") from None


def _server_connect_args(u) -> dict:
    backend = u.get_backend_name()
    if backend == "postgresql":
        return {"connect_timeout": 10}
    if backend in ("mysql", "mariadb"):
        return {"connect_timeout": 10}
    return {}


def _sqlite_engine(url: str, database: str, busy_timeout: float, create: bool) -> Engine:
    engine_url = url
    if database != ":memory:":
        _check_access(url, database)
        fs = network_fs_of(database)
        if fs:
            raise InventoryError(url=url, why=f"SQLite file is on a {fs} filesystem; it must be on a local disk "
                                              "(use PostgreSQL/MariaDB for a shared inventory)")
        parent = os.path.dirname(os.path.abspath(database))
        if create and not os.path.isdir(parent):
            try:
                os.makedirs(parent, mode=0o750, exist_ok=True)
            except OSError as exc:
                raise InventoryError(url=url, why=f"cannot create {parent}: {exc.strerror}") from None
        if not create:
            # SQLite's own "open, never create" (mode=rw): even a file removed
            # between our check and the connect is not silently re-made.
            engine_url = make_url(url).set(
                database=f"file:{urllib.parse.quote(os.path.abspath(database), safe='/')}",
                query={**make_url(url).query, "mode": "rw", "uri": "true"})
    engine = create_engine(engine_url, connect_args={"timeout": busy_timeout, "isolation_level": None})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record):
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA foreign_keys = ON")
        # NORMAL is durable across process crashes in WAL mode; FULL only adds
        # power-loss protection for the last transaction at a large fsync cost.
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()
        if database != ":memory:":
            _restrict_mode(database)

    @event.listens_for(engine, "begin")
    def _begin(conn):
        # Writers take the write lock up front: a deferred transaction that
        # upgrades from read to write fails with "database is locked" instead
        # of waiting. Readers (report, show) stay deferred so WAL lets them
        # run beside a writer.
        if conn.get_execution_options().get("slurm_snap_readonly"):
            conn.exec_driver_sql("BEGIN")
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _check_access(url: str, database: str) -> None:
    """The file root keeps private (0600, often in a 0700 directory, as the
    install guide makes it): an ordinary user who opens it is told so in one
    sentence before any stat() or SQLite call fails on it with EACCES."""
    try:
        os.stat(database)
    except FileNotFoundError:
        return      # "not initialised" is check_ready_file's (and `db upgrade` creates it)
    except PermissionError:
        raise InventoryNotReadable(url=_redact(url), why=f"permission denied on {os.path.dirname(database) or '.'}",
                                   user=_user_name()) from None
    except OSError:
        return      # anything else is for SQLite to name
    if not os.access(database, os.R_OK | os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        # Even a reader needs write access: WAL readers write the -shm index.
        raise InventoryNotReadable(url=_redact(url), why=f"permission denied on {database}", user=_user_name())


def _user_name() -> str:
    import pwd

    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _restrict_mode(database: str) -> None:
    # The inventory maps every user's jobs to their data: not world-readable.
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.chmod(database + suffix, 0o600)


def _redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def migrations_dir() -> str:
    return str(Path(__file__).with_name("migrations"))


def alembic_config(engine: Engine):
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", migrations_dir())
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Create or migrate the schema; returns the revision now current."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    try:
        command.upgrade(alembic_config(engine), revision)
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision() or ""
    except DBAPIError as exc:
        raise InventoryError(url=_redact(str(engine.url)), why=str(exc.orig).strip()) from None


def check_ready(engine: Engine, url: str) -> None:
    """Raise InventoryNotInitialised unless the database exists and its schema
    is at SCHEMA_HEAD. One query (the alembic_version row); creates nothing."""
    shown = _redact(url)
    check_ready_file(url)
    try:
        rev = _read_revision(engine, url)
    except sqlite3.Error as exc:
        if "no such table" in str(exc):
            raise InventoryNotInitialised(url=shown, why="it has no slurm-snap schema") from None
        raise InventoryError(url=shown, why=str(exc)) from None
    except DBAPIError as exc:
        msg = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        # A database without the version table has no schema at all (empty
        # file, empty server database); anything else is the server's trouble.
        if _is_missing_table(exc):
            raise InventoryNotInitialised(url=shown, why="it has no slurm-snap schema") from None
        raise InventoryError(url=shown, why=msg) from None
    if rev != SCHEMA_HEAD:
        raise InventoryNotInitialised(url=shown, why=f"its schema is at revision {rev or '(none)'}, this "
                                                     f"slurm-snap needs {SCHEMA_HEAD}")


def _read_revision(engine: Engine, url: str) -> str | None:
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and (u.database or ":memory:") != ":memory:":
        # Read-only and without the engine's connect pragmas: switching an
        # empty file to WAL would already be writing to it.
        path = urllib.parse.quote(os.path.abspath(u.database), safe="/")
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            conn.close()
        return row[0] if row else None
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()


def check_ready_file(url: str) -> None:
    """A SQLite inventory's file must exist before anything connects to it."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and (u.database or ":memory:") != ":memory:":
        path = os.path.abspath(u.database)
        if not os.path.exists(path):
            raise InventoryNotInitialised(url=_redact(url), why=f"no database at {path}")


def _is_missing_table(exc: DBAPIError) -> bool:
    text = str(exc.orig).lower()
    # sqlite3, PostgreSQL (UndefinedTable, 42P01), MySQL/MariaDB (1146)
    return ("no such table" in text or "does not exist" in text or "doesn't exist" in text
            or getattr(exc.orig, "pgcode", None) == "42P01"
            or (getattr(exc.orig, "args", None) or [None])[0] == 1146)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(None)).get_current_head() or ""
