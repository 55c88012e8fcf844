"""Real components for backend tests: filesystems on loop devices, an sshd on loopback.

Everything here is torn down by what it set up: we unmount what we mounted,
detach the loop device we attached and kill the sshd we started, by PID.
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

import pytest

SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
MKFS = {
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
    # reflink is the point of this filesystem for us; crc is required by reflink.
    "xfs": ["mkfs.xfs", "-q", "-f", "-m", "crc=1,reflink=1"],
}
IMAGE_MB = {"btrfs": 256, "xfs": 320}  # mkfs.xfs in xfsprogs >= 5.19 refuses < 300 MB


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(ok: bool, what: str) -> None:
    """Fail (CI) or skip (locally) when a real component is missing."""
    if ok:
        return
    if in_ci():
        pytest.fail(f"CI=true and {what}: a missing real component is a failure here, not a skip")
    pytest.skip(what)


def which(tool: str) -> str | None:
    return shutil.which(tool, path=SBIN)


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)


@dataclass
class LoopFs:
    fstype: str
    image: str
    device: str
    mountpoint: str


@contextlib.contextmanager
def loop_filesystem(fstype: str):
    """A fresh `fstype` on a sparse image, mounted in a temp dir; always cleaned up."""
    require(os.geteuid() == 0, "loop-device filesystems need root")
    for tool in (MKFS[fstype][0], "losetup", "mount", "umount"):
        require(which(tool) is not None, f"{tool} not installed (needed for {fstype} on loop)")
    require(os.path.exists("/dev/loop-control"), "no /dev/loop-control: kernel without loop devices")
    tmp = tempfile.mkdtemp(prefix=f"slurm-snap-{fstype}-")
    image, mnt = os.path.join(tmp, "image"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    device = None
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(IMAGE_MB[fstype] << 20)
        _run([which(MKFS[fstype][0]), *MKFS[fstype][1:], image])
        device = _run([which("losetup"), "--find", "--show", image]).stdout.decode().strip()
        _run([which("mount"), "-t", fstype, device, mnt])
        mounted = True
        yield LoopFs(fstype, image, device, mnt)
    finally:
        if mounted:
            _unmount(mnt)
        if device:
            subprocess.run([which("losetup"), "-d", device], capture_output=True, timeout=30)
        _clear_immutable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def _unmount(mnt: str) -> None:
    for _ in range(50):
        if subprocess.run([which("umount"), mnt], capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(0.1)  # a child we killed may still hold a file open for a moment
    subprocess.run([which("umount"), "-l", mnt], capture_output=True, timeout=30)


def _clear_immutable(path: str) -> None:
    """Immutable files left in a temp dir (not the image) would make rmtree fail."""
    if which("chattr"):
        subprocess.run([which("chattr"), "-R", "-f", "-i", path], capture_output=True, timeout=30)


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
