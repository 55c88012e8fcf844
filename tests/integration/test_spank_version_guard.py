"""The SPANK plugin in a Slurm it was not built for (issue 34, spank/version_guard.c):
it loads inert and names both versions, where Slurm's own check would stop
every sbatch and slurmd. Against the real 22.05 sbatch and slurmd of this
machine, with a plugin built for 24.11 (Debian 13's headers, as a site that
compiled for its next Slurm would), and, where 24.11 is installed (CI's
second pass), the Debian 12 package's plugin in 24.11's sbatch."""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import packages
from packages import ROOT, remove_root
from realcomponents import require

pytestmark = [pytest.mark.integration]


@functools.cache
def slurm_2411() -> tuple[Path, Path]:
    """(prefix, plugin directory) of Slurm 24.11 on this machine, as
    scripts/lib-slurm-version.sh, the one place that knows, says: Debian 13's
    binaries under their own prefix, whose compiled-in PluginDir is Debian
    12's (22.05's plugins), so its slurm.conf must name its own."""
    out = subprocess.run(["bash", "-c", 'source "$0"; slurm_install_paths; echo "$SLURM_PREFIX $SLURM_PLUGIN_DIR"',
                          str(ROOT / "scripts/lib-slurm-version.sh")], capture_output=True, text=True, timeout=30,
                         check=True, env={"PATH": "/usr/bin:/bin", "SLURM_SNAP_SLURM": "24.11"})
    prefix, plugin_dir = out.stdout.split()
    return Path(prefix), Path(plugin_dir)


CONF = """ClusterName=guard
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=46917
SlurmdPort=46918
AuthType=auth/munge
SlurmdSpoolDir={d}/spool
SlurmdPidFile={d}/slurmd.pid
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
NodeName=g1 NodeHostname=localhost Port=46919 CPUs=1 State=UNKNOWN
PartitionName=p Nodes=g1 Default=YES
"""


def slurm_dir(tmp_path: Path, plugin: Path, plugin_dir: Path | None = None) -> Path:
    """slurm.conf (naming `plugin_dir` as Slurm's PluginDir if given) and the
    plugstack.conf beside it that loads `plugin` (required)."""
    d = tmp_path / "slurm"
    (d / "spool").mkdir(parents=True)
    (d / "slurm.conf").write_text(CONF.format(d=d) + (f"PluginDir={plugin_dir}\n" if plugin_dir else ""))
    (d / "plugstack.conf").write_text(f"required {plugin} helper=/bin/true config=/etc/slurm-snap/none.toml\n")
    return d


def sbatch(d: Path, *args: str, prefix: str = "/usr") -> subprocess.CompletedProcess:
    return subprocess.run([f"{prefix}/bin/sbatch", *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(d / "slurm.conf")})


@pytest.fixture(scope="module")
def plugin_for_2411(tmp_path_factory) -> Path:
    """The plugin as built on this host against Slurm 24.11's headers: those
    of its prefix (slurm_2411()) where it is installed, else Debian 13's libslurm-dev
    from the packages' trixie build root; its API number from that libslurm."""
    require(shutil.which("cc") is not None, "cc not installed (build-essential)")
    tmp = tmp_path_factory.mktemp("p2411")
    made_root = None
    if (slurm_2411()[0] / "include/slurm/spank.h").exists():
        include, api = slurm_2411()[0] / "include", None
    else:
        made_root = packages.fresh_root("trixie", tmp, kind="build")
        include = tmp / "include"                        # Slurm's headers alone, not Debian 13's libc's
        shutil.copytree(made_root / "usr/include/slurm", include / "slurm")
        sonames = sorted(made_root.glob("usr/lib/x86_64-linux-gnu/libslurm.so.[0-9]*"))
        assert sonames, "no libslurm.so.N in the trixie build root"
        api = sonames[0].name.split(".so.")[1].split(".")[0]   # its libslurm cannot run here (glibc 2.38)
    args = [f"BUILDDIR={tmp}/b", f"SLURM_INCLUDE={include}"] + ([f"SLURM_API={api}"] if api else [])
    r = subprocess.run(["make", "-s", "-C", str(ROOT / "spank"), *args], capture_output=True, text=True, timeout=300)
    if made_root is not None:
        remove_root(made_root)
    assert r.returncode == 0, r.stderr
    return tmp / "b" / "slurm_snap.so"


def test_slurms_own_check_would_stop_every_sbatch(tmp_path):
    """Why the guard exists: a plugin presenting another release is refused
    by Slurm itself, and with it every submission (measured on 22.05)."""
    src = tmp_path / "other.c"
    src.write_text('const char plugin_name[] = "other"; const char plugin_type[] = "spank";\n'
                   "const unsigned int plugin_version = 0x180b05; const unsigned int spank_plugin_version = 1;\n"
                   "int slurm_spank_init(void *sp, int ac, char **av) { return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "other.so"), str(src)], check=True)
    r = sbatch(slurm_dir(tmp_path, tmp_path / "other.so"), "--help")
    assert r.returncode != 0 and "Failed to initialize plugin stack" in r.stderr


def test_built_for_2411_it_is_inert_in_2205s_sbatch(plugin_for_2411, tmp_path):
    d = slurm_dir(tmp_path, plugin_for_2411)
    r = sbatch(d, "--help")
    assert r.returncode == 0 and "--snapshot-on-preempt" in r.stdout, r.stderr
    assert "slurm-snap" not in r.stderr                  # jobs without options are not bothered
    r = sbatch(d, "--snapshot-on-preempt", "--wrap", "true")
    assert r.returncode != 0
    assert "built for Slurm 24.11" in r.stderr and "Slurm 22.05.8 loaded it" in r.stderr, r.stderr
    assert "install the slurm-snap package built for Slurm 22.05" in r.stderr
    # Without an option the submission goes on (and fails only for want of a controller here).
    r = sbatch(d, "--wrap", "true")
    assert "plugin stack" not in r.stderr and "slurm-snap" not in r.stderr, r.stderr


def test_built_for_2411_slurmd_2205_still_starts_and_logs_why(plugin_for_2411, tmp_path):
    require(shutil.which("slurmd") is not None, "slurmd not installed (slurm-wlm)")
    d = slurm_dir(tmp_path, plugin_for_2411)
    proc = subprocess.Popen(["slurmd", "-D", "-N", "g1", "-f", str(d / "slurm.conf")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        log = d / "slurmd.log"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "slurmd started" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None, f"slurmd exited {proc.returncode}: {log.read_text() if log.exists() else ''}"
            time.sleep(0.2)
        text = log.read_text()
        assert "slurmd started" in text, text
        assert "slurm-snap: this plugin was built for Slurm 24.11" in text and "22.05.8 loaded it" in text
        assert proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slurm
def test_debian_12s_package_plugin_is_inert_in_2411s_sbatch(tmp_path):
    if os.environ.get("SLURM_SNAP_SLURM", "22.05") != "24.11":
        pytest.skip("runs in the Slurm 24.11 tier (SLURM_SNAP_SLURM=24.11 scripts/test --slurm-tier), "
                    "which installs 24.11")
    prefix, plugin_dir = slurm_2411()
    require((prefix / "bin/sbatch").exists(),
            f"Slurm 24.11 not installed in {prefix} (SLURM_SNAP_SLURM=24.11 scripts/test installs it)")
    out = tmp_path / "deb"
    subprocess.run(["dpkg-deb", "-x", str(packages.deb("bookworm")), str(out)], check=True)
    d = slurm_dir(tmp_path, out / "usr/lib/slurm-snap/slurm_snap.so", plugin_dir)
    r = sbatch(d, "--help", prefix=str(prefix))
    assert r.returncode == 0 and "--snapshot-on-preempt" in r.stdout, r.stderr
    r = sbatch(d, "--snapshot-on-preempt", "--wrap", "true", prefix=str(prefix))
    assert r.returncode != 0 and "built for Slurm 22.05" in r.stderr and "Slurm 24.11" in r.stderr, r.stderr
