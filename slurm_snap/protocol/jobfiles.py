"""The coordinator's side of the per-job files (docs/contracts.md):
request.json, release/<epoch>, resume.json. Layout, modes and the atomic,
link-refusing writer are hooks.barrierdir's, so both sides agree."""
from __future__ import annotations

import datetime as dt
import os
import pwd
from dataclasses import dataclass

from ..client.ack import check_name
from ..hooks import barrierdir


@dataclass(frozen=True)
class JobDirs:
    job: str
    ack: str
    release: str
    gid: int | None


def _gid_of(uid: int) -> int | None:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return None


def ensure(barrier_dir: str, job_id: int, uid: int) -> JobDirs:
    """The job's directories, created with the Prolog's layout if the Prolog
    has not (an on-demand snapshot of a job started before slurm-snap)."""
    gid = _gid_of(uid)
    jd = barrierdir.job_dir(barrier_dir, job_id)
    ack, release = os.path.join(jd, "ack"), os.path.join(jd, "release")
    if not (os.path.isdir(ack) and os.path.isdir(release)):
        if os.geteuid() == 0:
            barrierdir.prepare(barrier_dir, job_id, uid, gid if gid is not None else uid)
        else:  # unprivileged tests and simulations: same names, our own modes
            os.makedirs(ack, mode=0o700, exist_ok=True)
            os.makedirs(release, mode=0o750, exist_ok=True)
    return JobDirs(job=jd, ack=ack, release=release, gid=gid)


def _iso(t: dt.datetime | None) -> str | None:
    return t.isoformat(timespec="microseconds") if t is not None else None


def write_request(dirs: JobDirs, *, job_id: int, epoch: str, requested_at: dt.datetime,
                  deadline: dt.datetime) -> str:
    return barrierdir.write_json(dirs.job, "request.json", {
        "job_id": str(job_id), "epoch": check_name("epoch", epoch),
        "requested_at": _iso(requested_at), "deadline": _iso(deadline)}, gid=dirs.gid)


def write_release(dirs: JobDirs, *, epoch: str, set_id: int | None, state: str, consistency: str) -> str:
    """Thaw: the ranks waiting for this epoch continue. Idempotent."""
    name = check_name("epoch", epoch)
    return barrierdir.write_json(dirs.release, name, {
        "epoch": name, "set_id": set_id, "state": state, "consistency": consistency}, gid=dirs.gid)


def write_resume(dirs: JobDirs, data: dict) -> str:
    return barrierdir.write_json(dirs.job, "resume.json", data, gid=dirs.gid)
