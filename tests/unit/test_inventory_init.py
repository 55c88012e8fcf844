"""Only `slurm-snap db upgrade` creates or migrates the inventory (issue 21 item 5).

A mistyped URL (a directory that does not exist), an empty database or one
at an older schema revision is reported as "not initialised: run `slurm-snap
db upgrade`" with exit 9 by every command, and recorded as such by every hook
(which still exits 0 under policy open), and nothing is created on disk: no
directory, no empty inventory.db for the next command to trip over with
"no such table: job_run".
"""
from __future__ import annotations

import json
import os

import pytest

from slurm_snap import errors
from slurm_snap.cli import main
from slurm_snap.inventory import db
from slurm_snap.inventory.repository import Inventory

NOT_INITIALISED = "not initialised: run `slurm-snap db upgrade`"


def write_cfg(tmp_path, url, policy="open") -> str:
    p = tmp_path / f"c-{policy}.toml"
    p.write_text(f"[inventory]\nurl = '{url}'\n[hooks]\nfailure_policy = '{policy}'\n"
                 f"[paths]\nlog_dir = '{tmp_path}/log'\nbarrier_dir = '{tmp_path}/barriers'\n"
                 "[access]\noperator_users = ['root']\n")
    return str(p)


def hook_env(monkeypatch, job_id=55):
    for k, v in {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
                 "SLURMD_NODENAME": "", "SLURM_JOB_NODELIST": "n1", "SPANK_SLURM_SNAP": "1",
                 "SPANK_SLURM_SNAP_ON_PREEMPT": "1", "SPANK_SLURM_SNAP_VOLUMES": ""}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SUDO_UID", raising=False)


# A user's or an admin's command on each kind of inventory that is not there.
COMMANDS = {
    "report": ["report", "-a"],
    "report-job": ["report", "-j", "55"],
    "show": ["show", "55"],
    "snapshot": ["snapshot", "55", "--consistency", "crash"],
    "restore-test": ["restore-test", "55", "--command", "/bin/true"],
    "prune": ["prune", "--keep-last", "1"],
    "repair": ["repair"],
    "metrics": ["metrics"],
    "db-status": ["db", "status"],
}


def _missing_dir(tmp_path):
    """The issue's case: the config points into a directory that does not exist."""
    path = tmp_path / "no-such-dir" / "inventory.db"
    return f"sqlite:///{path}", path


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_on_a_missing_inventory_exits_9_and_creates_nothing(tmp_path, capsys, monkeypatch, name):
    monkeypatch.delenv("SUDO_UID", raising=False)
    url, path = _missing_dir(tmp_path)
    rc = main(["--config", write_cfg(tmp_path, url), *COMMANDS[name]])
    err = capsys.readouterr().err
    assert rc == errors.INVENTORY, err
    assert NOT_INITIALISED in err and str(path) in err
    assert not path.parent.exists()


# The hooks that open the inventory for any opted-in job (the node Prolog of
# a first run and the epilogs of a job that was not preempted never do).
@pytest.mark.parametrize("hook", ["prolog-slurmctld", "prolog-slurmctld-record"])
@pytest.mark.parametrize("policy,status", [("open", 0), ("closed", 1)])
def test_a_hook_on_a_missing_inventory_records_why_and_creates_nothing(tmp_path, capsys, monkeypatch, hook,
                                                                       policy, status):
    from slurm_snap.hooks.run import run_named

    url, path = _missing_dir(tmp_path)
    hook_env(monkeypatch)
    cfg = write_cfg(tmp_path, url, policy)
    rc = run_named(cfg, hook)
    err = capsys.readouterr().err
    assert rc == status, err
    assert NOT_INITIALISED in err
    log = [json.loads(x) for x in (tmp_path / "log" / "hooks.log").read_text().splitlines()]
    assert log[-1]["status"] == "failed" and NOT_INITIALISED in log[-1]["message"]
    assert "no such table" not in json.dumps(log)
    assert not path.parent.exists()


def test_an_empty_sqlite_file_is_not_initialised_and_stays_empty(tmp_path, capsys):
    path = tmp_path / "inventory.db"
    path.write_bytes(b"")
    rc = main(["--config", write_cfg(tmp_path, f"sqlite:///{path}"), "report", "-a"])
    err = capsys.readouterr().err
    assert rc == errors.INVENTORY and NOT_INITIALISED in err and "no such table" not in err
    assert path.stat().st_size == 0


def test_an_older_schema_is_not_initialised_naming_both_revisions(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/inventory.db"
    engine = db.make_engine(url, create=True)
    db.upgrade(engine, "0002_report_indexes")
    engine.dispose()
    rc = main(["--config", write_cfg(tmp_path, url), "report", "-a"])
    err = capsys.readouterr().err
    assert rc == errors.INVENTORY and NOT_INITIALISED in err
    assert "0002_report_indexes" in err and db.SCHEMA_HEAD in err
    assert Inventory(url).revision() == "0002_report_indexes"   # reading it migrated nothing


def test_db_upgrade_is_what_creates_it(tmp_path, capsys):
    url, path = _missing_dir(tmp_path)
    cfg = write_cfg(tmp_path, url)
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    assert path.exists() and f"schema at revision {db.SCHEMA_HEAD}" in capsys.readouterr().out
    assert main(["--config", cfg, "db", "status"]) == 0
    assert main(["--config", cfg, "report", "-a"]) == 0


def test_the_code_knows_the_newest_migration_without_importing_alembic():
    """The hooks check the schema on their hot path by comparing with this constant."""
    assert db.SCHEMA_HEAD == db.head_revision()


@pytest.mark.postgres
def test_an_empty_server_database_is_not_initialised(tmp_path, capsys):
    from sqlalchemy import create_engine, text

    from realcomponents import pg_url, require

    url = pg_url()
    require(bool(url), "no PostgreSQL (SLURM_SNAP_TEST_PG_URL)")
    from sqlalchemy.engine import make_url

    name = f"slurmsnap_init_{os.getpid()}"
    admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        empty = make_url(url).set(database=name).render_as_string(hide_password=False)
        rc = main(["--config", write_cfg(tmp_path, empty), "report", "-a"])
        err = capsys.readouterr().err
        assert rc == errors.INVENTORY and NOT_INITIALISED in err
        eng = create_engine(empty)
        with eng.connect() as conn:   # nothing was created in it
            assert conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")).scalar() == 0
        eng.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def test_the_migrations_build_exactly_the_models_schema(inventory):
    """A column added to models.py without a migration (or the reverse), or a
    type a server stores differently (MariaDB's second-precision DATETIME and
    4-byte FLOAT), is a schema only fresh test databases have: compare what
    `db upgrade` builds with the models, as alembic's autogenerate would, on
    every database."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from slurm_snap.inventory.models import Base

    with inventory.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def test_timestamps_keep_microseconds_and_seconds_are_doubles(inventory):
    """What the schema comparison cannot see: values read back as written
    (MariaDB kept 03:47:25 and 2.17629 before migration 0007)."""
    import datetime as dt

    at = dt.datetime(2026, 12, 2, 3, 47, 25, 909287, tzinfo=dt.timezone.utc)
    with inventory.session() as repo:
        run = repo.record_job_run(job_id=7, restart_count=0, user_name="a", uid=1, partition="p", nodes=["n1"])
        st, _ = repo.create_set(run, epoch="m-1", trigger="manual", wanted="app", deadline=at, owner="t",
                                requested_at=at)
        repo.update_set(st.id, skew_seconds=2.176293601999987)
        set_id = st.id
    with inventory.session(readonly=True) as repo:
        st = repo.get_set(set_id)
        assert (st.requested_at, st.skew_seconds) == (at, 2.176293601999987)


def test_opening_a_sqlite_inventory_forks_nothing(tmp_path, monkeypatch):
    """The network-filesystem check reads statfs through the program's own
    libc: ctypes.util.find_library forked `ldconfig -p` for every engine
    (690 times in one unit-suite run), on every command's and hook's path."""
    import subprocess

    import dbtemplates

    url = dbtemplates.sqlite(tmp_path / "inv.db")

    def forbidden(*_a, **_k):
        raise AssertionError("a subprocess was started")

    monkeypatch.setattr(subprocess.Popen, "__init__", forbidden)
    for _ in range(2):
        inv = Inventory(url)
        with inv.session(readonly=True) as repo:
            repo.report_job_owners([1])
        inv.dispose()
    assert db.network_fs_of(str(tmp_path)) is None           # a local disk
    assert isinstance(db._statfs_type("/"), int)
