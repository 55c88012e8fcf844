"""Fixtures shared by every test.

`require(ok, reason)`: a real component (Slurm, btrfs, sshd, PostgreSQL,
torch) that is missing is a FAILURE when CI=true and a skip that prints its
reason otherwise: a green CI must never hide an untested path.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realcomponents import in_ci, mariadb_url, pg_url, require  # noqa: E402,F401


_TEST_RUN_CHOICES = frozenset({"SLURM_SNAP_SLURM", "SLURM_SNAP_SLURM_PREFIX", "SLURM_SNAP_VENV",
                               "SLURM_SNAP_LONG", "SLURM_SNAP_FIGURES"})


def pytest_collection_modifyitems(config, items):
    """The long fault suite (marked `long`) runs only as `scripts/test --long`
    (SLURM_SNAP_LONG=1): deselected, not skipped, in every other run, so CI
    neither pays for it nor reports it as a skip."""
    if os.environ.get("SLURM_SNAP_LONG") != "1":
        long = [item for item in items if item.get_closest_marker("long") is not None]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [item for item in items if item.get_closest_marker("long") is None]
    if hasattr(config, "workerinput"):      # a pytest-xdist worker: scripts/test's unit run
        _slow_files_first(items)


def _slow_files_first(items) -> None:
    """Files with a test marked `slow` run first, the slowest first (the
    marker's seconds, measured idle), the rest after in their own order.
    scripts/test's unit run hands whole files to its pytest-xdist workers in
    this order (--dist loadfile --no-loadscope-reorder): a long file given
    out last, while the other worker has nothing left to take, is the suite's
    wall time (xdist's own order, most tests first, put the few long
    PyTorch and benchmark files at the end). Every worker sorts the same
    collection the same way, as xdist requires."""
    weight: dict[str, float] = {}
    for item in items:
        mark = item.get_closest_marker("slow")
        if mark is not None:
            seconds = float(mark.args[0]) if mark.args else 1.0
            weight[item.nodeid.split("::", 1)[0]] = max(seconds, weight.get(item.nodeid.split("::", 1)[0], 0.0))
    if weight:
        items.sort(key=lambda item: -weight.get(item.nodeid.split("::", 1)[0], 0.0))


@pytest.fixture(autouse=True)
def _scrub_env(monkeypatch):
    """Tests must not pick up the developer's or the CI host's slurm-snap settings.
    Kept: which Slurm and which venv this test run's dev clusters use (read by
    scripts/dev-cluster, not by slurm_snap): a cluster a test starts itself
    must run the same ones as the session's."""
    for key in list(os.environ):
        if key in _TEST_RUN_CHOICES:
            continue
        if key.startswith(("SLURM_SNAP_", "SPANK_")) and not key.startswith("SLURM_SNAP_TEST_"):
            monkeypatch.delenv(key, raising=False)


@pytest.fixture(autouse=True)
def _no_machine_spool():
    """A test's Epilogs keep their spool under the test's own directory
    ([spool] directory), never in the machine's default place."""
    from slurm_snap.config import SpoolConfig

    path = SpoolConfig.directory
    existed = os.path.exists(path)
    yield
    if not existed and os.path.exists(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        pytest.fail(f"the test wrote the machine's spool {path}: give its configuration a [spool] directory")


@pytest.fixture(autouse=True)
def _signal_state():
    """A client installed by a test blocks its request signals in this
    process and starts a sigwait thread: undo both, newest first, and put
    the mask back as it was."""
    import signal

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    if "slurm_snap.client.signals" in sys.modules:
        from slurm_snap.client.signals import SignalFlag

        for flag in reversed(list(SignalFlag.installed)):
            flag.uninstall()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
def inventory(request, tmp_path):
    """A migrated, empty inventory on SQLite, a real PostgreSQL and a real
    MariaDB: a copy of one migrated per session (dbtemplates.py says how)."""
    import dbtemplates
    from sqlalchemy.exc import DBAPIError

    from slurm_snap.inventory.repository import Inventory

    if request.param == "sqlite":
        url = dbtemplates.sqlite(tmp_path / "inventory.db")
    elif request.param == "mariadb":
        server = mariadb_url()
        require(bool(server), "no MariaDB: run scripts/mariadb start /var/tmp/slurm-snap-mariadb --listen 127.0.0.1 "
                              "--port 3307 or set SLURM_SNAP_TEST_MARIADB_URL")
        try:
            url = dbtemplates.mariadb(server)
        except DBAPIError as exc:  # server down
            require(False, f"MariaDB at {server} unreachable: {exc}")
    else:
        server = pg_url()
        require(bool(server), "no PostgreSQL: run scripts/postgres start /var/tmp/slurm-snap-pg "
                              "or set SLURM_SNAP_TEST_PG_URL")
        try:
            url = dbtemplates.postgresql(server)
        except DBAPIError as exc:  # server down
            require(False, f"PostgreSQL at {server} unreachable: {exc}")
    inv = Inventory(url)
    yield inv
    inv.dispose()


@pytest.fixture
def write_config(tmp_path):
    """Write a TOML config into tmp_path and return its path."""

    def _write(text: str, name: str = "slurm-snap.toml") -> str:
        p = tmp_path / name
        p.write_text(text)
        return str(p)

    return _write
