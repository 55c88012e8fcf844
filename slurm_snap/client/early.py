"""Give the nodes back at preemption, or before the time limit, as soon as
the checkpoint is safe.

A preempted job must not exit during GraceTime (Slurm would mark it
completed, not requeue it), so without this its ranks sit, checkpoint done,
until Slurm kills them at the end of the grace period: minutes of idle GPUs
at sites that give large models a long GraceTime. Measured on Slurm 22.05
(docs/design.md, "Early release"): `scontrol requeue JOB`, which a job's own
user may run, ends the job at once, requeues it with the same id and restart
count + 1, keeps the PreemptTime the preemption set, runs every node's
Epilog (which cuts as usual) and lets the preemptor start when they finish.
Lightning's SLURM auto-requeue is the same idea.

Rank 0 does it, once, and only when all of this holds:
  - the epoch being served is a preemption's (`preempt-N`), never an
    on-demand snapshot's;
  - every rank of the launcher's world acknowledged that epoch (read from the
    per-job directory, which every node sees): all checkpoints are durable;
  - the site allows it (SLURM_SNAP_EARLY_RELEASE=1, which
    `hook validate-options` prints from `protocol.early_release`);
  - Slurm says the job is being preempted (a PreemptTime) and may be
    requeued (Requeue=1): a plain `scancel`, whose first SIGTERM is also a
    checkpoint request, must stay a cancellation.
Otherwise nothing changes: Slurm kills at GraceTime's end as before.
`<job dir>/ack/early-<epoch>.decision` records what was decided, and when
(jobrecords.EarlyDecision).

The same watcher serves `--snapshot-before-timelimit=MARGIN` (the ranks get
SLURM_SNAP_TIMELIMIT_MARGIN): Slurm's `--signal=USR1@MARGIN` asks for the
checkpoint MARGIN to MARGIN + 60 s before the limit (its signal may come up
to 60 s early), and a job that is not requeued then ends TIMEOUT. When
every rank acknowledged, Slurm shows no PreemptTime, the job may be requeued
and its EndTime is at most MARGIN + `SIGNAL_SLACK` away, rank 0 writes
the time-limit record (jobrecords.TimeLimitRecord: the Epilogs snapshot the
run as a `timelimit` set) and requeues. That is the job's own request, so
it needs no SLURM_SNAP_EARLY_RELEASE. Without `scontrol` (a container that
has none) rank 0 records why and the ranks wait: the job reaches its limit
and EpilogSlurmctld requeues it instead (hooks/jobhooks.py).
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime

from slurm_snap.errors import SnapError
from slurm_snap.jobdir import JobDir, is_ack_name
from slurm_snap.jobrecords import (BY_NODE, BY_RANK, EARLY_ASKED, EARLY_FAILED, EARLY_KEPT, EARLY_REQUEUED,
                                   EARLY_REQUEUEING, EARLY_WAITED, MAX_ACK_BYTES, SIGNAL_SLACK, Ack, EarlyDecision,
                                   TimeLimitRecord)

ENV = "SLURM_SNAP_EARLY_RELEASE"
TIMELIMIT_ENV = "SLURM_SNAP_TIMELIMIT_MARGIN"
_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin")
POLL = 0.1          # the ack directory is on a network filesystem: no inotify across nodes
SCONTROL_TIMEOUT = 20.0


def scontrol() -> str | None:
    # SLURM_SNAP_SLURM_BIN: [slurm] bin_dir, which the SPANK plugin puts in the
    # job's environment (a Slurm under its own prefix, e.g. /opt/slurm-24.11/bin,
    # beside another version's /usr/bin/scontrol, which cannot read its slurm.conf).
    first = os.environ.get("SLURM_SNAP_SLURM_BIN", "")
    for d in ((first,) if os.path.isabs(first) else ()) + _BIN_DIRS:
        path = os.path.join(d, "scontrol")
        if os.access(path, os.X_OK):
            return path
    return None


def run_scontrol(args: list[str], timeout: float = SCONTROL_TIMEOUT) -> subprocess.CompletedProcess:
    """scontrol by absolute path, argv only, stdin closed, bounded in time."""
    exe = scontrol()
    if exe is None:
        raise FileNotFoundError("scontrol not found in " + ", ".join(_BIN_DIRS))
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def job_state(job_id: str, run: Callable = run_scontrol) -> dict[str, str]:
    """`scontrol show job -o JOB` as KEY=VALUE pairs (the fields are one word each)."""
    proc = run(["show", "job", "-o", str(job_id)])
    if proc.returncode != 0:
        raise RuntimeError(f"scontrol show job {job_id} exited {proc.returncode}: {proc.stderr.strip()[:200]}")
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", proc.stdout))


_UNSET = ("", "None", "N/A", "Unknown")


def shows_preemption(fields: dict[str, str]) -> bool:
    """Slurm shows the job a PreemptTime (`scontrol show job` fields)."""
    return fields.get("PreemptTime", "") not in _UNSET


def seconds_left(fields: dict[str, str], now: float | None = None) -> float | None:
    """Seconds until the job's EndTime, None when it has none. scontrol prints
    EndTime in this process's local time, which a naive datetime's
    timestamp() reads back alike."""
    end = fields.get("EndTime", "")
    if end in _UNSET:
        return None
    try:
        at = datetime.strptime(end, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None
    return at - (time.time() if now is None else now)


def near_time_limit(left: float | None, margin: int) -> bool:
    """EndTime (`left` seconds away) is near enough to be the limit that
    --snapshot-before-timelimit=`margin`'s --signal=USR1@margin announces:
    Slurm may send it up to 60 s early, and the checkpoint takes a while."""
    return left is not None and left <= margin + SIGNAL_SLACK


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why Slurm signalled, and whether rank 0 requeues the job now."""

    requeue: bool
    trigger: str          # "preempt", "timelimit" or "" (neither)
    why: str
    left: float | None = None


def judge(fields: dict[str, str], *, early_release: bool, margin: int | None,
          now: float | None = None) -> Verdict:
    """A preemption (a PreemptTime) is requeued early when the site allows
    it; the time limit (no PreemptTime, EndTime within the job's margin and
    SIGNAL_SLACK) when the job asked for it; nothing else (a plain
    scancel's first SIGTERM is a checkpoint request too and must stay a
    cancellation). Never a job Slurm may not requeue."""
    preempt = fields.get("PreemptTime", "")
    left = seconds_left(fields, now)
    if shows_preemption(fields):
        trigger, why = "preempt", f"preempted at {preempt}"
        if not early_release:
            return Verdict(False, trigger, why + "; early release is off at this site", left)
    elif margin is not None and near_time_limit(left, margin):
        trigger, why = "timelimit", f"time limit in {max(0.0, left):.0f} s (--snapshot-before-timelimit={margin}s)"
    elif margin is not None:
        limit = "no EndTime" if left is None else f"the time limit is {left:.0f} s away"
        return Verdict(False, "", f"Slurm shows no PreemptTime and {limit}: neither a preemption nor the time "
                                  "limit (a cancellation, perhaps)", left)
    else:
        return Verdict(False, "", "Slurm shows no PreemptTime: not a preemption (a cancellation, perhaps)", left)
    if fields.get("Requeue") != "1":
        return Verdict(False, trigger, f"the job may not be requeued (Requeue={fields.get('Requeue', '?')})", left)
    return Verdict(True, trigger, why, left)


def all_acknowledged(jobdir: JobDir, epoch: str, world_size: int) -> bool:
    """Every rank 0..world_size-1 has a valid acknowledgement of `epoch`
    (another epoch's, half-visible or foreign files are not ours)."""
    return {ack.rank for ack in acknowledgements(jobdir, epoch)} >= set(range(world_size))


class EarlyRelease:
    """Rank 0's watcher: started after its own acknowledgement of a
    preemption epoch; requeues the job once every rank acknowledged."""

    def __init__(self, jobdir: JobDir, epoch: str, world_size: int, *, deadline: float,
                 run: Callable = run_scontrol, clock: Callable[[], float] = time.time,
                 early_release: bool = True, margin: int | None = None):
        self.jobdir, self.epoch, self.world_size = jobdir, epoch, world_size
        self.early_release, self.margin = early_release, margin
        self.deadline = deadline            # time.monotonic() after which Slurm's own kill is near anyway
        self.run = run
        self.clock = clock
        self.outcome: str = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="slurm-snap-early-release", daemon=True)

    def start(self) -> "EarlyRelease":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _record(self, decision: str, why: str, all_acknowledged_at: float | None = None,
                at: float | None = None) -> None:
        self.outcome = decision
        try:
            self.jobdir.write_early(EarlyDecision(epoch=self.epoch, decision=decision,
                                                  at=self.clock() if at is None else at, why=why,
                                                  all_acknowledged_at=all_acknowledged_at))
        except OSError:
            pass   # the record is for humans and the Epilog; the decision stands

    def _watch(self) -> None:
        seen_all = None
        while not self._stop.is_set() and time.monotonic() < self.deadline:
            if all_acknowledged(self.jobdir, self.epoch, self.world_size):
                seen_all = self.clock()
                break
            self._stop.wait(POLL)
        if seen_all is None:
            if not self._stop.is_set():
                self._record(EARLY_WAITED, why="not every rank acknowledged in time: Slurm ends the job at GraceTime")
            return
        if self.run is run_scontrol and scontrol() is None:
            # A container without Slurm's commands: ask the node's slurm-snap
            # hook, outside the container, to decide and requeue
            # (watch_for_asked, started by the SPANK plugin). Without it, a
            # preemption ends at GraceTime's end and a job at its time limit
            # is requeued by EpilogSlurmctld.
            self._record(EARLY_ASKED, why="no scontrol here (a container?): the node's slurm-snap hook decides",
                         all_acknowledged_at=seen_all)
            return
        self.requeue_now(seen_all, by=BY_RANK)

    def requeue_now(self, seen_all: float, *, by: str) -> str:
        """Every rank acknowledged (at `seen_all`): ask Slurm why it signalled
        and requeue when judge() says so; record each step. Returns the outcome."""
        job = self.jobdir.job_id
        try:
            verdict = judge(job_state(job, self.run), early_release=self.early_release, margin=self.margin,
                            now=self.clock())
            why = verdict.why
            if not verdict.requeue:
                self._record(EARLY_KEPT, why=why, all_acknowledged_at=seen_all)
                return self.outcome
            if verdict.trigger == "timelimit":
                # Before the requeue, which ends the job: the Epilogs must find it.
                self.jobdir.write_timelimit(TimeLimitRecord(epoch=self.epoch, at=self.clock(), by=by,
                                                            margin=int(self.margin), left=verdict.left, why=why))
            # The requeue ends the job at once: Slurm signals every rank and
            # kills them KillWait later, so nothing written after the call is
            # sure to land (measured: a CI run's rank 0 died between the
            # decision's temporary and its rename, and the set said "grace").
            # The intent is written first, with the moment the request goes
            # out; the outcome replaces it if this process lives to see it.
            at = self.clock()
            self._record(EARLY_REQUEUEING, why=why, all_acknowledged_at=seen_all, at=at)
            proc = self.run(["requeue", str(job)])
            if proc.returncode < 0:
                # scontrol runs inside the job: the requeue's own kill ended it
                # before it could exit 0 (measured on the dev cluster: the
                # decision said "failed" 27 ms after the last acknowledgement,
                # the job requeued). The intent stands as the record.
                return self.outcome
            if proc.returncode != 0:
                self._record(EARLY_FAILED,
                             why=f"scontrol requeue exited {proc.returncode}: {proc.stderr.strip()[:200]}",
                             all_acknowledged_at=seen_all)
                return self.outcome
            self._record(EARLY_REQUEUED, why=why, all_acknowledged_at=seen_all, at=at)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            self._record(EARLY_FAILED, why=str(exc)[:200], all_acknowledged_at=seen_all)
        return self.outcome


def watch_for_asked(jobdir: JobDir, epoch: str, *, parent: int, early_release: bool, margin: int | None,
                    poll: float = 0.5, run: Callable = run_scontrol) -> str:
    """The node's side of early release for ranks without scontrol (a
    container): run outside the container, as the job's user, by the SPANK
    plugin on the step's first node for as long as the step lives (`parent`
    is its slurmstepd). When rank 0 wrote `asked` for `epoch`
    (every rank acknowledged), decide and requeue as rank 0 would have;
    return the outcome, or "" when the step ended first."""
    while _alive(parent):
        try:
            decision = jobdir.read_early(epoch)
        except (OSError, SnapError):
            decision = None
        if decision is not None and decision.decision != EARLY_ASKED:
            return ""      # rank 0 decided itself
        if decision is not None:
            ack = next(iter(acknowledgements(jobdir, epoch)), None)
            world = ack.world_size if ack is not None else None
            if not world or not all_acknowledged(jobdir, epoch, world):
                # rank 0 saw them all; a partial view here is not a reason to requeue
                time.sleep(poll)
                continue
            watcher = EarlyRelease(jobdir, epoch, world, deadline=0, run=run, early_release=early_release,
                                   margin=margin)
            return watcher.requeue_now(decision.all_acknowledged_at or time.time(), by=BY_NODE)
        time.sleep(poll)
    return ""


def _alive(pid: int) -> bool:
    """slurmstepd (root's, so no signal 0 from the job's user) still runs."""
    return pid > 0 and os.path.exists(f"/proc/{pid}")


def acknowledgements(jobdir: JobDir, epoch: str):
    """The valid acknowledgements of `epoch` in ack/, in name order. Read as
    root too (EpilogSlurmctld at a time limit): no link followed, no FIFO
    waited on, regular files only."""
    try:
        names = sorted(n for n in os.listdir(jobdir.ack) if is_ack_name(n))
    except OSError:
        return
    for name in names:
        try:
            fd = os.open(os.path.join(jobdir.ack, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            yield Ack.from_bytes(os.read(fd, MAX_ACK_BYTES + 1), jobdir.job_id, epoch)
        except (OSError, SnapError):
            continue   # another epoch's, half-visible or foreign: not one of ours
        finally:
            os.close(fd)
