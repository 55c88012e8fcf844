"""What the framework callbacks (lightning.py, huggingface.py) share: the
rank's Checkpointer, created on first use, the checkpoints taken, where a
requeued run resumes from, and the restore-drill marker after its first
step. Standard library only: each callback imports its framework itself.
"""
from __future__ import annotations

import os

from slurm_snap.client.checkpointer import Checkpointer


class CallbackState:
    """Mixed into a framework's callback class; `_state_init` from its __init__."""

    def _state_init(self, release_timeout: float, checkpointer_options: dict) -> None:
        self.release_timeout = release_timeout
        self._options = checkpointer_options
        self.ckpt: Checkpointer | None = None
        self.saved: list[tuple[int, str]] = []      # (step, path) of every checkpoint taken
        self._resumed_from: int | None = None
        self._marked = False

    def _client(self) -> Checkpointer:
        if self.ckpt is None:
            self.ckpt = Checkpointer(**self._options)
        return self.ckpt

    @property
    def resumed_step(self) -> int | None:
        """The step resume_path() found (None: a fresh start)."""
        return self._resumed_from

    def _from_resume_json(self, inside: str | None = None) -> str | None:
        """In a requeued run: rank 0's checkpoint in the set resume.json names,
        the snapshot's copy first (`inside` that directory when given)."""
        info = self._client().resume_info()
        if info is None:
            return None
        for key in ("snapshot", "live"):
            path = info["checkpoint"][key]
            if path and inside and os.path.isdir(path):
                path = os.path.join(path, inside)
            if path and os.path.exists(path):
                self._resumed_from = int(info["step"])
                return path
        return None

    def _newest(self, base: str, prefix: str, inside: str | None = None) -> str | None:
        """The newest `<prefix><step>` of `base` (holding `inside` when given)."""
        steps = sorted((int(n[len(prefix):]), n) for n in (os.listdir(base) if os.path.isdir(base) else ())
                       if n.startswith(prefix) and n[len(prefix):].isdigit()
                       and (inside is None or os.path.isfile(os.path.join(base, n, inside))))
        if not steps:
            return None
        self._resumed_from = steps[-1][0]
        return os.path.join(base, steps[-1][1], *([inside] if inside else []))

    def _mark_first_step(self, step: int, is_zero: bool) -> None:
        """The restore-drill marker, once, at the first step after the resumed one."""
        if self._resumed_from is not None and not self._marked and step > self._resumed_from:
            self._marked = True
            if is_zero:
                self._client().mark_first_step(step)
