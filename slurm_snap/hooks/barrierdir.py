"""The per-job directory in the barrier area, created by root for the job.

Layout and modes (docs/contracts.md):
  <barrier_dir>/<job_id>/          root:<job gid> 0750  ranks read job.json, request.json, resume.json
  <barrier_dir>/<job_id>/ack/      <job uid>:<job gid> 0700  only the job's user (and root) writes acks,
                                   so one job cannot forge another job's acknowledgements
  <barrier_dir>/<job_id>/release/  root:<job gid> 0750  written by the coordinator only

Root never follows a link here: directories are checked with lstat after
creation and files are written through O_NOFOLLOW|O_EXCL temporaries
relative to a directory descriptor.
"""
from __future__ import annotations

import json
import os
import stat
import threading

from ..errors import PathError


def job_dir(barrier_dir: str, job_id: int) -> str:
    return os.path.join(barrier_dir, str(int(job_id)))


def _ensure_dir(path: str, uid: int, gid: int, mode: int) -> None:
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PathError(path, "exists and is not a directory (refusing to follow it)")
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, mode)


def prepare(barrier_dir: str, job_id: int, uid: int, gid: int) -> str:
    os.makedirs(barrier_dir, mode=0o755, exist_ok=True)
    jd = job_dir(barrier_dir, job_id)
    _ensure_dir(jd, 0, gid, 0o750)
    _ensure_dir(os.path.join(jd, "ack"), uid, gid, 0o700)
    _ensure_dir(os.path.join(jd, "release"), 0, gid, 0o750)
    return jd


def write_json(directory: str, name: str, data: dict, *, gid: int | None = None, mode: int = 0o640) -> str:
    """Atomically replace `directory/name`, never following a link, WITHOUT fsync.

    Every file here is a message between live processes (job.json and
    resume.json for the ranks, request.json and release/<epoch> between the
    coordinator and the ranks): it must be visible at once and whole (rename
    gives that, also on a network filesystem), not survive a power cut. After
    a crash of the host the job is gone, its next run's Prolog writes job.json
    and resume.json again, and repair writes the release. An fsync here cost
    the opted-in Prolog 50 ms whenever btrfs was committing a transaction,
    and would sit on the critical path of every rank.
    """
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            os.write(fd, json.dumps(data, sort_keys=True).encode() + b"\n")
            if gid is not None and os.geteuid() == 0:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)
    return os.path.join(directory, name)
