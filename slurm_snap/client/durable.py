"""Making files durable: fsync of files and directories, atomic replacement.

A checkpoint is only worth acknowledging once its bytes and its directory
entries are on stable storage: the snapshot that follows must contain them.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

_HASH_CHUNK = 1 << 20


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync a file or directory by path (read-only open suffices on Linux)."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if directory:
        flags |= os.O_DIRECTORY
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def parent_dirs(path: str, root: str | None) -> list[str]:
    """The directories from `path`'s parent up to `root` (inclusive).

    Without a root, stop at the mount point holding the file: a directory
    entry created anywhere below it (e.g. a new step-N/ directory) must be
    durable too, and nothing above the mount point is part of the volume.
    """
    current = os.path.dirname(path)
    root = os.path.realpath(root) if root else None
    dirs = []
    while True:
        dirs.append(current)
        if root is not None and current == root:
            break
        if root is None and os.path.ismount(current):
            break
        parent = os.path.dirname(current)
        if parent == current:  # reached "/" without meeting the root
            break
        current = parent
    return dirs


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` so a reader sees the old content or all of the
    new one, never a part: tmp file in the same directory, fsync, rename,
    fsync the directory (so the rename itself survives a crash)."""
    directory = os.path.dirname(path) or "."
    # The dot prefix and .tmp suffix keep readers that glob "*.json" away from it.
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_path(directory, directory=True)
