"""Give the nodes back at preemption as soon as the checkpoint is safe.

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
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from collections.abc import Callable

from slurm_snap.errors import SnapError
from slurm_snap.jobdir import JobDir, is_ack_name
from slurm_snap.jobrecords import (EARLY_FAILED, EARLY_KEPT, EARLY_REQUEUED, EARLY_REQUEUEING, EARLY_WAITED, Ack,
                                   EarlyDecision)

ENV = "SLURM_SNAP_EARLY_RELEASE"
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


def shows_preemption(fields: dict[str, str]) -> bool:
    """Slurm shows the job a PreemptTime (`scontrol show job` fields)."""
    return fields.get("PreemptTime", "") not in ("", "None", "N/A", "Unknown")


def may_release(fields: dict[str, str]) -> tuple[bool, str]:
    """Is this job being preempted, and will Slurm requeue it?"""
    preempt = fields.get("PreemptTime", "")
    if not shows_preemption(fields):
        return False, "Slurm shows no PreemptTime: not a preemption (a cancellation, perhaps)"
    if fields.get("Requeue") != "1":
        return False, f"the job may not be requeued (Requeue={fields.get('Requeue', '?')})"
    return True, f"preempted at {preempt}"


def all_acknowledged(jobdir: JobDir, epoch: str, world_size: int) -> bool:
    """Every rank 0..world_size-1 has a valid acknowledgement of `epoch`."""
    try:
        names = os.listdir(jobdir.ack)
    except OSError:
        return False
    ranks: set[int] = set()
    for name in names:
        if not is_ack_name(name):
            continue
        try:
            with open(os.path.join(jobdir.ack, name), "rb") as f:
                ack = Ack.from_bytes(f.read(), jobdir.job_id, epoch)
        except (OSError, SnapError):
            continue   # another epoch's, half-visible or foreign: not one of ours
        ranks.add(ack.rank)
    return ranks >= set(range(world_size))


class EarlyRelease:
    """Rank 0's watcher: started after its own acknowledgement of a
    preemption epoch; requeues the job once every rank acknowledged."""

    def __init__(self, jobdir: JobDir, epoch: str, world_size: int, *, deadline: float,
                 run: Callable = run_scontrol, clock: Callable[[], float] = time.time):
        self.jobdir, self.epoch, self.world_size = jobdir, epoch, world_size
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
        job = self.jobdir.job_id
        try:
            ok, why = may_release(job_state(job, self.run))
            if not ok:
                self._record(EARLY_KEPT, why=why, all_acknowledged_at=seen_all)
                return
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
                return
            if proc.returncode != 0:
                self._record(EARLY_FAILED,
                             why=f"scontrol requeue exited {proc.returncode}: {proc.stderr.strip()[:200]}",
                             all_acknowledged_at=seen_all)
                return
            self._record(EARLY_REQUEUED, why=why, all_acknowledged_at=seen_all, at=at)
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            self._record(EARLY_FAILED, why=str(exc)[:200], all_acknowledged_at=seen_all)
