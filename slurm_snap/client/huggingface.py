"""Hugging Face Trainer with slurm-snap: one callback.

    from slurm_snap.client.huggingface import SnapshotCallback

    snap = SnapshotCallback()
    args = TrainingArguments(output_dir=snap.checkpoint_dir(), ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[snap])
    trainer.train(resume_from_checkpoint=snap.resume_path())

At every step's end all ranks agree (client/agree.py: the Trainer runs DDP
through Accelerate, whose torch.distributed process group the agreement
uses) whether to checkpoint. When they do, the callback asks the Trainer to
save at this very step (`control.should_save`): the Trainer writes
`checkpoint-<step>/` as it always does (model, optimizer, scheduler,
trainer_state.json from the main process; `rng_state_<rank>.pth` from every
rank), then `on_save` acknowledges on each rank what that rank wrote, waits
for the release, and training goes on, or stops when the job is being
terminated (`control.should_training_stop`). The requeued run resumes with
the Trainer's own `resume_from_checkpoint`: model, optimizer, scheduler, RNG
states and the position in the data (the Trainer skips the batches it
already trained on).

transformers is imported here only: the rest of the client stays
standard-library only.
"""
from __future__ import annotations

import os
import re

from transformers import TrainerCallback

from slurm_snap.client.callback_state import CallbackState

# What the Trainer calls a checkpoint directory, and each rank's RNG state in it.
CHECKPOINT_PREFIX = "checkpoint-"
_RNG = re.compile(r"^rng_state_(\d+)\.pth$")


def own_files(directory: str, rank: int) -> list[str]:
    """The files of a Trainer checkpoint that rank `rank` wrote: the main
    process everything but the other ranks' RNG states; every other rank its
    own `rng_state_<rank>.pth` (none when it saved nothing)."""
    out = []
    for root, _dirs, names in os.walk(directory):
        for name in sorted(names):
            m = _RNG.match(name) if root == directory else None
            mine = (int(m.group(1)) == rank) if m else rank == 0
            if mine:
                out.append(os.path.join(root, name))
    return sorted(out)


class SnapshotCallback(CallbackState, TrainerCallback):
    def __init__(self, *, release_timeout: float = 120.0, **checkpointer_options):
        self._state_init(release_timeout, checkpointer_options)
        self._pending: int | None = None            # the step a checkpoint was asked for

    # -- where ------------------------------------------------------------
    def checkpoint_dir(self) -> str:
        """The Trainer's output_dir: hf/ on the first shared volume the job
        declared (client/checkpoint_dir.py; CheckpointDirError naming why when
        none can hold it)."""
        return self._client().checkpoint_dir("hf")

    def resume_path(self, given: str | None = None, *, output_dir: str | None = None) -> str | None:
        """What to pass as trainer.train(resume_from_checkpoint=...): `given`
        (a checkpoint-N directory, e.g. from `slurm-snap resume-path`); else in
        a requeued run the snapshot's copy of the checkpoint resume.json names;
        otherwise the newest checkpoint-N of `output_dir` (default
        checkpoint_dir()); None for a fresh start. `resumed_step` says which
        step it is."""
        if given:
            name = os.path.basename(os.path.normpath(given))
            if name.startswith(CHECKPOINT_PREFIX) and name[len(CHECKPOINT_PREFIX):].isdigit():
                self._resumed_from = int(name[len(CHECKPOINT_PREFIX):])
            return given
        found = self._from_resume_json()
        if found is not None and os.path.isdir(found):
            return found
        return self._newest(output_dir or self.checkpoint_dir(), CHECKPOINT_PREFIX)

    # -- the Trainer's events ---------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        ckpt = self._client()
        ckpt.install()
        if ckpt.enabled and state.is_world_process_zero and not ckpt.covers(args.output_dir):
            import warnings

            warnings.warn(f"slurm-snap: output_dir {args.output_dir} is outside the job's declared volumes, so "
                          f"no snapshot holds its checkpoints: use TrainingArguments(output_dir="
                          f"snap.checkpoint_dir())", stacklevel=2)

    def on_step_end(self, args, state, control, **kwargs):
        ckpt = self._client()
        step = int(state.global_step)
        self._mark_first_step(step, state.is_world_process_zero)
        action = ckpt.decide(step)
        if action.checkpoint:
            self._pending = step
            control.should_save = True       # the Trainer saves right after this event
        if action.stop:
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if self._pending is None:
            return control                   # the Trainer's own save_steps: not a snapshot's
        ckpt, step, self._pending = self._client(), int(state.global_step), None
        directory = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}{step}")
        self.saved.append((step, directory))
        if ckpt.enabled:
            ckpt.commit(step, own_files(directory, ckpt.rank))
            if not ckpt.wait_for_release(self.release_timeout) and ckpt.terminating:
                control.should_training_stop = True
        else:
            ckpt._served_alone()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.ckpt is not None:
            self.ckpt.uninstall()
