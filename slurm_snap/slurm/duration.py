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

from ..errors import BadValueError

# Unit words, largest first; within a unit the longer spelling is tried
# first ("min" before "m", "seconds" before "s").
_UNITS = ((("weeks", "week", "w"), 7 * 86400), (("days", "day", "d"), 86400), (("hours", "hour", "h"), 3600),
          (("minutes", "minute", "min", "m"), 60), (("seconds", "second", "sec", "s"), 1))
# What scontrol prints for "no limit".
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "NONE"})

# Every refusal lists these: the forms the option accepts.
FORMS = ("90s, 30min, 12h, 7d, 2w or Slurm's unit words (90seconds, 30minutes, 12hours, 7days, 2weeks), "
         "combined largest first (1d12h), or Slurm's clock forms MM:SS, HH:MM:SS, D-HH[:MM[:SS]]")
SECONDS_FORMS = f"a number of seconds (30, 0.5), or {FORMS}"


def parse_duration(text: str, *, bare_seconds: bool = False, what: str = "duration"):
    """The duration `text` names, a datetime.timedelta; BadValueError (naming
    `what` and the accepted forms) otherwise. `bare_seconds`: a bare number
    is seconds."""
    import datetime as dt  # here: the submit check and the hooks need only seconds()

    return dt.timedelta(seconds=seconds(text, bare_seconds=bare_seconds, what=what))


def seconds(text: str, *, bare_seconds: bool = False, what: str = "duration") -> float:
    """parse_duration's answer in seconds (an int unless a bare number had a
    fraction). Scanned by hand, without `re`: the SPANK plugin's check of
    --snapshot-every inside sbatch and the hooks' GraceTime read it, and
    `re` with its compiled patterns was ~8 ms of such a process."""
    raw = (text or "").strip()
    if _is_number(raw):
        if bare_seconds:
            return float(raw)
        raise BadValueError(what=what, value=text,
                            why=f"a bare number is ambiguous (sbatch --time reads {raw} as minutes): give a unit; "
                                f"accepted: {FORMS}")
    found = _seconds(raw)
    if found is None:
        raise BadValueError(what=what, value=text,
                            why=f"not a duration; accepted: {SECONDS_FORMS if bare_seconds else FORMS}")
    return found


def _digits(s: str) -> bool:
    return s.isascii() and s.isdigit()


def _is_number(raw: str) -> bool:
    whole, dot, frac = raw.partition(".")
    return _digits(whole) and (not dot or _digits(frac))


def _seconds(raw: str) -> int | None:
    if not raw.isascii():
        return None
    if "-" in raw:                                   # D-HH[:MM[:SS]]
        days, _sep, rest = raw.partition("-")
        parts = rest.split(":")
        if not _digits(days) or len(parts) > 3 or not all(_digits(p) for p in parts):
            return None
        h, mi, s = (int(p) for p in parts + ["0"] * (3 - len(parts)))
        return ((int(days) * 24 + h) * 60 + mi) * 60 + s
    if ":" in raw:                                   # MM:SS or HH:MM:SS
        parts = raw.split(":")
        if len(parts) not in (2, 3) or not all(_digits(p) for p in parts):
            return None
        h, mi, s = (int(p) for p in ["0"] * (3 - len(parts)) + parts)
        return (h * 60 + mi) * 60 + s
    total, i, unit, found = 0, 0, 0, False           # 1d12h: counts with units, largest first, each once
    while i < len(raw):
        j = i
        while j < len(raw) and raw[j].isdigit():
            j += 1
        if j == i:
            return None
        count = int(raw[i:j])
        for k in range(unit, len(_UNITS)):
            words, size = _UNITS[k]
            word = next((w for w in words if raw.startswith(w, j)), None)
            if word is not None:
                break
        else:
            return None
        total, i, unit, found = total + count * size, j + len(word), k + 1, True
    return total if found else None


def slurm_seconds(text: str | None) -> int | None:
    """Whole seconds of a duration as scontrol prints it; None for UNLIMITED,
    empty or unparseable values (a check then has nothing to compare with)."""
    raw = (text or "").strip()
    if not raw or raw.upper() in _UNLIMITED:
        return None
    try:
        return int(seconds(raw, bare_seconds=True))
    except BadValueError:
        return None
