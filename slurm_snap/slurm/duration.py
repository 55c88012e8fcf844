"""The one duration grammar: what every option and configuration key that
takes a DURATION reads (prune --keep-within, metrics --job-window,
--snapshot-every, snapshot/restore-test --deadline, repair --older-than,
[schedule] every, [restore] verify_within), and what scontrol prints
(GraceTime, PrologEpilogTimeout). Slurm's spellings, as the rest of the CLI:

  clock   Slurm's time-limit forms (sbatch --time): "MM:SS", "HH:MM:SS",
          "D-HH", "D-HH:MM", "D-HH:MM:SS" ("1-00:00:00", "00:00:30");
  units   a count and a unit, largest first, each unit once: Slurm's unit
          words (seconds, minutes, hours, days, weeks, or the singular, as in
          `now+2hours`) or their short forms (s, m or min, h, d, w):
          "7days", "12h", "1d12h", "30min", "90s".
A bare number is refused where a user types it: sbatch --time=30 means 30
minutes while "30" in a seconds field means seconds, so it is read only
where the option says so (`bare_seconds`: SECONDS options, scontrol's output).
Standard library only: the hooks parse GraceTime on a job's path.
"""
from __future__ import annotations

import datetime as dt
import re

from ..errors import BadValueError

# Slurm's time limits: with a '-' the part after it is hours[:minutes[:seconds]];
# without, minutes:seconds or hours:minutes:seconds (a bare number is handled apart).
_DAYS_CLOCK = re.compile(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?")
_CLOCK = re.compile(r"(?:(\d+):)?(\d+):(\d+)")
_UNITS = re.compile(r"(?:(\d+)(?:weeks|week|w))?(?:(\d+)(?:days|day|d))?(?:(\d+)(?:hours|hour|h))?"
                    r"(?:(\d+)(?:minutes|minute|min|m))?(?:(\d+)(?:seconds|second|sec|s))?")
_UNIT_SECONDS = (7 * 86400, 86400, 3600, 60, 1)
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# What scontrol prints for "no limit".
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "NONE"})

# Every refusal lists these: the forms the option accepts.
FORMS = ("90s, 30min, 12h, 7d, 2w or Slurm's unit words (90seconds, 30minutes, 12hours, 7days, 2weeks), "
         "combined largest first (1d12h), or Slurm's clock forms MM:SS, HH:MM:SS, D-HH[:MM[:SS]]")
SECONDS_FORMS = f"a number of seconds (30, 0.5), or {FORMS}"


def parse_duration(text: str, *, bare_seconds: bool = False, what: str = "duration") -> dt.timedelta:
    """The duration `text` names; BadValueError (naming `what` and the
    accepted forms) otherwise. `bare_seconds`: a bare number is seconds."""
    raw = (text or "").strip()
    if _NUMBER.fullmatch(raw):
        if bare_seconds:
            return dt.timedelta(seconds=float(raw))
        raise BadValueError(what=what, value=text,
                            why=f"a bare number is ambiguous (sbatch --time reads {raw} as minutes): give a unit; "
                                f"accepted: {FORMS}")
    seconds = _seconds(raw)
    if seconds is None:
        raise BadValueError(what=what, value=text,
                            why=f"not a duration; accepted: {SECONDS_FORMS if bare_seconds else FORMS}")
    return dt.timedelta(seconds=seconds)


def _seconds(raw: str) -> int | None:
    if not raw.isascii():
        return None
    m = _DAYS_CLOCK.fullmatch(raw)
    if m:
        d, h, mi, s = (int(g or 0) for g in m.groups())
        return ((d * 24 + h) * 60 + mi) * 60 + s
    m = _CLOCK.fullmatch(raw)
    if m:
        h, mi, s = (int(g or 0) for g in m.groups())
        return (h * 60 + mi) * 60 + s
    m = _UNITS.fullmatch(raw)
    if raw and m and any(m.groups()):
        return sum(int(g or 0) * unit for g, unit in zip(m.groups(), _UNIT_SECONDS))
    return None


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
