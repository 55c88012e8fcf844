"""PyTorch Lightning with slurm-snap: one callback.

    from slurm_snap.client.lightning import SnapshotCallback

    snap = SnapshotCallback()                    # dirpath: ckpt/ on the job's shared volume
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

Sites that preempt with SIGTERM only: Lightning's SIGTERM handler makes every
rank stop at the end of the batch (SIGTERMException), before the step
agreement can make the checkpoint. So on_train_start, after Lightning
installed its handlers, puts the client's first again and holds back the
SIGTERM that asks for the checkpoint (signals.SignalFlag.hold_request_sigterm);
Lightning sees the one that ends the job (Slurm's at GraceTime's end, or the
early release's requeue) and stops then.

It also says, once, what would make a snapshot hold less than the user
thinks: a training DataLoader that is not resumable (the resumed run would
start its epoch again: use torchdata's StatefulDataLoader, whose position
Lightning saves in the checkpoint), and Lightning's own ModelCheckpoint
writing outside every declared volume.
"""
from __future__ import annotations

import os
import signal
import warnings

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from slurm_snap.client.callback_state import CallbackState


class SnapshotCallback(CallbackState, pl.Callback):
    def __init__(self, dirpath: str | None = None, *, release_timeout: float = 120.0,
                 filename: str = "model.ckpt", **checkpointer_options):
        super().__init__()
        self._state_init(release_timeout, checkpointer_options)
        self.dirpath = dirpath
        self.filename = filename
        self._sigterm_before = None

    # -- where ------------------------------------------------------------
    def checkpoint_dir(self) -> str:
        """dirpath, else ckpt/ on the first shared volume the job declared (in a
        restore drill: its restored copy); CheckpointDirError, naming why, when
        the job declared none that can hold it (client/checkpoint_dir.py)."""
        if self.dirpath:
            return os.path.abspath(self.dirpath)
        return self._client().checkpoint_dir("ckpt")

    def resume_path(self) -> str | None:
        """The checkpoint file to pass as trainer.fit(ckpt_path=...): in a
        requeued run the snapshot's copy named by resume.json; otherwise the
        newest step-N/<filename> of checkpoint_dir(); None for a fresh start.
        `resumed_step` says which step it is."""
        found = self._from_resume_json(self.filename)
        if found is not None and os.path.isfile(found):
            return found
        return self._newest(self.checkpoint_dir(), "step-", self.filename)

    # -- Lightning hooks ----------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "fit":
            ckpt = self._client()
            ckpt.install()
            if ckpt.enabled:
                self.checkpoint_dir()     # refuse now, not at the first checkpoint
                if trainer.is_global_zero:
                    self._warn_outside_volumes(trainer)

    def on_train_start(self, trainer, pl_module) -> None:
        ckpt = self._client()
        flag = ckpt._flag
        current = signal.getsignal(signal.SIGUSR1)
        if current is not flag.handler and signal.SIGUSR1 in flag.request_signals:
            # Someone (a Lightning older or newer than the one this was
            # measured with) replaced the handler after setup(): take SIGUSR1
            # back without chaining to an auto-requeue handler.
            signal.signal(signal.SIGUSR1, flag.handler)
            flag._previous[signal.SIGUSR1] = signal.SIG_DFL
        current = signal.getsignal(signal.SIGTERM)
        if current is not flag.handler and signal.SIGTERM in flag.request_signals:
            # Lightning composed its SIGTERM handler around ours: ours goes
            # first again, chaining to Lightning's without ourselves in it.
            # teardown() puts back what was there before Lightning, so a
            # SIGTERM after fit() never reaches Lightning's handler (which
            # broadcasts to the process group).
            self._sigterm_before = flag._previous.get(signal.SIGTERM)
            flag._previous[signal.SIGTERM] = _without(current, flag.handler)
            signal.signal(signal.SIGTERM, flag.handler)
        flag.hold_request_sigterm = True
        if trainer.is_global_zero and ckpt.enabled:
            self._warn_not_resumable(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        ckpt = self._client()
        step = int(trainer.global_step)
        self._mark_first_step(step, trainer.is_global_zero)
        action = ckpt.decide(step)
        if action.checkpoint:
            path = os.path.join(self.checkpoint_dir(), f"step-{step}", self.filename)
            trainer.save_checkpoint(path)   # every rank: Lightning's own barrier; rank 0 writes
            self.saved.append((step, path))
            if ckpt.enabled:
                ckpt.commit(step, [path] if trainer.is_global_zero else [])
                if not ckpt.wait_for_release(self.release_timeout) and ckpt.terminating:
                    trainer.should_stop = True
            else:
                ckpt._served_alone()
        if action.stop:
            trainer.should_stop = True

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.ckpt is not None and stage == "fit":
            flag = self.ckpt._flag
            flag.hold_request_sigterm = False
            if self._sigterm_before is not None:
                flag._previous[signal.SIGTERM] = self._sigterm_before
            self.ckpt.uninstall()

    # -- what the user is told once ------------------------------------------
    def _warn_outside_volumes(self, trainer) -> None:
        ckpt = self._client()
        for cb in trainer.checkpoint_callbacks:
            where = getattr(cb, "dirpath", None) or trainer.default_root_dir
            if where and not ckpt.covers(where):
                warnings.warn(f"slurm-snap: Lightning's {type(cb).__name__} writes under {where}, outside the "
                              f"job's declared volumes, so no snapshot holds those checkpoints (slurm-snap's own "
                              f"are in {self.checkpoint_dir()}). Keep them with Trainer(default_root_dir="
                              f"snap.checkpoint_dir()) or ModelCheckpoint(dirpath=...) on a declared volume, or "
                              f"turn them off with enable_checkpointing=False", stacklevel=2)
                return

    def _warn_not_resumable(self, trainer) -> None:
        loaders = getattr(trainer.fit_loop, "_combined_loader", None)
        loaders = getattr(loaders, "flattened", None) or []
        if any(not (hasattr(dl, "state_dict") and hasattr(dl, "load_state_dict")) for dl in loaders):
            warnings.warn("slurm-snap: the training DataLoader is not resumable: a run resumed from a snapshot "
                          "taken mid-epoch starts the epoch again from its first batch. Use torchdata's "
                          "StatefulDataLoader (Lightning saves its position in the checkpoint; docs/client.md)",
                          stacklevel=2)


def _without(handler, ours):
    """Lightning's composed handler (a list of handlers) without ours in it,
    so chaining to it does not call us twice."""
    inner = getattr(handler, "signal_handlers", None)
    if isinstance(inner, list):
        handler.signal_handlers = [h for h in inner if h != ours]
    return handler
