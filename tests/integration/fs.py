"""Real components for backend tests: filesystems on loop devices, an sshd on loopback.

Everything here is torn down by what it set up: we unmount what we mounted,
detach the loop device we attached and kill the sshd we started, by PID.
The one-host Ceph behind the `cephfs` fixture lives in ceph_cluster.py.
With CI=true a missing component is a test failure; locally it is a skip that
says what is missing.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

from testkit import loopfs
import pytest
from testkit.loopfs import SBIN, LoopFs, which  # noqa: F401  (re-exported for the tests)
# One rule for every real component: fail under CI, skip locally (re-exported for the tests).
from realcomponents import require  # noqa: F401

IMAGE_MB = {"btrfs": 256, "xfs": 320}  # mkfs.xfs in xfsprogs >= 5.19 refuses < 300 MB


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


@contextlib.contextmanager
def loop_filesystem(fstype: str):
    """A fresh `fstype` on a sparse image, mounted in a temp dir; always cleaned up."""
    why = loopfs.missing(fstype)
    require(why is None, why or "")
    with loopfs.mounted(fstype, IMAGE_MB[fstype] << 20, prefix=f"slurm-snap-{fstype}-") as fs:
        yield fs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Sshd:
    host: str
    port: int
    pid: int
    known_hosts: str      # lists this sshd's host key
    wrong_known_hosts: str  # lists a different key for the same host:port
    key_file: str         # root's client key (authorized in a temp authorized_keys)
    user: str = "root"


@contextlib.contextmanager
def sshd_server():
    """Our own sshd on a free 127.0.0.1 port, key auth for root only; killed by PID."""
    require(os.geteuid() == 0, "the test sshd runs as root (privilege separation)")
    for tool in ("sshd", "ssh-keygen"):
        require(which(tool) is not None, f"{tool} not installed (openssh-server/openssh-client)")
    tmp = tempfile.mkdtemp(prefix="slurm-snap-sshd-")
    proc = None
    try:
        keygen = which("ssh-keygen")
        for name in ("host_key", "other_host_key", "client_key"):
            _run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", os.path.join(tmp, name)])
        shutil.copy(os.path.join(tmp, "client_key.pub"), os.path.join(tmp, "authorized_keys"))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        port = free_port()
        config = os.path.join(tmp, "sshd_config")
        with open(config, "w") as f:
            f.write(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {tmp}/host_key
PidFile {tmp}/sshd.pid
AuthorizedKeysFile {tmp}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
LogLevel ERROR
""")
        # -D keeps it in the foreground so the PID we kill is the one we started.
        proc = subprocess.Popen([which("sshd"), "-D", "-e", "-f", config], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "sshd.log"), "w"))
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log = open(os.path.join(tmp, "sshd.log")).read()
                pytest.fail(f"test sshd did not start: {log}")
            time.sleep(0.02)

        def known(keyname: str, path: str) -> str:
            kind, blob = open(os.path.join(tmp, keyname + ".pub")).read().split()[:2]
            with open(path, "w") as f:
                f.write(f"[127.0.0.1]:{port} {kind} {blob}\n")
            return path

        yield Sshd("127.0.0.1", port, proc.pid, known("host_key", os.path.join(tmp, "known_hosts")),
                   known("other_host_key", os.path.join(tmp, "wrong_known_hosts")),
                   os.path.join(tmp, "client_key"))
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def btrfs_fs():
    with loop_filesystem("btrfs") as fs:
        yield fs


@pytest.fixture(scope="session")
def xfs_fs():
    with loop_filesystem("xfs") as fs:
        yield fs


@pytest.fixture(scope="session")
def sshd():
    with sshd_server() as server:
        yield server


ZFS_POOL_MB = 256


@dataclass
class ZfsPool:
    name: str
    mountpoint: str
    started_daemon: bool  # False when a zfs-fuse already running was reused


def _zpool_answers(zpool: str) -> bool:
    try:
        return subprocess.run([zpool, "list", "-H", "-o", "name"], capture_output=True, timeout=10,
                              stdin=subprocess.DEVNULL).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@contextlib.contextmanager
def zfs_fuse_pool():
    """A pool on a sparse image file in a temp dir, served by zfs-fuse.

    zfs-fuse has one daemon per machine (one fixed socket): if one answers
    already we only add and destroy our own pool; otherwise we start the
    daemon in the foreground (-n) so the PID we stop is the one we started.
    Debian's init script needs a runlevel, so it is not used.
    """
    require(os.geteuid() == 0, "zfs-fuse runs as root")
    require(os.path.exists("/dev/fuse"), "/dev/fuse is missing (zfs-fuse needs FUSE)")
    tools = {t: which(t) for t in ("zfs-fuse", "zpool", "zfs")}
    for tool, path in tools.items():
        require(path is not None, f"{tool} not installed (apt-get install zfs-fuse)")
    zpool = tools["zpool"]
    tmp = tempfile.mkdtemp(prefix="slurm-snap-zfs-")
    proc = None
    pool = f"sstest{os.getpid()}"
    created = False
    try:
        if not _zpool_answers(zpool):
            log = open(os.path.join(tmp, "zfs-fuse.log"), "w")
            # --no-kstat-mount: no /zfs-kstat mount left behind on this machine.
            proc = subprocess.Popen([tools["zfs-fuse"], "-n", "--no-kstat-mount"], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log)
            deadline = time.monotonic() + 30
            while not _zpool_answers(zpool):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"zfs-fuse did not start (status {proc.poll()}): "
                                f"{open(os.path.join(tmp, 'zfs-fuse.log')).read()}")
                time.sleep(0.2)
        image, mnt = os.path.join(tmp, "pool.img"), os.path.join(tmp, "mnt")
        os.mkdir(mnt)
        with open(image, "wb") as f:
            f.truncate(ZFS_POOL_MB << 20)
        _run([zpool, "create", "-m", mnt, pool, image])
        created = True
        yield ZfsPool(pool, mnt, proc is not None)
    finally:
        failure = _destroy_pool(zpool, pool) if created else None
        if proc is not None:
            proc.send_signal(signal.SIGTERM)  # zfs-fuse exports its pools and exits, in ~3 s
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if failure is None:
            shutil.rmtree(tmp, ignore_errors=True)
        else:  # the image may still back a pool of a daemon we did not start: keep it
            pytest.fail(f"{failure}; left {tmp} in place")


def _destroy_pool(zpool: str, pool: str) -> str | None:
    """zpool destroy -f, retried: zfs-fuse says "pool is busy" while the FUSE
    unmounts of datasets destroyed just before are still finishing."""
    res = None
    for _ in range(20):
        res = subprocess.run([zpool, "destroy", "-f", pool], capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
        if res.returncode == 0:
            return None
        time.sleep(0.25)
    return f"zpool destroy -f {pool} failed: {res.stderr.strip()}"


@pytest.fixture(scope="session")
def zfs_pool():
    with zfs_fuse_pool() as pool:
        yield pool


@pytest.fixture(scope="session")
def cephfs():
    from ceph_cluster import cephfs_cluster  # pulled in only by the tests that ask for Ceph

    with cephfs_cluster() as mounted:
        yield mounted
