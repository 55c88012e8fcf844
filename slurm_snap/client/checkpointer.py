"""Checkpointer: what a training rank calls to take part in a snapshot.

    ckpt = Checkpointer(); ckpt.install()
    for step in ...:
        train_one_step()
        action = ckpt.decide(step)       # same place on every rank
        if action.checkpoint:
            files = save_my_checkpoint(step)
            ckpt.commit(step, files)
            ckpt.wait_for_release(timeout=60)
        if action.stop:
            break

With a torch.distributed process group, decide() is one step agreement
across the job (client/agree.py); without one, each rank decides alone.
A checkpoint signal is a request only with a reason (client/reason.py: a
current request.json, Slurm's PreemptTime, or the time limit near for a job
that asked for --snapshot-before-timelimit); in a lockstep job rank 0
gives the verdict and the agreement carries it, so a stray signal costs the
ranks nothing and no rank waits for a release nobody sends.

Length: one class, the rank's whole side of the protocol as docs/client.md
documents it (signals, decide, commit, release, resume); each helper it
drives already has its own module (signals, agree, early, slurmenv, marker,
and the per-job files in jobdir and jobrecords).
"""
from __future__ import annotations

import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import slurm_snap.client.checkpoint_dir as checkpoint_dir
import slurm_snap.client.early as early
import slurm_snap.client.reason as reason
import slurm_snap.client.slurmenv as slurmenv
from slurm_snap.client.agree import (DEFAULT_TIMEOUT, VERDICT_GO, VERDICT_NONE, VERDICT_STRAY, StepAgreement,
                                     distributed)
from slurm_snap.client.marker import mark_first_step
from slurm_snap.client.signals import SignalFlag, parse_signal
from slurm_snap.clock import utcnow
from slurm_snap.errors import BadValueError, NotFound, UsageError
from slurm_snap.fsio import atomic_write, fsync_path, parent_dirs, sha256_file
from slurm_snap.jobdir import JobDir
from slurm_snap.jobrecords import Ack, ManifestEntry, check_name, is_preempt_epoch, preempt_epoch
from slurm_snap.watch import wait_for_path

DEFAULT_SIGNALS = ("SIGUSR1", "SIGTERM")
INDEPENDENT_ENV = "SLURM_SNAP_INDEPENDENT"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class Action:
    """What every rank does at this step boundary: checkpoint now, and/or
    stop training (the job is being terminated)."""

    checkpoint: bool
    stop: bool


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise BadValueError(what=f"environment variable {name}", value=env.get(name), why="expected 1 or 0")


class Checkpointer:
    def __init__(self, signals: Iterable | None = None, barrier_dir: str | None = None,
                 job_id: str | None = None, node: str | None = None, rank: int | None = None,
                 local_rank: int | None = None, local_size: int | None = None,
                 restart_count: int | None = None, env: Mapping[str, str] | None = None, *,
                 world_size: int | None = None, independent: bool | None = None,
                 lockstep: bool | None = None, group=None, agreement_timeout: float = DEFAULT_TIMEOUT,
                 overlap: bool = True, chain: bool = True, shield_children: bool = True,
                 early_release: bool | None = None):
        env = os.environ if env is None else env
        if signals is None:
            configured = env.get("SLURM_SNAP_SIGNAL")
            # The site's configured signal replaces SIGUSR1; SIGTERM always stays.
            signals = (configured, "SIGTERM") if configured else DEFAULT_SIGNALS
        self._flag = SignalFlag((parse_signal(s) for s in signals), chain=chain,
                                shield_children=shield_children)
        self.barrier_dir = barrier_dir if barrier_dir is not None else (env.get("SLURM_SNAP_BARRIER_DIR") or None)
        if self.barrier_dir is not None and not os.path.isabs(self.barrier_dir):
            raise BadValueError(what="barrier directory", value=self.barrier_dir, why="must be an absolute path")
        job_id = job_id if job_id is not None else (env.get("SLURM_JOB_ID") or None)
        self.job_id = check_name("job id", str(job_id)) if job_id is not None else None
        self.node = check_name("node name", node if node is not None else slurmenv.node_name_from_env(env))
        # Who must answer comes from the launcher (torchrun's variables, else
        # Slurm's), never from whichever acknowledgements happen to arrive.
        ident = slurmenv.identity_from_env(env)
        self.launcher = ident.launcher
        self.rank = self._int("rank", rank, ident.rank, 0)
        self.local_rank = self._int("local rank", local_rank, ident.local_rank, 0)
        self.local_size = self._int("local size", local_size, ident.local_size, 1)
        self.world_size = world_size if world_size is not None else ident.world_size
        if self.world_size is not None:
            self.world_size = self._int("world size", self.world_size, None, None)
        slurmenv.check_identity(slurmenv.Identity(self.rank, self.local_rank, self.local_size,
                                                  self.world_size, self.launcher))
        self.restart_count = self._int("restart count", restart_count,
                                       slurmenv.int_from_env("SLURM_RESTART_COUNT", env), 0)
        # Ranks that checkpoint on their own (no shared model): mixed steps
        # are then one consistent point. The job says so (--snapshot-independent-ranks
        # sets SLURM_SNAP_INDEPENDENT=1) or the program does.
        self.independent = _env_bool(env, INDEPENDENT_ENV) if independent is None else bool(independent)
        if lockstep and self.independent:
            raise BadValueError(what="lockstep", value=lockstep, why="a job cannot be both lockstep and independent")
        self._lockstep = lockstep
        # Rank 0 requeues a preempted job once every rank acknowledged (client/early.py),
        # and a job that asked to be snapshot before its time limit.
        self.early_release = _env_bool(env, early.ENV) if early_release is None else bool(early_release)
        margin = slurmenv.int_from_env(early.TIMELIMIT_ENV, env)
        self.timelimit_margin = margin if margin else None
        self._early: early.EarlyRelease | None = None
        self._group = group
        self._agreement_timeout = agreement_timeout
        self._overlap = overlap
        self._agreement: StepAgreement | None = None
        self._agreement_checked = False
        self._stop = False         # the agreement said: stop
        self._boundaries = 0
        self._seen_at: float | None = None   # when the request being served reached this rank
        self._commit_thread: threading.Thread | None = None
        self._commit_error: BaseException | None = None
        self._env = env
        self._serving = 0          # request counter value being served
        self._epoch: str | None = None  # fixed for the request being served
        # A request whose reason rank 0 has not given yet (lockstep), the
        # request count it covers, and rank 0's (or a lone rank's) verdict.
        self._confirming = False
        self._confirm_upto = 0
        self._verdict: tuple[int, int] | None = None   # (request count, VERDICT_*)
        self.ignored_signals = 0   # stray checkpoint signals: neither a request nor a preemption

    @staticmethod
    def _int(what: str, given, from_env, default: int) -> int:
        value = given if given is not None else (from_env if from_env is not None else default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadValueError(what=what, value=value, why="expected an integer >= 0")
        return value

    # -- where things are -------------------------------------------------
    @property
    def enabled(self) -> bool:
        """True when this rank can take part in a barrier (job id and barrier dir known)."""
        return self.job_id is not None and self.barrier_dir is not None

    @property
    def jobdir(self) -> JobDir:
        if not self.enabled:
            raise UsageError("slurm-snap client: SLURM_JOB_ID and SLURM_SNAP_BARRIER_DIR must be set "
                             f"(job id {self.job_id!r}, barrier dir {self.barrier_dir!r})")
        return JobDir(self.barrier_dir, self.job_id)

    @property
    def job_dir(self) -> str:
        return self.jobdir.path

    # -- signals ------------------------------------------------------------
    def install(self) -> "Checkpointer":
        self._flag.install()
        return self

    def uninstall(self) -> None:
        self.close()
        self._flag.uninstall()

    def close(self) -> None:
        """Finish an overlapped agreement still in flight and a commit_async
        still writing; call before destroying the process group."""
        self._join_commit()
        if self._agreement is not None:
            self._agreement.close()

    def __enter__(self) -> "Checkpointer":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    @property
    def terminating(self) -> bool:
        """The process is being terminated: save nothing more, exit cleanly."""
        return self._flag.terminating

    @property
    def last_signal(self) -> tuple[str, float] | None:
        """(name, time.monotonic()) of the last checkpoint request signal."""
        if self._flag.signum is None:
            return None
        return signal.Signals(self._flag.signum).name, self._flag.signalled_at

    # -- one decision per step boundary -----------------------------------
    @property
    def agreement(self) -> StepAgreement | None:
        """The step agreement in use (None: this rank decides alone)."""
        if not self._agreement_checked:
            self._agreement_checked = True
            if self.independent or self._lockstep is False:
                return None
            if self._group is not None or distributed() is not None:
                self._agreement = StepAgreement(self._group, timeout=self._agreement_timeout,
                                                overlap=self._overlap)
                if self._agreement.rank != self.rank or (self.world_size is not None
                                                         and self._agreement.world_size != self.world_size):
                    raise BadValueError(
                        what="process group", value=f"rank {self._agreement.rank} of {self._agreement.world_size}",
                        why=f"the launcher says rank {self.rank} of {self.world_size}: acknowledgements "
                            "would name the wrong rank")
                self.world_size = self._agreement.world_size
            elif self._lockstep:
                raise UsageError("slurm-snap client: lockstep=True but no torch.distributed process group "
                                 "with more than one rank is initialised")
        return self._agreement

    @property
    def agreement_state(self) -> str:
        """What acknowledgements say about how the step was chosen."""
        agreement = self._agreement
        if agreement is None:
            return ""
        return agreement.failure or "collective"

    def decide(self, step: int) -> Action:
        """Call once per step, at the same point on every rank. In a lockstep
        job (a process group) every rank gets the same answer at the same
        step: checkpoint when any rank was asked, stop when any rank is
        terminating. Alone, the answer is this rank's own flags."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise BadValueError(what="step", value=step, why="expected an integer >= 0")
        self._boundaries += 1
        flag = self._flag
        agreement = self.agreement
        if agreement is None or agreement.failed:
            return Action(checkpoint=self._serve_local(), stop=flag.terminating or self._stop)
        if not agreement.due():
            # Between two exchanges (the agreed pace): nothing new is decided.
            return Action(checkpoint=False, stop=self._stop)
        if not agreement.overlap:
            agreement.send(flag.pending and not flag.terminating, flag.terminating, step, self._rank0_verdict())
            return self._apply(agreement.collect(), step)
        # Overlapped: the exchange sent at the previous exchange boundary
        # decides now, then this boundary's flags go out. Requests this
        # decision serves are not sent again (the peers would checkpoint twice).
        action = self._apply(agreement.collect(), step)
        if not agreement.failed:
            agreement.send(flag.pending and not flag.terminating and not action.checkpoint,
                           flag.terminating, step, self._rank0_verdict())
        return action

    def _verdict_now(self) -> int:
        """This rank's verdict on its pending (or its peers') request, asked
        once per request: VERDICT_GO or VERDICT_STRAY. SIGTERM is never
        filtered (some sites send only it at preemption)."""
        flag = self._flag
        if self._verdict is None or self._verdict[0] != flag.requests:
            if flag.pending and flag.signum == signal.SIGTERM:
                v = VERDICT_GO
            else:
                why = reason.checkpoint_reason(self.jobdir if self.enabled else None,
                                               margin=self.timelimit_margin)
                v = VERDICT_STRAY if why == reason.STRAY else VERDICT_GO
            self._verdict = (flag.requests, v)
        return self._verdict[1]

    def _rank0_verdict(self) -> int:
        """What this rank puts in the exchange: rank 0's verdict when a
        request is pending there or being confirmed, else nothing (0)."""
        flag = self._flag
        if self.rank != 0 or flag.terminating or not (flag.pending or self._confirming):
            return VERDICT_NONE
        return self._verdict_now()

    def _ignore_stray(self, upto: int) -> None:
        """A checkpoint signal with no request and no preemption: served as
        nothing. Later requests (past `upto`) stay pending."""
        self._flag.clear(upto, after_preempt=False)
        self._verdict = None
        self.ignored_signals += 1

    def _apply(self, decided, step: int) -> Action:
        flag = self._flag
        if decided is None:
            if self._agreement is not None and self._agreement.failed:
                # The collective failed: decide alone from now on; the
                # acknowledgements say the agreement failed.
                return Action(checkpoint=self._serve_local(), stop=flag.terminating or self._stop)
            return Action(checkpoint=False, stop=False)   # the first overlapped boundary
        if decided.step_min != decided.step_max and not self._agreement.failure:
            # Same exchange, different steps: the program calls decide() at
            # different points on different ranks. Keep exchanging (the
            # collectives stay matched) but never call the result one point.
            self._agreement.give_up(f"failed: ranks were at steps {decided.step_min} to "
                                    f"{decided.step_max} at one agreement")
        self._stop = self._stop or decided.stop
        if decided.checkpoint and not self._stop and not flag.terminating:
            if decided.verdict == VERDICT_NONE:
                # Rank 0 had not seen the request when it sent: it gives its
                # verdict in the next exchange, and every rank waits for it.
                if not self._confirming:
                    self._confirming, self._confirm_upto = True, flag.requests
                return Action(checkpoint=False, stop=False)
            upto = self._confirm_upto if self._confirming else flag.requests
            self._confirming = False
            if decided.verdict == VERDICT_STRAY:
                self._ignore_stray(upto)
                return Action(checkpoint=False, stop=self._stop)
            self._verdict = None
            if not flag.pending:
                # A peer was asked; this rank's own copy of the signal may
                # still be on its way and must not start a second checkpoint.
                flag.owed += 1
            self._seen_at = flag.signalled_wall if flag.pending else None
            self._serving = flag.requests
            flag.serving = True
            # Fixed now: a rank asked by its peers has no pending request to
            # fix it later, and all must serve the same epoch.
            self._epoch = self._current_epoch() if self.enabled else None
            return Action(checkpoint=True, stop=False)
        return Action(checkpoint=False, stop=self._stop)

    def should_checkpoint(self, step: int | None = None) -> bool:
        """Call at a step boundary; True when a checkpoint was requested
        (for every rank, with a process group: see decide())."""
        if self.agreement is not None and not self.agreement.failed:
            return self.decide(self._boundaries if step is None else step).checkpoint
        return self._serve_local()

    @property
    def stopping(self) -> bool:
        """The job decided to stop (every rank of a lockstep job at the same
        step; alone: this rank is terminating)."""
        return self._stop or (self._agreement is None and self._flag.terminating)

    def _serve_local(self) -> bool:
        if self._flag.pending and not self._flag.terminating:
            if self._verdict_now() == VERDICT_STRAY:
                self._ignore_stray(self._flag.requests)
                return False
            self._verdict = None
            self._serving = self._flag.requests
            self._seen_at = self._flag.signalled_wall
            self._flag.serving = True
            return True
        return False

    # -- protocol -----------------------------------------------------------
    def epoch(self) -> str:
        """The snapshot epoch being served: request.json's for an on-demand
        snapshot that is not yet released nor past its deadline, otherwise
        `preempt-<restart count>` (at preemption Slurm signals, nobody writes
        a request). Fixed once computed, until the request is served."""
        if self._epoch is not None:
            return self._epoch
        epoch = self._current_epoch()
        if self._flag.pending:
            self._epoch = epoch
        return epoch

    def _current_epoch(self) -> str:
        jd = self.jobdir
        request = jd.read_request()
        if request is not None and jd.request_is_current(request):
            epoch = request.epoch
        else:
            epoch = preempt_epoch(self.restart_count)
        return epoch

    def commit(self, step: int, files: Iterable, hash: bool = False, root: str | None = None) -> str:
        """Make `files` durable, then write this rank's ack atomically.

        Each file is fsynced, then every directory from its parent up to
        `root` (default: the mount point holding it), so new directory
        entries survive too. Returns the ack's path.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise BadValueError(what="step", value=step, why="expected an integer >= 0")
        if isinstance(files, (str, bytes, os.PathLike)):
            raise BadValueError(what="checkpoint file list", value=files, why="expected a list of paths")
        paths: list[str] = []
        for name in files:
            path = os.path.realpath(os.fspath(name))
            try:
                info = os.stat(path)
            except FileNotFoundError:
                raise NotFound(what="checkpoint file", value=os.fspath(name)) from None
            if not stat.S_ISREG(info.st_mode):
                raise BadValueError(what="checkpoint file", value=os.fspath(name), why="not a regular file")
            if root is not None and os.path.commonpath([path, os.path.realpath(root)]) != os.path.realpath(root):
                raise BadValueError(what="checkpoint file", value=os.fspath(name),
                                    why=f"not under the checkpoint root {root!r}")
            if path not in paths:
                paths.append(path)
        epoch = self.epoch()
        directories: list[str] = []
        manifest = []
        for path in paths:
            digest = sha256_file(path) if hash else None
            fsync_path(path)
            manifest.append(ManifestEntry(path=path, size=os.stat(path).st_size, sha256=digest))
            for directory in parent_dirs(path, root):
                if directory not in directories:
                    directories.append(directory)
        for directory in directories:
            fsync_path(directory, directory=True)
        jd = self.jobdir
        if not os.path.isdir(jd.ack):
            os.makedirs(jd.ack, mode=0o700, exist_ok=True)
            fsync_path(jd.path, directory=True)
        ack_path = jd.ack_path(self.node, self.rank)
        atomic_write(ack_path, Ack(
            job_id=self.job_id, epoch=epoch, node=self.node, rank=self.rank,
            local_rank=self.local_rank, local_size=self.local_size, step=step,
            written_at=utcnow(), manifest=tuple(manifest), world_size=self.world_size,
            independent=self.independent, agreement=self.agreement_state,
            signalled_at=self._signalled_at()).to_bytes())
        self._maybe_release_early(epoch)
        return ack_path

    def _signalled_at(self) -> datetime | None:
        """When the request being served reached this rank (its own signal),
        None when the rank joined its peers' checkpoint without one."""
        wall = self._seen_at
        return None if wall is None else datetime.fromtimestamp(wall, timezone.utc)

    def _maybe_release_early(self, epoch: str) -> None:
        if ((self.early_release or self.timelimit_margin) and self.rank == 0 and self.world_size
                and self._early is None and is_preempt_epoch(epoch)):
            # Until Slurm's own kill ends this process, whatever GraceTime is.
            self._early = early.EarlyRelease(self.jobdir, epoch, self.world_size,
                                             deadline=time.monotonic() + 7 * 86400,
                                             early_release=self.early_release,
                                             margin=self.timelimit_margin).start()

    def commit_async(self, step: int, future, files: Iterable | Callable[[], Iterable], **kwargs) -> None:
        """commit() once `future` (e.g. torch.distributed.checkpoint.async_save's)
        has completed, in a thread, so training goes on while the save runs.
        `files` may be a callable, called after the save (the shards exist
        only then). wait_for_release() and close() wait for it first; a
        failed save raises there and nothing is acknowledged."""
        self._join_commit()
        epoch = self.epoch()    # fixed now: the thread must not read a later request
        done = getattr(future, "upload_completion", future)   # DCP's AsyncSaveResponse

        def run():
            try:
                done.result()
                self.commit(step, files() if callable(files) else files, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the rank's thread
                self._commit_error = exc
        self._epoch = epoch
        self._commit_error = None
        self._commit_thread = threading.Thread(target=run, name="slurm-snap-commit", daemon=True)
        self._commit_thread.start()

    def _join_commit(self) -> None:
        thread, self._commit_thread = self._commit_thread, None
        if thread is not None:
            thread.join()
            error, self._commit_error = self._commit_error, None
            if error is not None:
                raise error

    def release_path(self, epoch: str | None = None) -> str:
        return self.jobdir.release_path(epoch or self.epoch())

    def wait_for_release(self, timeout: float, use_inotify: bool = True) -> bool:
        """Wait until the coordinator releases this epoch. True when released;
        False on timeout or when termination began (a further SIGTERM). The
        request counts as served either way, so training can go on; after a
        preemption epoch a later SIGTERM means terminate."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise BadValueError(what="release timeout", value=timeout, why="expected seconds >= 0")
        self._join_commit()
        epoch = self.epoch()
        try:
            released = self._wait_release(epoch, timeout, use_inotify)
        finally:
            if self._early is not None:
                self._early.stop()
                self._early = None
        if not self._flag.terminating:
            self._flag.clear(self._serving or self._flag.requests,
                             after_preempt=is_preempt_epoch(epoch))
            self._epoch = None
        return released

    def _served_alone(self) -> None:
        """The request was served with nobody to release it (outside slurm-snap:
        the framework callbacks checkpoint on the signal anyway): it is done,
        so the next step does not checkpoint again."""
        self._flag.clear(self._serving or self._flag.requests, after_preempt=False)
        self._epoch = None

    def _wait_release(self, epoch: str, timeout: float, use_inotify: bool) -> bool:
        return wait_for_path(self.release_path(epoch), float(timeout),
                             should_abort=lambda: self._flag.terminating, use_inotify=use_inotify)

    # -- resuming -----------------------------------------------------------
    def resume_info(self) -> dict | None:
        """resume.json of a requeued run, validated, as the object documented
        in docs/client.md; None when absent or when this rank is not under
        slurm-snap."""
        if not self.enabled:
            return None
        resume = self.jobdir.read_resume()
        return None if resume is None else resume.to_json()

    def checkpoint_dir(self, subdir: str = "ckpt") -> str:
        """Where a framework callback keeps its checkpoints: `subdir` of the
        first shared volume the job declared (client/checkpoint_dir.py);
        CheckpointDirError naming why when none can hold them; the working
        directory outside slurm-snap."""
        return checkpoint_dir.choose(self.jobdir.read_job() if self.enabled else None, self.job_id, subdir,
                                     self._env)

    def covers(self, path: str) -> bool:
        """`path` is inside a volume the job declared (so the snapshot holds it)."""
        return checkpoint_dir.covered(self.jobdir.read_job() if self.enabled else None, self.node, path)

    def volume_path(self, class_name: str) -> str:
        """Path of a declared volume class for this node, from job.json."""
        job = self.jobdir.read_job()
        path = None if job is None else job.volume_path(class_name, self.node)
        if path is None:
            raise NotFound(what="volume class", value=class_name)
        return path

    def mark_first_step(self, step: int) -> str:
        return mark_first_step(step, env=self._env)
