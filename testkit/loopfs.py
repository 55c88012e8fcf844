"""A fresh filesystem on a loop device, mounted in a temp dir, always cleaned up.

Shared by the tests (tests/integration/fs.py, which decides fail-or-skip when
the machine cannot do it) and the benchmarks (benchmarks/common.py, which
reports "not available"): no pytest here. Only what we attached is detached
and only what we mounted is unmounted.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator

SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
MKFS = {
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
    # reflink is the point of this filesystem for us; crc is required by reflink.
    "xfs": ["mkfs.xfs", "-q", "-f", "-m", "crc=1,reflink=1"],
}
TOOLS = ("losetup", "mount", "umount")


def which(tool: str) -> str | None:
    return shutil.which(tool, path=SBIN)


def missing(fstype: str) -> str | None:
    """Why this machine cannot make a `fstype` on a loop device, or None."""
    if os.geteuid() != 0:
        return "loop-device filesystems need root"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control: kernel without loop devices"
    for tool in (MKFS[fstype][0], *TOOLS):
        if which(tool) is None:
            return f"{tool} not installed (needed for {fstype} on loop)"
    return None


@dataclass
class LoopFs:
    fstype: str
    image: str
    device: str
    mountpoint: str


def _run(argv: list[str], timeout: float = 600) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return proc.stdout


@contextlib.contextmanager
def mounted(fstype: str, size_bytes: int, *, prefix: str, base: str | None = None) -> Iterator[LoopFs]:
    """`fstype` on a sparse image of `size_bytes` in a new temp dir under `base`, mounted."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir=base)
    image, mnt = os.path.join(tmp, "image"), os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    device = None
    is_mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        _run([which(MKFS[fstype][0]), *MKFS[fstype][1:], image])
        device = _run([which("losetup"), "--find", "--show", image]).strip()
        _run([which("mount"), "-t", fstype, device, mnt])
        is_mounted = True
        yield LoopFs(fstype, image, device, mnt)
    finally:
        if is_mounted:
            _unmount(mnt)
        if device:
            subprocess.run([which("losetup"), "-d", device], capture_output=True, timeout=60)
        if which("chattr"):  # immutable files left in the temp dir would make rmtree fail
            subprocess.run([which("chattr"), "-R", "-f", "-i", tmp], capture_output=True, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


def _unmount(mnt: str) -> None:
    for _ in range(50):
        if subprocess.run([which("umount"), mnt], capture_output=True, timeout=60).returncode == 0:
            return
        time.sleep(0.1)  # a child we ran or killed may hold a file open for a moment
    subprocess.run([which("umount"), "-l", mnt], capture_output=True, timeout=60)
