"""The packages' layout, checked in seconds: packaging/stage, which both
debian/rules and the RPM spec run, lays out on this host everything the
packages hold but the venv, and each file is the tree's or made from it;
the admin's files are the spec's %config files; plugstack.conf names the
staged plugin and helper; logrotate rotates with the staged file.

The packages themselves take minutes: CI also builds
both .debs and installs each into a fresh root (test_package_install.py)
and runs a dev cluster from Debian 12's (test_package_cluster.py); the RPM,
upgrade and purge are the long suite, `scripts/test -m packages tests/integration`
(docs/packaging.md has the figures)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import packages
from packages import ROOT
from realcomponents import require

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    include = Path("/usr/include/slurm/slurm_version.h")
    require(include.is_file(), "Slurm's headers (libslurm-dev) are not installed")
    dest = tmp_path_factory.mktemp("stage") / "root"
    # The test venv's python has slurm_snap of this tree installed: it writes
    # the man pages and completions as the built venv's does in a package.
    r = subprocess.run([str(ROOT / "packaging/stage"), str(dest)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHON_BUILD": sys.executable})
    assert r.returncode == 0, r.stderr[-4000:]
    return dest


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_every_staged_file_is_the_trees_or_made_from_it(staged):
    files = _files(staged)
    same, as_is = packages.tree_copies()
    for packaged, rel in same.items():
        assert (staged / packaged).read_bytes() == packages.tree_after_substitution(rel), f"{packaged} != {rel}"
    for packaged, rel in as_is.items():
        assert (staged / packaged).read_bytes() == (ROOT / rel).read_bytes(), f"{packaged} != {rel}"
    unexplained = sorted(files - set(same) - set(as_is) - set(packages.GENERATED))
    missing = sorted(set(packages.GENERATED) - files)
    assert (unexplained, missing) == ([], [])
    assert os.readlink(staged / "usr/bin/slurm-snap") == packages.HELPER
    # The generated pages are the program's own output.
    from slurm_snap.cli.tomlpage import render
    assert (staged / "usr/share/man/man5/slurm-snap.toml.5").read_text() == render()
    slurm = subprocess.run(["sed", "-n", r's/^#define SLURM_VERSION_NUMBER 0x\(..\)\(..\)\(..\)$/\1\2\3/p',
                            "/usr/include/slurm/slurm_version.h"], capture_output=True, text=True).stdout.strip()
    a, b, c = (int(slurm[i:i + 2], 16) for i in (0, 2, 4))
    assert (staged / "usr/share/slurm-snap/built-for-slurm").read_text() == f"{a}.{b:02d}.{c}\n"
    # The entry points keep their mode; the units name the package's helper.
    for f in (staged / "usr/libexec/slurm-snap").iterdir():
        assert f.stat().st_mode & 0o777 == 0o755, f
    serve = (staged / "usr/lib/systemd/system/slurm-snap-serve.service").read_text()
    assert packages.HELPER in serve and "/opt/slurm-snap" not in serve


def test_the_admins_files_are_the_specs_config_files_and_plugstack_names_staged_files(staged):
    etc = {"/" + f for f in _files(staged) if f.startswith("etc/")}
    spec = (ROOT / "packaging/slurm-snap.spec").read_text()
    # debhelper makes every file under /etc a conffile; the spec says so line by line.
    assert set(re.findall(r"^%config\(noreplace\) (\S+)$", spec, flags=re.M)) == etc
    line = next(ln for ln in (staged / "etc/slurm-snap/plugstack.conf").read_text().splitlines()
                if ln.startswith("required"))
    plugin, helper = line.split()[1], line.split()[2].removeprefix("helper=")
    assert (staged / plugin.lstrip("/")).is_file() and helper == packages.HELPER


def test_logrotate_rotates_the_hooks_log_with_the_staged_file(staged, tmp_path):
    require(subprocess.run(["which", "logrotate"], capture_output=True).returncode == 0,
            "logrotate is not installed")
    conf = (staged / "etc/logrotate.d/slurm-snap").read_text()
    assert "/var/log/slurm-snap/*.log {" in conf
    logs = tmp_path / "log"
    logs.mkdir()
    (tmp_path / "slurm-snap").write_text(conf.replace("/var/log/slurm-snap/", f"{logs}/"))
    (logs / "hooks.log").write_text('{"hook": "epilog"}\n')
    r = subprocess.run(["logrotate", "--force", "--state", str(tmp_path / "state"), str(tmp_path / "slurm-snap")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (logs / "hooks.log.1").read_text() == '{"hook": "epilog"}\n'     # delaycompress: the newest stays plain
    st = (logs / "hooks.log").stat()
    assert st.st_size == 0 and st.st_mode & 0o777 == 0o640, oct(st.st_mode)
