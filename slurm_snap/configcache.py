"""The configuration file as parsed and validated by an earlier process, so
the next one need not parse TOML again.

Every opted-in job's Prolog and every `sbatch --snapshot-*` load the
configuration in a fresh process. Importing tomllib (with the `re` it
needs) and checking every key cost ~55 M instructions (~15 ms on the 2-core
machine of docs/benchmarks.md): half of what an opted-in Prolog may add. A
process that parsed the file writes what it read (the TOML's tables, before
defaults, as `marshal` data) here; the next one takes it when the file is
unchanged: same device, inode, size, mtime and ctime, and the same version of
the code that validated it.

Only a file the reader can trust is taken: a regular file, not a link, owned
by root or by the reader, writable by nobody else, in a directory of the same
kind. It is written with the configuration file's owner, group and mode (a
configuration readable only by root and the slurm group stays so), atomically,
by a process running as the file's owner or root; any failure to read or write
it only means parsing the file again.

    SLURM_SNAP_CONFIG_CACHE=DIR   where (default /run/slurm-snap/config); "" turns it off
"""
from __future__ import annotations

import marshal
import os
import sys

ENV_VAR = "SLURM_SNAP_CONFIG_CACHE"
DEFAULT_DIR = "/run/slurm-snap/config"
# Entries kept: one per configuration path; tests make many, a site one or two.
KEEP = 64
_FORMAT = 1


def _dir() -> str:
    return os.environ.get(ENV_VAR, DEFAULT_DIR)


def _entry(directory: str, path: str) -> str | None:
    name = path.replace("%", "%25").replace("/", "%2F") + ".marshal"
    return os.path.join(directory, name) if len(name) <= 240 else None


def _key(st: os.stat_result) -> tuple:
    from . import __version__

    # The validating code's own version: a changed schema or check must not
    # accept what an older one let through.
    here = os.stat(os.path.join(os.path.dirname(__file__), "config.py"))
    return (_FORMAT, sys.hexversion, __version__, here.st_mtime_ns, here.st_size,
            st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def read(path: str, st: os.stat_result) -> dict | None:
    """The tables of `path` (stat `st`) as an earlier process read them, or None."""
    directory = _dir()
    entry = _entry(directory, path) if directory else None
    if entry is None:
        return None
    try:
        if not _trusted(os.stat(directory)):
            return None
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        own = os.fstat(fd)
        if not (_trusted(own) and own.st_nlink == 1 and own.st_size < (1 << 20)):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            key, data = marshal.loads(f.read())
        return data if key == _key(st) and isinstance(data, dict) else None
    except (OSError, EOFError, ValueError, TypeError):
        return None
    finally:
        os.close(fd)


def write(path: str, st: os.stat_result, data: dict) -> None:
    """Keep `data` (the tables of `path`, stat `st`, just validated) for the next process."""
    directory = _dir()
    entry = _entry(directory, path) if directory else None
    euid = os.geteuid()
    if entry is None or euid not in (0, st.st_uid):
        return
    tmp = f"{entry}.{os.getpid()}.tmp"
    try:
        blob = marshal.dumps((_key(st), data))
        os.makedirs(directory, mode=0o755, exist_ok=True)
        if not _trusted(os.stat(directory)):
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if euid == 0:
                os.fchown(fd, st.st_uid, st.st_gid)
            os.fchmod(fd, st.st_mode & 0o755)
            os.write(fd, blob)
        finally:
            os.close(fd)
        os.rename(tmp, entry)
        _prune(directory)
    except (OSError, ValueError):   # ValueError: a value marshal cannot keep (a TOML date)
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _prune(directory: str) -> None:
    names = os.listdir(directory)
    if len(names) <= KEEP:
        return
    aged = []
    for n in names:
        try:
            aged.append((os.stat(os.path.join(directory, n)).st_mtime, n))
        except OSError:
            continue
    for _mtime, n in sorted(aged)[:len(aged) - KEEP // 2]:
        try:
            os.unlink(os.path.join(directory, n))
        except OSError:
            pass
