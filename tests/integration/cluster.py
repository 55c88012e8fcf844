"""The integration tests' side of a dev cluster: start one for a test (a
failure under CI when it cannot start, a skip with the reason locally), a
state dir the test users can reach, and what must be gone after `down`
(mounts, loop devices, namespaces, processes). The driver the tests and the
benchmarks share is testkit/cluster.py.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from testkit.cluster import Cluster, ClusterError


def mounts_under(prefix: Path) -> list[str]:
    """Mount points under prefix, from /proc/mounts (octal escapes decoded)."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[1])
        if target == str(prefix) or target.startswith(str(prefix) + "/"):
            out.append(target)
    return out


def loops_backed_by(prefix: Path) -> list[str]:
    """Loop devices whose backing file is under prefix (losetup -a)."""
    proc = subprocess.run(["/usr/sbin/losetup", "-a", "-n", "-O", "NAME,BACK-FILE", "--list"],
                          capture_output=True, text=True, timeout=30)
    out = []
    for line in proc.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(str(prefix) + "/"):
            out.append(parts[0])
    return out


def processes_using(prefix: Path) -> list[int]:
    """PIDs whose cwd or an open file is under prefix."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            links = [os.readlink(d / "cwd")] + [os.readlink(fd) for fd in (d / "fd").iterdir()]
        except OSError:
            continue
        if any(link == str(prefix) or link.startswith(str(prefix) + "/") for link in links):
            found.append(int(d.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is gone for our purposes.
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


# --- starting clusters from tests ---------------------------------------------

def unavailable(reason: str):
    """Fail under CI, skip (with the reason shown by -ra) locally."""
    from realcomponents import require

    require(False, f"dev cluster unavailable: {reason}")


def new_state_dir(prefix: str = "slurm-snap-it-") -> Path:
    """A state dir the test users can traverse: not under /root, not in pytest's 0700 tmp."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(tempfile.gettempdir())
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    path.chmod(0o755)
    return path


def remove_state_dir(path: Path) -> None:
    """Delete a test's state dir, but never through a live mount or loop device."""
    if mounts_under(path) or loops_backed_by(path):
        return
    shutil.rmtree(path, ignore_errors=True)


def default_inventory() -> str:
    return os.environ.get("SLURM_SNAP_TEST_INVENTORY", "postgres")


def namespace_inodes(cluster: Cluster) -> set[str]:
    """"net:[N]"/"mnt:[N]" of every namespace of the cluster, as /proc/PID/ns/* shows them."""
    out = set()
    for kind, path in cluster.namespace_files():
        try:
            out.add(f"{kind}:[{os.stat(path).st_ino}]")
        except OSError:
            pass
    return out


def processes_in(inodes: set[str]) -> list[int]:
    """PIDs living in any of these namespaces."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        for kind in ("net", "mnt"):
            try:
                if os.readlink(d / "ns" / kind) in inodes:
                    found.append(int(d.name))
                    break
            except OSError:
                continue
    return found


def netns_named(tag: str) -> list[str]:
    return sorted(p.name for p in Path("/run/netns").glob(f"{tag}-*")) if Path("/run/netns").is_dir() else []


def root_links_named(tag: str) -> list[str]:
    """Interfaces of the root namespace whose name carries the cluster's tag (there must be none, ever)."""
    return sorted(p.name for p in Path("/sys/class/net").iterdir() if tag in p.name)


def start_cluster(state: Path, *extra: str) -> Cluster:
    if os.geteuid() != 0:
        unavailable("needs root (loop devices, mounts, daemons)")
    try:
        return Cluster.up(state, *extra)
    except (ClusterError, OSError) as exc:
        unavailable(str(exc))
    except Exception as exc:  # e.g. TimeoutExpired: still a reason to report, not a crash
        unavailable(f"{type(exc).__name__}: {exc}")


def session_cluster(*extra: str, package: Path | None = None):
    """A fixture's body: a cluster up on a fresh state dir for the session
    (`up` with `extra`), always `down` and removed afterwards. With a
    `package` (.deb), `up --package` installs it on the machine and Slurm
    runs its files; it is purged after `down`."""
    import sys

    state = new_state_dir()
    try:
        yield start_cluster(state, "--inventory", default_inventory(), *extra,
                            *(("--package", str(package)) if package else ()))
    finally:
        proc = Cluster(state=state, env={}).down() if (state / "etc").exists() else None
        if proc is not None and proc.returncode != 0:
            sys.stderr.write(f"dev-cluster down {state} failed:\n{proc.stderr}\n")
        remove_state_dir(state)
        if package:
            import packages
            packages.purge_from_machine()
