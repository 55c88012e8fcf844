"""PyTorch Lightning with slurm-snap: one callback.

    from slurm_snap.client.lightning import SnapshotCallback

    snap = SnapshotCallback()                    # dirpath: <pfs volume>/ckpt by default
    trainer = L.Trainer(..., callbacks=[snap])
    trainer.fit(model, data, ckpt_path=snap.resume_path())

At every training batch's end all ranks agree (client/agree.py) whether to
checkpoint; when they do, `trainer.save_checkpoint()` runs on every rank
(Lightning writes on rank 0), each rank acknowledges what it wrote, waits
for the release, and training goes on, or stops at preemption.

Lightning's own SLURM auto-requeue (SLURMEnvironment(auto_requeue=True), its
default) also answers SIGUSR1: it saves an "hpc" checkpoint inside the signal
handler and runs `scontrol requeue`. With both, a preemption would give two
checkpoints and two requeues, and an on-demand snapshot would requeue the job.
Lightning installs its SIGUSR1 handler only when none is installed yet, after
the callbacks' setup(): so this callback installs the client's in setup(),
Lightning leaves SIGUSR1 alone, and the requeue is Slurm's own (the partition's
PreemptMode=REQUEUE). Lightning's SIGTERM handling is kept: it chains to ours.
"""
from __future__ import annotations

import os
import signal

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from slurm_snap.client.checkpointer import Checkpointer
from slurm_snap.errors import SnapError


class SnapshotCallback(pl.Callback):
    def __init__(self, dirpath: str | None = None, *, release_timeout: float = 120.0,
                 filename: str = "model.ckpt", **checkpointer_options):
        super().__init__()
        self.dirpath = dirpath
        self.filename = filename
        self.release_timeout = release_timeout
        self._options = checkpointer_options
        self.ckpt: Checkpointer | None = None
        self.saved: list[tuple[int, str]] = []      # (step, path) of every checkpoint taken
        self._resumed_from: int | None = None
        self._marked = False

    # -- where ------------------------------------------------------------
    def _client(self) -> Checkpointer:
        if self.ckpt is None:
            self.ckpt = Checkpointer(**self._options)
        return self.ckpt

    def checkpoint_dir(self) -> str:
        """dirpath, else <pfs volume>/ckpt (in a restore drill: the clone's)."""
        if self.dirpath:
            return os.path.abspath(self.dirpath)
        restored = os.environ.get("SLURM_SNAP_RESTORE_PFS")
        if os.environ.get("SLURM_SNAP_RESTORE") == "1" and restored:
            return os.path.join(restored, "ckpt")
        ckpt = self._client()
        if ckpt.enabled:
            try:
                return os.path.join(ckpt.volume_path("pfs"), "ckpt")
            except SnapError:
                pass
        return os.path.abspath("ckpt")

    def resume_path(self) -> str | None:
        """The checkpoint file to pass as trainer.fit(ckpt_path=...): in a
        requeued run the snapshot's copy named by resume.json; otherwise the
        newest step-N/<filename> of checkpoint_dir(); None for a fresh start.
        `resumed_step` says which step it is."""
        info = self._client().resume_info()
        if info is not None:
            for key in ("snapshot", "live"):
                path = info["checkpoint"][key]
                if path and os.path.isdir(path):
                    path = os.path.join(path, self.filename)
                if path and os.path.isfile(path):
                    self._resumed_from = int(info["step"])
                    return path
        base = self.checkpoint_dir()
        steps = sorted((int(n[5:]), n) for n in (os.listdir(base) if os.path.isdir(base) else ())
                       if n.startswith("step-") and n[5:].isdigit()
                       and os.path.isfile(os.path.join(base, n, self.filename)))
        if steps:
            self._resumed_from = steps[-1][0]
            return os.path.join(base, steps[-1][1], self.filename)
        return None

    @property
    def resumed_step(self) -> int | None:
        return self._resumed_from

    # -- Lightning hooks ----------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            self._client().install()

    def on_train_start(self, trainer, pl_module) -> None:
        ckpt = self._client()
        current = signal.getsignal(signal.SIGUSR1)
        if current is not ckpt._flag.handler and signal.SIGUSR1 in ckpt._flag.request_signals:
            # Someone (a Lightning older or newer than the one this was
            # measured with) replaced the handler after setup(): take SIGUSR1
            # back without chaining to an auto-requeue handler.
            signal.signal(signal.SIGUSR1, ckpt._flag.handler)
            ckpt._flag._previous[signal.SIGUSR1] = signal.SIG_DFL

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ckpt = self._client()
        step = int(trainer.global_step)
        if self._resumed_from is not None and not self._marked and step > self._resumed_from:
            self._marked = True
            if trainer.is_global_zero:
                ckpt.mark_first_step(step)
        action = ckpt.decide(step)
        if action.checkpoint:
            path = os.path.join(self.checkpoint_dir(), f"step-{step}", self.filename)
            trainer.save_checkpoint(path)   # every rank: Lightning's own barrier; rank 0 writes
            self.saved.append((step, path))
            if ckpt.enabled:
                ckpt.commit(step, [path] if trainer.is_global_zero else [])
                if not ckpt.wait_for_release(self.release_timeout) and ckpt.terminating:
                    trainer.should_stop = True
        if action.stop:
            trainer.should_stop = True

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.ckpt is not None and stage == "fit":
            self.ckpt.uninstall()
