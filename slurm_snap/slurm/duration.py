"""The one duration parser: what scontrol prints (GraceTime, PrologEpilogTimeout)
and what a user types (prune --keep-within), into a timedelta.

Two spellings, one grammar:
  clock   "[D-][HH:]MM:SS" as Slurm prints times: "00:00:30", "1-00:00:00";
  units   "7d", "12h", "30m" (or "30min"), "90s" or combinations in that order, "1d12h".
A bare number is seconds only where scontrol printed it (`bare_seconds`): a
user's "30" is ambiguous (sbatch --time=30 means 30 minutes), so it is refused.
Standard library only: the hooks parse GraceTime on a job's path.
"""
from __future__ import annotations

import datetime as dt
import re

from ..errors import BadValueError

_CLOCK = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)")
_UNITS = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?:in)?)?(?:(\d+)s)?")
# What scontrol prints for "no limit".
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "NONE"})


def parse_duration(text: str, *, bare_seconds: bool = False, what: str = "duration") -> dt.timedelta:
    """The duration `text` names; BadValueError (naming `what`) otherwise."""
    raw = (text or "").strip()
    if bare_seconds and raw.isascii() and raw.isdigit():
        return dt.timedelta(seconds=int(raw))
    m = _CLOCK.fullmatch(raw)
    if m:
        d, h, mi, s = (int(g or 0) for g in m.groups())
        return dt.timedelta(days=d, hours=h, minutes=mi, seconds=s)
    m = _UNITS.fullmatch(raw)
    if raw and m and any(m.groups()):
        d, h, mi, s = (int(g or 0) for g in m.groups())
        return dt.timedelta(days=d, hours=h, minutes=mi, seconds=s)
    raise BadValueError(what=what, value=text, why="expected e.g. 7d, 12h, 1d12h, 30m, 90s or [D-]HH:MM:SS")


def slurm_seconds(text: str | None) -> int | None:
    """Whole seconds of a duration as scontrol prints it; None for UNLIMITED,
    empty or unparseable values (a check then has nothing to compare with)."""
    raw = (text or "").strip()
    if not raw or raw.upper() in _UNLIMITED:
        return None
    try:
        return int(parse_duration(raw, bare_seconds=True).total_seconds())
    except BadValueError:
        return None
