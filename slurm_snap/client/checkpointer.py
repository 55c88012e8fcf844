"""Checkpointer: what a training rank calls to take part in a snapshot.

    ckpt = Checkpointer(); ckpt.install()
    for step in ...:
        train_one_step()
        if ckpt.should_checkpoint():
            files = save_my_checkpoint(step)
            ckpt.commit(step, files)
            ckpt.wait_for_release(timeout=60)
        if ckpt.terminating:
            break
"""
from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from slurm_snap.client import slurmenv
from slurm_snap.client.ack import ManifestEntry, build_ack
from slurm_snap.client.marker import mark_first_step
from slurm_snap.client.signals import SignalFlag, parse_signal
from slurm_snap.errors import BadValueError, NotFound, UsageError
from slurm_snap.fsio import atomic_write, fsync_path, parent_dirs, sha256_file
from slurm_snap.jobdir import JobDir, check_name
from slurm_snap.watch import wait_for_path

DEFAULT_SIGNALS = ("SIGUSR1", "SIGTERM")
PREEMPT_EPOCH_PREFIX = "preempt-"


class Checkpointer:
    def __init__(self, signals: Iterable | None = None, barrier_dir: str | None = None,
                 job_id: str | None = None, node: str | None = None, rank: int | None = None,
                 local_rank: int | None = None, local_size: int | None = None,
                 restart_count: int | None = None, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        if signals is None:
            configured = env.get("SLURM_SNAP_SIGNAL")
            # The site's configured signal replaces SIGUSR1; SIGTERM always stays.
            signals = (configured, "SIGTERM") if configured else DEFAULT_SIGNALS
        self._flag = SignalFlag(parse_signal(s) for s in signals)
        self.barrier_dir = barrier_dir if barrier_dir is not None else (env.get("SLURM_SNAP_BARRIER_DIR") or None)
        if self.barrier_dir is not None and not os.path.isabs(self.barrier_dir):
            raise BadValueError(what="barrier directory", value=self.barrier_dir, why="must be an absolute path")
        job_id = job_id if job_id is not None else (env.get("SLURM_JOB_ID") or None)
        self.job_id = check_name("job id", str(job_id)) if job_id is not None else None
        self.node = check_name("node name", node if node is not None else slurmenv.node_name_from_env(env))
        self.rank = self._int("rank", rank, slurmenv.int_from_env("SLURM_PROCID", env), 0)
        self.local_rank = self._int("local rank", local_rank, slurmenv.int_from_env("SLURM_LOCALID", env), 0)
        self.local_size = self._int("local size", local_size, slurmenv.local_size_from_env(env), 1)
        if self.local_size < 1 or self.local_rank >= self.local_size:
            raise BadValueError(what="local rank", value=self.local_rank,
                                why=f"must be in 0..{self.local_size - 1} (local size {self.local_size})")
        self.restart_count = self._int("restart count", restart_count,
                                       slurmenv.int_from_env("SLURM_RESTART_COUNT", env), 0)
        self._env = env
        self._serving = 0          # request counter value being served
        self._epoch: str | None = None  # fixed for the request being served

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
        self._flag.uninstall()

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

    def should_checkpoint(self) -> bool:
        """Call at a step boundary; True when a checkpoint was requested."""
        if self._flag.pending and not self._flag.terminating:
            self._serving = self._flag.requests
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
        jd = self.jobdir
        request = jd.read_request()
        if request is not None and jd.request_is_current(request):
            epoch = request["epoch"]
        else:
            epoch = f"{PREEMPT_EPOCH_PREFIX}{self.restart_count}"
        if self._flag.pending:
            self._epoch = epoch
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
        atomic_write(ack_path, build_ack(
            job_id=self.job_id, epoch=epoch, node=self.node, rank=self.rank,
            local_rank=self.local_rank, local_size=self.local_size, step=step,
            written_at=datetime.now(timezone.utc), manifest=manifest))
        return ack_path

    def release_path(self, epoch: str | None = None) -> str:
        return self.jobdir.release_path(epoch or self.epoch())

    def wait_for_release(self, timeout: float, use_inotify: bool = True) -> bool:
        """Wait until the coordinator releases this epoch. True when released;
        False on timeout or when termination began (a further SIGTERM). The
        request counts as served either way, so training can go on; after a
        preemption epoch a later SIGTERM means terminate."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise BadValueError(what="release timeout", value=timeout, why="expected seconds >= 0")
        epoch = self.epoch()
        released = wait_for_path(self.release_path(epoch), float(timeout),
                                 should_abort=lambda: self._flag.terminating, use_inotify=use_inotify)
        if not self._flag.terminating:
            self._flag.clear(self._serving or self._flag.requests,
                             after_preempt=epoch.startswith(PREEMPT_EPOCH_PREFIX))
            self._epoch = None
        return released

    # -- resuming -----------------------------------------------------------
    def resume_info(self) -> dict | None:
        """resume.json of a requeued run, validated; None when absent or when
        this rank is not under slurm-snap."""
        if not self.enabled:
            return None
        return self.jobdir.read_resume()

    def volume_path(self, class_name: str) -> str:
        """Path of a declared volume class for this node, from job.json."""
        path = self.jobdir.find_volume(class_name, self.node)
        if path is None:
            raise NotFound(what="volume class", value=class_name)
        return path

    def mark_first_step(self, step: int) -> str:
        return mark_first_step(step, env=self._env)
