"""docs/backup.md, run as written (issue 34): each database's backup block
copies a live inventory, the inventory is destroyed, the restore block
brings it back, and `report` and `show` read back exactly what they read
before. Paths and credentials are the only substitutions."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from realcomponents import mariadb_url, require
from slurm_snap.cli import report_cmd, show_cmd
from testkit.inventory_helpers import reset_mariadb, reset_pg
from realcomponents import pg_url, require
from test_report_seed import ROOT, invoke, seed, write_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "backup.md"
HELPER = Path(sys.executable).with_name("slurm-snap")


pytestmark = pytest.mark.slow(9)   # seconds idle: the unit run starts this file early (tests/conftest.py)


def blocks(section: str) -> tuple[str, str]:
    """The (backup, restore) shell blocks under `## section`."""
    text = DOC.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for body in re.findall(r"```sh\n(.*?)```", text, re.S):
        first = body.splitlines()[0]
        if first.startswith("# backup") or first.startswith("# restore"):
            found[first.split()[1]] = body
    return found["backup"], found["restore"]


def run(script: str, subs: dict[str, str], config: str) -> None:
    for old, new in subs.items():
        script = script.replace(old, new)
    script = re.sub(r"^slurm-snap ", f"{HELPER} --config {config} ", script, flags=re.M)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, f"{script}\n{r.stdout}\n{r.stderr}"


def read_back(config: str) -> tuple[str, str]:
    code, report, _ = invoke(report_cmd.command, ["-a", "-S", "2026-11-01", "--json"], config, ROOT)
    assert code == 0, report
    code, show, _ = invoke(show_cmd.command, ["--json", "1001"], config, ROOT)
    assert code == 0, show
    assert json.loads(report)["sets"], "the seeded inventory reads back empty"
    return report, show


def test_sqlite_online_backup_and_restore(tmp_path):
    live = tmp_path / "lib" / "inventory.db"
    live.parent.mkdir()
    seed(f"sqlite:///{live}")
    config = write_config(tmp_path, f"sqlite:///{live}", operators=("root",))
    before = read_back(config)
    backup, restore = blocks("SQLite")
    subs = {"/usr/lib/slurm-snap/venv/bin/python": sys.executable,
            "/var/lib/slurm-snap/inventory.db": str(live), "/backup/": f"{tmp_path}/"}
    run(backup, subs, config)
    live.unlink()                                       # the controller's disk is lost
    run(restore, subs, config)
    assert read_back(config) == before


@pytest.fixture
def pg_server():
    """The test PostgreSQL's own database, emptied (pg_restore needs a real server database)."""
    url = pg_url()
    require(bool(url), "no PostgreSQL: run scripts/postgres start /var/tmp/slurm-snap-pg")
    reset_pg(url)
    return url


@pytest.mark.postgres
def test_pg_dump_and_pg_restore(tmp_path, pg_server):
    url = pg_server
    seed(url)
    config = write_config(tmp_path, url, operators=("root",))
    before = read_back(config)
    backup, restore = blocks("PostgreSQL")
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    subs = {"postgresql://slurmsnap:SECRET@dbhost:5432/slurmsnap": libpq, "/backup/": f"{tmp_path}/"}
    run(backup, subs, config)
    reset_pg(url)
    run(restore, subs, config)
    assert read_back(config) == before


@pytest.mark.mariadb
def test_mariadb_dump_and_restore(tmp_path):
    url = mariadb_url()
    require(bool(url), "no MariaDB: scripts/test starts one (SLURM_SNAP_TEST_MARIADB_URL)")
    reset_mariadb(url)
    seed(url)
    config = write_config(tmp_path, url, operators=("root",))
    before = read_back(config)
    backup, restore = blocks("MariaDB / MySQL")
    u = make_url(url)
    subs = {"--host=dbhost --port=3306 --user=slurmsnap --password=SECRET slurmsnap":
            f"--host={u.host} --port={u.port} --user={u.username} --password={u.password} {u.database}",
            "/backup/": f"{tmp_path}/"}
    run(backup, subs, config)
    reset_mariadb(url)
    run(restore, subs, config)
    assert read_back(config) == before
    reset_mariadb(url)
