"""Shared plumbing for the fake storage CLIs in this directory.

Each fake reproduces the documented argv, output format, error text and exit
status of one real tool closely enough to exercise a backend; it keeps its
state in $SLURM_SNAP_FAKE_STATE (a directory) so tests are isolated. Where the
real tool exposes snapshot contents as directories (zfs .zfs/snapshot, GPFS
.snapshots, CephFS .snap) the fake makes real copies, with write bits removed,
so content tests mean something; fakes are NOT filesystems and enforce nothing
for root. They run with `python3 -S` (their shebang): standard library only,
and no site import, which was 40% of each call's start-up here (the
conformance suite calls them about a thousand times).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import sys
import time

ENV = "SLURM_SNAP_FAKE_STATE"


def state_dir() -> str:
    d = os.environ.get(ENV)
    if not d or not os.path.isdir(d):
        die(f"fake: ${ENV} must name an existing directory", 99)
    return d


def die(msg: str, code: int = 1) -> None:
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.exit(code)


@contextlib.contextmanager
def db(tool: str):
    """Load/save <state>/<tool>.json under an exclusive lock."""
    path = os.path.join(state_dir(), f"{tool}.json")
    with open(os.path.join(state_dir(), f".{tool}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = {}
        if os.path.exists(path):
            with open(path) as f:
                data = json.load(f)
        yield data
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


def now() -> int:
    return int(time.time())


def copy_readonly(src: str, dst: str, exclude: str) -> None:
    """Copy a tree as a snapshot would show it: write bits removed."""
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(exclude))
    for root, dirs, files in os.walk(dst, topdown=False):
        for n in files + dirs + [""]:
            p = os.path.join(root, n) if n else root
            if not os.path.islink(p):
                m = os.stat(p).st_mode
                os.chmod(p, m & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def copy_writable(src: str, dst: str, exclude: str) -> None:
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(exclude))
    for root, dirs, files in os.walk(dst):
        for n in files + dirs + [""]:
            p = os.path.join(root, n) if n else root
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)


def remove_tree(path: str) -> None:
    for root, dirs, files in os.walk(path):
        for n in dirs + [""]:
            p = os.path.join(root, n) if n else root
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    shutil.rmtree(path)
