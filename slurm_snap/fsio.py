"""Files written so that a reader sees the old content or all of the new,
never a part: the one atomic writer, and the fsync helpers a durable
checkpoint needs. Standard library only (the rank client uses it).

Two strengths, chosen by the caller:
  durable=True   fsync the file, rename, fsync the directory: survives a
                 power cut (acknowledgements, the restore marker, results).
  durable=False  rename only: visible at once and whole, also on a network
                 filesystem, but not fsync'd (messages between live processes
                 in the per-job directory, where an fsync cost the opted-in
                 Prolog 50 ms whenever btrfs was committing).
"""
from __future__ import annotations

import _thread
import errno
import os
import stat

from .plainjson import dumps

_HASH_CHUNK = 1 << 20
MAX_JSON_BYTES = 1 << 20


def fsync_path(path: str, directory: bool = False) -> None:
    """fsync a file or directory by path (a read-only open suffices on Linux)."""
    flags = os.O_RDONLY | os.O_CLOEXEC
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
    import hashlib  # here: its OpenSSL binding costs the hooks' start path ~3 ms, and only ranks hash

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def atomic_write(path: str, data: bytes, *, mode: int = 0o600, durable: bool = True,
                 gid: int | None = None, nofollow: bool = False) -> str:
    """Replace `path` with `data` atomically; returns `path`.

    The temporary file is created next to the target, relative to a
    descriptor of its directory, with O_EXCL|O_NOFOLLOW: nothing planted at
    the temporary name is followed or truncated. `nofollow` also refuses a
    directory that is itself a symbolic link (root writing into a directory a
    user could have swapped). The dot prefix and .tmp suffix keep readers
    that list "*.json" away from the temporary.
    """
    directory, name = os.path.split(path)
    directory = directory or "."
    dflags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    dfd = os.open(directory, dflags)
    try:
        # pid + thread + random: a temporary left by a crashed writer whose pid
        # was reused must not make O_EXCL fail.
        tmp = f".{name}.{os.getpid()}.{_thread.get_ident()}.{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if gid is not None and os.geteuid() == 0:
                    os.fchown(fd, -1, gid)
                os.fchmod(fd, mode)  # the umask must not narrow what readers need
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        if durable:
            os.fsync(dfd)  # the rename itself must survive a crash
    finally:
        os.close(dfd)
    return path


def is_temporary(name: str, of: str) -> bool:
    """Whether directory entry `name` is a temporary atomic_write left for
    file `of` (a writer killed between create and rename)."""
    return name.startswith(f".{of}.") and name.endswith(".tmp")


def write_json(path: str, data, **kwargs) -> str:
    """atomic_write of one JSON document (sorted keys, trailing newline)."""
    return atomic_write(path, dumps(data, sort_keys=True).encode() + b"\n", **kwargs)


def _read_untrusted(path: str, max_bytes: int, owner_uid: int) -> bytes | None:
    """Read a file in a directory another user may write, as root reads it:
    never through a symbolic link (O_NOFOLLOW), never blocking on a FIFO
    (O_NONBLOCK), only a regular file owned by that user or root, so a link
    planted to /etc/shadow or a device is refused with its reason, not read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError("is a symbolic link" if exc.errno == errno.ELOOP else f"cannot open: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file")
        if st.st_uid not in (owner_uid, 0):
            raise ValueError(f"owned by uid {st.st_uid}, not uid {owner_uid}")
        if st.st_nlink != 1:
            raise ValueError("has other hard links")
        return os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)


def read_json(path: str, max_bytes: int = MAX_JSON_BYTES, *, owner_uid: int | None = None):
    """The parsed JSON object in `path`, or None if the file does not exist.

    `owner_uid`: the file lives where that user may write (a job's ack/):
    read it only as `_read_untrusted` allows.
    Raises ValueError naming the problem for a file that is too large, not
    JSON or not an object; callers turn it into their own error.
    """
    if owner_uid is not None:
        raw = _read_untrusted(path, max_bytes, owner_uid)
        if raw is None:
            return None
    else:
        try:
            with open(path, "rb") as handle:
                raw = handle.read(max_bytes + 1)
        except FileNotFoundError:
            return None
    if len(raw) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    import json  # here: the Prolog of a first run reads nothing

    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    return data
