"""`make -C spank` as the admin guide runs it (issue 18): from any working
directory, and from a copy of spank/ alone on a build host, where the
plugin's version comes from the installed helper (or VERSION=)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from realcomponents import require
from slurm_snap import __version__

SPANK = Path(__file__).resolve().parents[2] / "spank"


@pytest.fixture
def alone(tmp_path) -> Path:
    """spank/ copied without the rest of the checkout."""
    require(shutil.which("make") is not None and shutil.which("cc") is not None,
            "make and cc not installed (apt-get install build-essential)")
    require(os.path.exists("/usr/include/slurm/spank.h"), "slurm/spank.h missing (apt-get install libslurm-dev)")
    dst = tmp_path / "spank"
    shutil.copytree(SPANK, dst, ignore=shutil.ignore_patterns("build"))
    return dst


def make(directory: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(directory), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_from_another_directory_the_checkouts_version_is_built_in(tmp_path):
    require(shutil.which("cc") is not None and os.path.exists("/usr/include/slurm/spank.h"),
            "cc or slurm/spank.h missing (apt-get install build-essential libslurm-dev)")
    r = make(SPANK, f"BUILDDIR={tmp_path}/b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert __version__.encode() in (tmp_path / "b/slurm_snap.so").read_bytes()


def test_a_copy_alone_takes_the_installed_helpers_version(alone, tmp_path):
    helper = tmp_path / "slurm-snap"
    # What click's --version prints.
    helper.write_text(f"#!{sys.executable}\nprint('slurm-snap, version 7.7.7')\n")
    helper.chmod(0o755)
    r = make(alone, f"HELPER={helper}", f"BUILDDIR={tmp_path}/b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    so = (tmp_path / "b/slurm_snap.so").read_bytes()
    assert b"7.7.7" in so


def test_a_copy_alone_without_helper_or_version_is_refused_saying_what_to_give(alone, tmp_path):
    r = make(alone, "HELPER=/nonexistent/slurm-snap", f"BUILDDIR={tmp_path}/b", cwd=tmp_path)
    assert r.returncode != 0 and not (tmp_path / "b").exists()
    assert "cannot tell slurm-snap's version" in r.stderr and "VERSION=X.Y.Z" in r.stderr
    r = make(alone, "HELPER=/nonexistent/slurm-snap", "VERSION=9.9.9", f"BUILDDIR={tmp_path}/b", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert b"9.9.9" in (tmp_path / "b/slurm_snap.so").read_bytes()


def _chosen_slurm_include() -> tuple[str, str]:
    """(version, include dir) of the Slurm this test run chose (SLURM_SNAP_SLURM),
    as scripts/lib-slurm-version.sh, the one place that knows, says."""
    lib = SPANK.parent / "scripts" / "lib-slurm-version.sh"
    out = subprocess.run(["bash", "-c", 'source "$0"; slurm_install_paths; echo "$SLURM_SNAP_SLURM $SLURM_INCLUDE"',
                          str(lib)], capture_output=True, text=True, timeout=30, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_SNAP_SLURM": os.environ.get("SLURM_SNAP_SLURM", "")})
    version, include = out.stdout.split()
    return version, include


@pytest.mark.slurm
def test_the_plugin_builds_without_warnings_against_the_chosen_slurms_headers(tmp_path):
    """Each supported Slurm's spank.h (22.05: Debian's libslurm-dev; 24.11:
    /opt/slurm-24.11/include) compiles the plugin with -Werror on top of the
    Makefile's warnings; CI runs this once per version."""
    version, include = _chosen_slurm_include()
    require(shutil.which("cc") is not None and os.path.exists(f"{include}/slurm/spank.h"),
            f"cc or {include}/slurm/spank.h missing (Slurm {version}: scripts/dev-cluster up installs it)")
    env = {**os.environ, "CFLAGS": "-O2 -g -Werror"}  # the environment's CFLAGS keeps the Makefile's += warnings
    r = subprocess.run(["make", "-C", str(SPANK), f"BUILDDIR={tmp_path}/b", f"SLURM_INCLUDE={include}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr.lower(), r.stderr
    assert "-Wall" in r.stdout and ("-I" + include in r.stdout) == (include != "/usr/include")
