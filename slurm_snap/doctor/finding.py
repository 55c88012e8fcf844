"""One line of doctor's output."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    """`ok`: the check passed. `fix`: what to do when it did not. A check that
    cannot be decided from the controller (a site's own Prolog wrapper) is
    `ok` with `verified` False: not a problem doctor can show, and `fix` says
    how to check it by hand. A setup that works but that a site should know
    it chose (users' programs on this host; a pyslurm refused while Slurm's commands
    serve) is `ok` with `warning` True, `fix` saying why or what to do."""
    ok: bool
    what: str
    fix: str = ""
    verified: bool = True
    warning: bool = False
