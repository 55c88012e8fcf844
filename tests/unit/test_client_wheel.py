"""The rank-side client's own wheel, slurm-snap-client (issue 34, docs/client.md):
it holds the client and exactly what the client imports, installs offline
into a clean venv without the rest of slurm-snap, and a rank there commits a
checkpoint whose acknowledgement the coordinator's parser accepts."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import venv
import zipfile
from pathlib import Path

import pytest

from slurm_snap.jobrecords.ack import Ack

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("client_wheel", ROOT / "packaging" / "client_wheel.py")
client_wheel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(client_wheel)

pytestmark = pytest.mark.slow(5)   # seconds idle: the unit run starts this file early (tests/conftest.py)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return client_wheel.build(ROOT, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory, wheel) -> Path:
    """A venv of the system's Python with pip only, the wheel installed
    without an index: nothing of slurm-snap's dependencies can be there."""
    where = tmp_path_factory.mktemp("venv") / "v"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(where)
    py = where / "bin" / "python"
    r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                        str(wheel)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return py


def test_wheel_holds_the_client_and_only_what_it_imports(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    code = {n for n in names if n.endswith(".py")}
    client = {p.relative_to(ROOT).as_posix() for p in (ROOT / "slurm_snap/client").glob("*.py")}
    assert client <= code
    # Nothing of the coordinator, inventory, CLI or backends.
    for heavy in ("slurm_snap/cli/", "slurm_snap/inventory/", "slurm_snap/protocol/", "slurm_snap/backends/",
                  "slurm_snap/config.py", "slurm_snap/service/"):
        assert not any(n.startswith(heavy) for n in code), heavy
    # Each module outside client/ is there because the closure needs it.
    assert code == {p.relative_to(ROOT).as_posix() for p in client_wheel.closure(ROOT)}
    meta = zipfile.ZipFile(wheel).read(f"slurm_snap_client-{client_wheel.version(ROOT)}.dist-info/METADATA").decode()
    assert "Name: slurm-snap-client" in meta and "Requires-Dist" not in meta and "License: Apache-2.0" in meta
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_the_same_tree_gives_the_same_wheel(wheel, tmp_path):
    assert client_wheel.build(ROOT, tmp_path).read_bytes() == wheel.read_bytes()


RANK = r"""
import json, os, sys
from slurm_snap.client import Checkpointer
barrier, files = sys.argv[1], sys.argv[2:]
ck = Checkpointer(env={}, barrier_dir=barrier, job_id="42", node="n1", rank=0, local_rank=0, local_size=1)
path = ck.commit(7, files)
heavy = sorted(m for m in ("click", "sqlalchemy", "paramiko", "alembic", "torch", "numpy") if m in sys.modules)
try:
    import slurm_snap.cli
    cli = "importable"
except ImportError as exc:
    cli = type(exc).__name__
print(json.dumps({"ack": path, "heavy": heavy, "cli": cli}))
"""


def test_a_rank_commits_in_a_clean_venv(clean_venv, tmp_path):
    r = subprocess.run([clean_venv, "-m", "pip", "list", "--format=json"], capture_output=True, text=True)
    installed = {d["name"].lower() for d in json.loads(r.stdout)}
    assert "slurm-snap-client" in installed and not installed & {"slurm-snap", "click", "sqlalchemy", "paramiko"}
    barrier = tmp_path / "barrier"
    (barrier / "42").mkdir(parents=True, mode=0o700)
    weights = tmp_path / "step-7.pt"
    weights.write_bytes(b"w" * 100)
    r = subprocess.run([clean_venv, "-c", RANK, str(barrier), str(weights)], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["heavy"] == [] and out["cli"] == "ModuleNotFoundError"
    # The coordinator (this full install) accepts what the wheel's client wrote.
    ack = Ack.from_bytes(Path(out["ack"]).read_bytes(), "42", "preempt-0")
    assert (ack.node, ack.rank, ack.step) == ("n1", 0, 7)
    assert [e.path for e in ack.manifest] == [str(weights)]
