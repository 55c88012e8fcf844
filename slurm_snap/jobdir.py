"""The per-job directory in the barrier area: the one home of its layout,
its modes and every file in it. Hooks create it, the coordinator and the
preemption hooks write requests and releases into it, ranks write their
acknowledgements and read the rest. Standard library only (the rank client
uses it inside training processes).

    <barrier_dir>/<job_id>/              root:<job gid> 0750
        job.json        Prolog -> ranks        volume paths per node, signal, restart count
        request.json    coordinator -> ranks   epoch and deadline of an on-demand request
        resume.json     Prolog -> ranks        where a requeued run resumes from
        ack/            <job uid>:<job gid> 0700
            <node>.<rank>.json                 a rank's acknowledgement (client/ack.py)
        release/        root:<job gid> 0750
            <epoch>     coordinator/Epilog -> ranks   the snapshot is cut: go on
        prolog/         root:<job gid> 0750
            <restart>/  root:<job gid> 0750           one per run of the job (requeues keep the id)
                <node>  Prolog -> the job's output    this node's Prolog is done; non-empty: why the
                                                      node runs (part of) the job unprotected. The
                                                      SPANK plugin waits for every node's, then prints

Only the job's user (and root) can write acknowledgements, so one job cannot
forge another's. Root never follows a link here: directories are checked
with lstat after creation and files are written through O_NOFOLLOW|O_EXCL
temporaries relative to a descriptor of their directory, without fsync (they
are messages between live processes: see fsio).
"""
from __future__ import annotations

import os
import pwd
import re
import stat
import time
from datetime import datetime

from .errors import BadValueError, PathError
from .fsio import atomic_write, read_json, write_json

JOB_FILE = "job.json"
REQUEST_FILE = "request.json"
RESUME_FILE = "resume.json"
ACK_DIR = "ack"
RELEASE_DIR = "release"
PROLOG_DIR = "prolog"
# What the SPANK plugin copies into the job's output is bounded (spank/remote.c
# reads at most this much of each node's file).
MAX_NOTICE = 2048

# Epochs and node names become file names (release/<epoch>, ack/<node>.<rank>.json):
# a conservative character set keeps them from escaping their directory.
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._:+-]{0,127}$")


def check_name(what: str, value) -> str:
    """Validate an epoch or node name that is used as a file name."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise BadValueError(what=what, value=value,
                            why="must be 1-128 characters of A-Z a-z 0-9 . _ : + - and not start with . or -")
    return value


def ack_filename(node: str, rank: int) -> str:
    """`<node>.<rank>.json`, the name of a rank's acknowledgement in ack/."""
    return f"{check_name('node name', node)}.{int(rank)}.json"


def is_ack_name(name: str) -> bool:
    """Names a reader of ack/ looks at: not the writers' dot temporaries."""
    return not name.startswith(".") and name.endswith(".json")


def gid_of(uid: int) -> int | None:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return None


def _field_error(path: str, field: str, value, why: str) -> BadValueError:
    return BadValueError(what=f"{os.path.basename(path)} field {field!r}", value=value, why=f"{why} (in {path})")


def _read(path: str):
    try:
        return read_json(path)
    except ValueError as exc:
        raise BadValueError(what="file", value=path, why=str(exc)) from None


def _timestamp(path: str, field: str, value) -> float:
    """Unix seconds from a number or an ISO 8601 time with an offset."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value)
        except ValueError:
            stamp = None
        if stamp is not None and stamp.tzinfo is not None:
            return stamp.timestamp()
    raise _field_error(path, field, value, "expected Unix seconds or an ISO 8601 time with an offset")


def _iso(t: datetime | None) -> str | None:
    return t.isoformat(timespec="microseconds") if t is not None else None


class JobDir:
    """`JobDir(barrier_dir, job_id)`: paths, creation, writers and readers."""

    def __init__(self, barrier_dir: str, job_id, *, gid: int | None = None):
        if not os.path.isabs(barrier_dir):
            raise BadValueError(what="barrier directory", value=barrier_dir, why="must be an absolute path")
        self.barrier_dir = barrier_dir
        text = str(job_id)
        # "0042" and 42 are one job: one directory.
        self.job_id = str(int(text)) if text.isascii() and text.isdigit() else check_name("job id", text)
        self.path = os.path.join(barrier_dir, self.job_id)
        self.ack = os.path.join(self.path, ACK_DIR)
        self.release = os.path.join(self.path, RELEASE_DIR)
        self.gid = gid

    def __repr__(self) -> str:
        return f"JobDir({self.path!r})"

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def ack_path(self, node: str, rank: int) -> str:
        return os.path.join(self.ack, ack_filename(node, rank))

    def release_path(self, epoch: str) -> str:
        return os.path.join(self.release, check_name("epoch", epoch))

    def early_path(self, epoch: str) -> str:
        """Rank 0's early-release decision for a preemption epoch: in ack/,
        the one directory the job's user may write (not a *.json name, so
        no reader of acknowledgements takes it for one)."""
        return os.path.join(self.ack, f"early-{check_name('epoch', epoch)}.decision")

    # -- creation (root) ------------------------------------------------------
    @staticmethod
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

    def prepare(self, uid: int, gid: int) -> "JobDir":
        """Create the layout with its owners and modes (root; idempotent)."""
        os.makedirs(self.barrier_dir, mode=0o755, exist_ok=True)
        self._ensure_dir(self.path, 0, gid, 0o750)
        self._ensure_dir(self.ack, uid, gid, 0o700)
        self._ensure_dir(self.release, 0, gid, 0o750)
        self.gid = gid
        return self

    def ensure(self, uid: int) -> "JobDir":
        """The directories, created with the Prolog's layout if the Prolog has
        not (an on-demand snapshot of a job started before slurm-snap was
        installed). Unprivileged callers (tests, simulations) get the same
        names with their own ownership."""
        gid = gid_of(uid)
        self.gid = gid
        if not (os.path.isdir(self.ack) and os.path.isdir(self.release)):
            if os.geteuid() == 0:
                self.prepare(uid, gid if gid is not None else uid)
            else:
                os.makedirs(self.ack, mode=0o700, exist_ok=True)
                os.makedirs(self.release, mode=0o750, exist_ok=True)
        return self

    # -- writers (root's side) ---------------------------------------------------
    def _write(self, directory: str, name: str, data: dict) -> str:
        return write_json(os.path.join(directory, name), data, mode=0o640, durable=False, gid=self.gid,
                          nofollow=True)

    def write_job(self, data: dict) -> str:
        return self._write(self.path, JOB_FILE, data)

    def write_request(self, *, epoch: str, requested_at: datetime, deadline: datetime) -> str:
        """Written before the signal, always with a deadline (docs/client.md)."""
        return self._write(self.path, REQUEST_FILE, {
            "job_id": self.job_id, "epoch": check_name("epoch", epoch),
            "requested_at": _iso(requested_at), "deadline": _iso(deadline)})

    def write_release(self, *, epoch: str, set_id: int | None, state: str = "", consistency: str = "") -> str:
        """Thaw: the ranks waiting for this epoch continue. Idempotent."""
        name = check_name("epoch", epoch)
        return self._write(self.release, name, {"epoch": name, "set_id": set_id, "state": state,
                                                "consistency": consistency})

    def write_resume(self, data: dict) -> str:
        return self._write(self.path, RESUME_FILE, data)

    def write_prolog_done(self, node: str, restart_count: int, lines=()) -> str:
        """This node's Prolog has finished for this run of the job; `lines`
        is what it wants the job's user told (a refused volume: the job runs
        without its protection). Plain text, one message a line. The SPANK
        plugin, in task 0 of each step, waits (bounded) until every node of
        the job has written one, then prints the non-empty ones, each line
        prefixed "slurm-snap: ": a step may start on one node before
        another node's Prolog has finished (PrologFlags=Alloc runs them side
        by side, and Slurm 22.05 launches the batch script when its own
        node's is done). Per run, so a requeued run never prints what an
        earlier run's nodes said."""
        if not isinstance(restart_count, int) or isinstance(restart_count, bool) or restart_count < 0:
            raise BadValueError(what="restart count", value=restart_count, why="expected an integer >= 0")
        gid = self.gid if self.gid is not None else 0
        top = os.path.join(self.path, PROLOG_DIR)
        self._ensure_dir(top, 0, gid, 0o750)
        run = os.path.join(top, str(restart_count))
        self._ensure_dir(run, 0, gid, 0o750)
        text = "".join(line.replace("\n", " ") + "\n" for line in lines).encode()[:MAX_NOTICE]
        return atomic_write(os.path.join(run, check_name("node name", node)), text, mode=0o640,
                            durable=False, gid=self.gid, nofollow=True)

    # -- readers (the ranks' side) ----------------------------------------------
    def read_request(self) -> dict | None:
        """request.json validated: {"job_id", "epoch", "deadline" (Unix s or None), "requested_at"}."""
        path = self.file(REQUEST_FILE)
        data = _read(path)
        if data is None:
            return None
        for field in ("job_id", "epoch"):
            if field not in data:
                raise _field_error(path, field, None, "missing")
        if str(data["job_id"]) != self.job_id:
            raise _field_error(path, "job_id", data["job_id"], f"belongs to another job (expected {self.job_id!r})")
        try:
            epoch = check_name("epoch", data["epoch"])
        except BadValueError as exc:
            raise _field_error(path, "epoch", data["epoch"], exc.kwargs["why"]) from None
        deadline = _timestamp(path, "deadline", data["deadline"]) if data.get("deadline") is not None else None
        return {"job_id": self.job_id, "epoch": epoch, "deadline": deadline, "requested_at": data.get("requested_at")}

    def request_is_current(self, request: dict, now: float | None = None) -> bool:
        """A request is served once its release exists, and dead after its deadline."""
        if os.path.exists(os.path.join(self.release, request["epoch"])):
            return False
        deadline = request["deadline"]
        return deadline is None or deadline >= (time.time() if now is None else now)

    def read_resume(self) -> dict | None:
        """resume.json validated: {"set_id", "step", "checkpoint": {"live", "snapshot"},
        "ranks": {rank: {"node", "from", "live", "checkpoint", "missing"}}, "missing": [why...]}
        ("ranks" and "missing" are {} and [] in files written before they existed)."""
        path = self.file(RESUME_FILE)
        data = _read(path)
        if data is None:
            return None
        for field in ("set_id", "step", "checkpoint"):
            if field not in data:
                raise _field_error(path, field, None, "missing")
        set_id = data["set_id"]
        if isinstance(set_id, bool) or not isinstance(set_id, (str, int)) or set_id == "":
            raise _field_error(path, "set_id", set_id, "expected a string or integer")
        step = data["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise _field_error(path, "step", step, "expected an integer >= 0")
        checkpoint = data["checkpoint"]
        if not isinstance(checkpoint, dict):
            raise _field_error(path, "checkpoint", checkpoint, "expected an object")
        out = {}
        for key in ("live", "snapshot"):
            value = checkpoint.get(key)
            if value is not None and (not isinstance(value, str) or not os.path.isabs(value)):
                raise _field_error(path, f"checkpoint.{key}", value, "expected an absolute path or null")
            out[key] = value
        if out["live"] is None and out["snapshot"] is None:
            raise _field_error(path, "checkpoint", checkpoint, "names neither a live nor a snapshot path")
        ranks = data.get("ranks") or {}
        if not isinstance(ranks, dict):
            raise _field_error(path, "ranks", ranks, "expected an object")
        for rank, entry in ranks.items():
            if not isinstance(entry, dict) or not str(rank).isdigit():
                raise _field_error(path, f"ranks.{rank}", entry, "expected an object under a rank number")
            value = entry.get("checkpoint")
            if value is not None and (not isinstance(value, str) or not os.path.isabs(value)):
                raise _field_error(path, f"ranks.{rank}.checkpoint", value, "expected an absolute path or null")
        missing = data.get("missing") or []
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise _field_error(path, "missing", missing, "expected a list of strings")
        return {"set_id": set_id, "step": step, "checkpoint": out, "ranks": ranks, "missing": missing}

    def find_volume(self, class_name: str, node: str) -> str | None:
        """Path of volume class `class_name` for `node` from job.json: the entry
        for this node (node-local volumes) wins over one with node null (shared)."""
        path = self.file(JOB_FILE)
        data = _read(path)
        if data is None:
            return None
        volumes = data.get("volumes")
        if not isinstance(volumes, list):
            raise _field_error(path, "volumes", volumes, "expected a list")
        shared = None
        for index, volume in enumerate(volumes):
            if not isinstance(volume, dict) or not isinstance(volume.get("path"), str):
                raise _field_error(path, f"volumes[{index}]", volume, "expected an object with a string 'path'")
            if volume.get("class") != class_name:
                continue
            if volume.get("node") == node:
                return volume["path"]
            if volume.get("node") is None and shared is None:
                shared = volume["path"]
        return shared
