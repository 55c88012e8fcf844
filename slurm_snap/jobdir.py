"""The per-job directory in the barrier area: the one home of its layout,
its modes and the safe reading and writing of every file in it; what each
file says is a record of slurm_snap.jobrecords (one parser, one writer).
Hooks create it, the coordinator and the preemption hooks write requests and
releases into it, ranks write their acknowledgements and read the rest.
Standard library only (the rank client uses it inside training processes).

    <barrier_dir>/<job_id>/              root:<job gid> 0750
        job.json        Prolog -> ranks        volume paths per node, signal, restart count (JobRecord)
        request.json    coordinator -> ranks   epoch and deadline of an on-demand request (RequestRecord)
        resume.json     Prolog -> ranks        where a requeued run resumes from (ResumeRecord)
        ack/            <job uid>:<job gid> 0700
            <node>.<rank>.json                 a rank's acknowledgement (Ack)
            early-<epoch>.decision             rank 0 -> Epilog: the early-release decision (EarlyDecision)
            timelimit-<epoch>.request          rank 0 or EpilogSlurmctld -> Epilogs: the run stops for its
                                               time limit, snapshot it (TimeLimitRecord)
        release/        root:<job gid> 0750
            <epoch>     coordinator/Epilog -> ranks   the snapshot is cut: go on (ReleaseRecord)
        cut/            root:<job gid> 0750
            <epoch>/<node>.json  Epilog -> the requeued run's head Prolog   what the node cut (CutRecord)
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
import stat
import time

from .errors import BadValueError, PathError
from .fsio import atomic_write, read_json, write_json
from .jobrecords import (CutRecord, EarlyDecision, JobRecord, ReleaseRecord, RequestRecord, ResumeRecord,
                         TimeLimitRecord, check_name)

JOB_FILE = JobRecord.FILE
REQUEST_FILE = RequestRecord.FILE
RESUME_FILE = ResumeRecord.FILE
ACK_DIR = "ack"
RELEASE_DIR = "release"
CUT_DIR = CutRecord.FILE
PROLOG_DIR = "prolog"
# What the SPANK plugin copies into the job's output is bounded (spank/remote.c
# reads at most this much of each node's file).
MAX_NOTICE = 2048


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


def _read(path: str, owner_uid: int | None = None):
    try:
        return read_json(path, owner_uid=owner_uid)
    except ValueError as exc:
        raise BadValueError(what="file", value=path, why=str(exc)) from None


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

    def timelimit_path(self, epoch: str) -> str:
        """The time-limit record of an epoch: in ack/ too, since rank 0 writes
        it (and root, EpilogSlurmctld, when the job reached its limit)."""
        return os.path.join(self.ack, f"timelimit-{check_name('epoch', epoch)}.request")

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

    def write_job(self, job: JobRecord) -> str:
        return self._write(self.path, JOB_FILE, job.to_json())

    def write_request(self, request: RequestRecord) -> str:
        """Written before the signal, always with a deadline (docs/client.md)."""
        return self._write(self.path, REQUEST_FILE, request.to_json())

    def write_release(self, release: ReleaseRecord) -> str:
        """Thaw: the ranks waiting for this epoch continue. Idempotent."""
        return self._write(self.release, check_name("epoch", release.epoch), release.to_json())

    def write_resume(self, resume: ResumeRecord) -> str:
        return self._write(self.path, RESUME_FILE, resume.to_json())

    def write_cut(self, record: CutRecord) -> str:
        """What a node's Epilog cut for a preemption epoch (root; 0640, group the job's)."""
        gid = self.gid if self.gid is not None else 0
        top = os.path.join(self.path, CUT_DIR)
        self._ensure_dir(top, 0, gid, 0o750)
        epoch_dir = os.path.join(top, check_name("epoch", record.epoch))
        self._ensure_dir(epoch_dir, 0, gid, 0o750)
        return self._write(epoch_dir, check_name("node name", record.node) + ".json", record.to_json())

    def read_cuts(self, epoch: str) -> dict[str, CutRecord]:
        """node -> what it cut for `epoch`, from every node that wrote one.
        Only root's files count (the directory is root's; a record a user
        could have planted would aim the resume at their own files)."""
        out: dict[str, CutRecord] = {}
        directory = os.path.join(self.path, CUT_DIR, check_name("epoch", epoch))
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return out
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            path = os.path.join(directory, name)
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()):
                continue
            data = _read(path)
            if data is not None:
                record = CutRecord.parse(data, path)
                out[record.node] = record
        return out

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
    def read_job(self) -> JobRecord | None:
        path = self.file(JOB_FILE)
        data = _read(path)
        return None if data is None else JobRecord.parse(data, path)

    def read_request(self) -> RequestRecord | None:
        path = self.file(REQUEST_FILE)
        data = _read(path)
        return None if data is None else RequestRecord.parse(data, path, job_id=self.job_id)

    def request_is_current(self, request: RequestRecord, now: float | None = None) -> bool:
        """A request is served once its release exists, and dead after its deadline."""
        if os.path.exists(os.path.join(self.release, request.epoch)):
            return False
        return request.is_live(time.time() if now is None else now)

    def read_resume(self) -> ResumeRecord | None:
        path = self.file(RESUME_FILE)
        data = _read(path)
        return None if data is None else ResumeRecord.parse(data, path)

    # -- rank 0's early-release decision (in ack/, the job's user's) ----------------
    def write_early(self, decision: EarlyDecision) -> str:
        return write_json(self.early_path(decision.epoch), decision.to_json(), mode=0o600)

    def read_early(self, epoch: str, owner_uid: int | None = None) -> EarlyDecision | None:
        """What rank 0 decided for `epoch` (the Epilog records it with the set).

        The file is in ack/, which the job's user writes: root (the Epilog)
        passes that user's `owner_uid`, so a symbolic link, FIFO or hard link
        planted there is refused, never followed."""
        path = self.early_path(epoch)
        data = _read(path, owner_uid)
        return None if data is None else EarlyDecision.parse(data, path)

    # -- the time-limit record (rank 0 or EpilogSlurmctld -> the Epilogs) -----------
    def write_timelimit(self, record: TimeLimitRecord) -> str:
        """Before the requeue that ends the run (jobrecords/timelimit.py). In
        ack/, which the job's user owns: root writes through the same
        no-link temporaries as everywhere here."""
        if os.geteuid() == 0:
            return self._write(self.ack, os.path.basename(self.timelimit_path(record.epoch)), record.to_json())
        return write_json(self.timelimit_path(record.epoch), record.to_json(), mode=0o600)

    def read_timelimit(self, epoch: str, owner_uid: int | None = None) -> TimeLimitRecord | None:
        """The run's time-limit record; root (the Epilogs) passes the job's
        user's `owner_uid`, as for read_early (ack/ is that user's)."""
        path = self.timelimit_path(epoch)
        data = _read(path, owner_uid)
        return None if data is None else TimeLimitRecord.parse(data, path)
