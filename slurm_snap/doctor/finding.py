"""One line of doctor's output."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """`ok`: the check passed. `fix`: what to do when it did not. A check that
    cannot be decided from the controller (a site's own Prolog wrapper) is
    `ok` with `verified` False: not a problem doctor can show, and `fix` says
    how to check it by hand. `warn`: `ok` (slurm-snap works as it is) but
    worth acting on: a pyslurm refused while Slurm's commands serve; `fix`
    says what to do."""
    ok: bool
    what: str
    fix: str = ""
    verified: bool = True
    warn: bool = False
