"""Slurm's time syntax for -S/-E, read exactly as libslurm 22.05 reads it,
and sacct's way of printing times.

sacct hands -S/-E to libslurm's slurm_parse_time(value, past=1). That parser is
a left-to-right scanner, not a grammar: tokens may be combined and separated by
blanks, '-' or an upper-case 'T', a later token overrides an earlier one, and
several habits of other tools are refused (`now-2h`, `11/30/2026`, `10am`,
`elevenses`, which 22.05 does not know). An admin's muscle memory is sacct's, so this
module repeats that scanner, quirks included, and
tests/unit/test_slurmtime_libslurm.py compares it with the installed libslurm
form by form. Tokens:
  now[{+|-}COUNT[seconds|minutes|hours|days|weeks]]   (full unit names only)
  today, tomorrow, midnight, noon, fika (15:00), teatime (16:00)   (lower case,
      since an upper-case T is a separator before any word is looked at)
  YYYY-MM-DD    MM/DD[/YY], MM.DD[.YY], MMDD[YY]   (a 2-digit year, 00 = none)
  HH:MM[:SS][ ][AM|PM]
  uts<seconds since the epoch>   (the whole value)
Where libslurm's answer would be "no time" (0) or an error, parse_time raises
BadValueError naming the value. It refuses, where libslurm gives an answer, only
values whose answer a datetime cannot hold (before year 1 or after 9999) and
values libslurm reads past the end of (undefined behaviour in C).

With past=True (sacct's -S/-E) a time of day alone is today and a date without
a year is this year, or last year when its month is later than this one; with
past=False they are the next such time, as sbatch --begin reads them.
The clock (`now`) and the zone (`tz`) are parameters so tests do not depend on
when or where they run; tz=None means the system's local zone.

Length: one home for Slurm's time syntax, parsing and printing; the scanner
is libslurm's, token by token, and does not split without scattering it.
"""
from __future__ import annotations

import datetime as dt
import math
import time

from ..errors import BadValueError

UTC = dt.timezone.utc

_NL, _NUL = 0x0A, 0
_BLANK = b" \t"
_SPACE = b" \t\n\v\f\r"
_SKIP = b" \t-T"
_DAY = 86400
_LONG_MAX = 2**63 - 1
# libslurm's table, in its order: the first prefix that matches wins, so
# "second" must come after "seconds".
_UNITS = ((b"seconds", 1), (b"second", 1), (b"minutes", 60), (b"minute", 60), (b"hours", 3600),
          (b"hour", 3600), (b"days", _DAY), (b"day", _DAY), (b"weeks", 7 * _DAY), (b"week", 7 * _DAY))
_NAMED_HOURS = ((b"midnight", 0), (b"noon", 12), (b"fika", 15), (b"teatime", 16))
_FORMS = ("now[{+|-}N[seconds|minutes|hours|days|weeks]], today, tomorrow, midnight, noon, fika, teatime, "
          "YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY][-HH:MM[:SS]], MMDD[YY], HH:MM[:SS][AM|PM] or uts<epoch>")


class _Invalid(Exception):
    """Where the scan stopped and why; parse_time turns it into BadValueError."""

    def __init__(self, pos: int, why: str):
        super().__init__(why)
        self.pos, self.why = pos, why


def parse_time(value: str, *, now: dt.datetime, tz: dt.tzinfo | None = None, what: str = "time",
               past: bool = True) -> dt.datetime:
    """Parse one Slurm time specification into an aware UTC datetime (whole seconds)."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")

    def bad(why: str) -> BadValueError:
        return BadValueError(what=what, value=value, why=why)

    # C sees bytes up to the first NUL; compare bytes so positions and the
    # ASCII-only character classes are the C ones.
    s = (value or "").encode("utf-8", "surrogateescape").split(b"\0", 1)[0]
    if not s.strip(_SPACE):
        raise bad("empty: give a time, e.g. now-1days, today or 2026-11-30T10:00")
    try:
        if s[:3].lower() == b"uts":
            return _from_epoch(_uts(s[3:]), bad)
        # time(NULL): whole seconds, truncated.
        return _scan(s, math.floor(now.timestamp()), tz, past, bad)
    except _Invalid as exc:
        near = s[exc.pos:exc.pos + 1].decode("utf-8", "replace") if exc.pos < len(s) else ""
        where = f" at character {exc.pos + 1} ({near!r})" if near else ""
        raise bad(f"{exc.why}{where}; Slurm's forms: {_FORMS}") from None


def _uts(rest: bytes) -> int:
    # strtol(): leading white space, a sign, decimal digits, nothing after;
    # libslurm wants at least 1000000 and refuses strtol's overflow value.
    text = rest.lstrip(_SPACE)
    sign, digits = (text[:1], text[1:]) if text[:1] in (b"+", b"-") else (b"", text)
    if not digits or not all(0x30 <= c <= 0x39 for c in digits):
        raise _Invalid(3, "uts must be followed by a number of seconds and nothing else")
    n = -int(digits) if sign == b"-" else int(digits)
    if n < 1000000 or n >= _LONG_MAX:
        raise _Invalid(3, "uts needs at least 1000000 seconds and less than 2^63-1")
    return n


def _scan(s: bytes, now_s: int, tz, past: bool, bad) -> dt.datetime:
    n = len(s)

    def at(i: int) -> int:
        return s[i] if i < n else _NUL

    now_tm = _local(now_s, tz, bad)
    hour = minute = -1
    second = 0
    month = mday = year = -1  # month is 1-12, year the full year; -1 = not given
    pos = 0
    while pos < n and s[pos] != _NL:
        c = s[pos]
        if c in _SKIP:
            pos += 1
            continue
        word = s[pos:pos + 8].lower()
        if word.startswith(b"today"):
            year, month, mday = now_tm.year, now_tm.month, now_tm.day
            pos += 5
            continue
        if word.startswith(b"tomorrow"):
            later = _local(now_s + _DAY, tz, bad)
            year, month, mday = later.year, later.month, later.day
            pos += 8
            continue
        named = next(((name, h) for name, h in _NAMED_HOURS if word.startswith(name)), None)
        if named:
            hour, minute, second = named[1], 0, 0
            pos += len(named[0])
            continue
        if word.startswith(b"now"):
            pos, delta = _now_offset(s, pos)
            later = _local(now_s + delta, tz, bad)
            year, month, mday = later.year, later.month, later.day
            hour, minute, second = later.hour, later.minute, later.second
            pos += 1
            continue
        if not 0x30 <= c <= 0x39:
            raise _Invalid(pos, "unexpected character")
        if at(pos + 1) == 0x3A or at(pos + 2) == 0x3A:  # ':' within two characters: a time of day
            pos, hour, minute, second = _clock(s, pos, at)
        else:
            pos, month, mday, given_year = _date(s, pos, at)
            if given_year is not None:
                year = given_year
        pos += 1

    if hour == -1 and month == -1:
        raise _Invalid(n, "names neither a date nor a time")
    if hour == -1:  # a date alone is its midnight
        hour, minute = 0, 0
    elif month == -1:  # a time alone: today, or with past=False the next such time
        if past or (hour, minute) > (now_tm.hour, now_tm.minute):
            year, month, mday = now_tm.year, now_tm.month, now_tm.day
        else:
            later = _local(now_s + _DAY, tz, bad)
            year, month, mday = later.year, later.month, later.day
    if year == -1:  # a month and day without a year
        if past:
            year = now_tm.year - 1 if month > now_tm.month else now_tm.year
        elif (month, mday, hour, minute) > (now_tm.month, now_tm.day, now_tm.hour, now_tm.minute):
            year = now_tm.year
        else:
            year = now_tm.year + 1
    return _mktime(year, month, mday, hour, minute, second, tz, bad)


def _now_offset(s: bytes, pos: int) -> tuple[int, int]:
    """After 'now' at pos: (position of the last character used, offset in seconds)."""
    n = len(s)
    i = pos + 3
    while True:
        c = s[i] if i < n else _NUL
        if c in (0x2B, 0x2D):  # '+' or '-'
            # libslurm adds the absolute index to pos, which is only right
            # when 'now' starts the value; elsewhere it reads further on, or
            # past the end of the string, which is undefined in C.
            start = pos + i
            if start + 1 > n:
                raise _Invalid(pos, "'now' must start the value (libslurm reads past the end of this one)")
            last, count = _count(s, start)
            return last, -count if c == 0x2D else count
        if c in _BLANK:
            i += 1
            continue
        if c in (_NUL, _NL):
            if pos + i > n:
                raise _Invalid(pos, "'now' must start the value (libslurm reads past the end of this one)")
            return pos + i - 1, 0
        raise _Invalid(pos + i, "'now' may only be followed by +N or -N")


def _count(s: bytes, sign_at: int) -> tuple[int, int]:
    """The COUNT[unit] after now's sign: digits (blanks between them are
    skipped) and one full unit name; a unit ends the count."""
    n = len(s)
    off = sign_at + 1
    cnt = digits = 0
    while off < n and s[off] != _NL:
        c = s[off]
        if c in _SPACE:
            off += 1
            continue
        unit = next(((name, mult) for name, mult in _UNITS if s[off:off + len(name)].lower() == name), None)
        if unit:
            off += len(unit[0])
            cnt *= unit[1]
            break
        if 0x30 <= c <= 0x39:
            cnt = cnt * 10 + c - 0x30
            digits += 1
            # C's long would overflow (undefined) long before a datetime's range ends.
            if cnt > _LONG_MAX:
                raise _Invalid(off, "the offset is too large")
            off += 1
            continue
        raise _Invalid(off, "an offset is N followed by seconds, minutes, hours, days or weeks (in full)")
    if not digits:
        raise _Invalid(sign_at, "'now+' or 'now-' needs a number")
    if cnt > _LONG_MAX:
        raise _Invalid(sign_at, "the offset is too large")
    return off - 1, cnt


def _two(at, off: int) -> int | None:
    a, b = at(off), at(off + 1)
    return (a - 0x30) * 10 + b - 0x30 if 0x30 <= a <= 0x39 and 0x30 <= b <= 0x39 else None


def _one_or_two(value: int, at, off: int) -> tuple[int, int]:
    """A number whose first digit (`value`) was read at off - 1: one more
    digit at off joins it, as libslurm reads months, days and hours."""
    if 0x30 <= at(off) <= 0x39:
        return value * 10 + at(off) - 0x30, off + 1
    return value, off


def _clock(s: bytes, off: int, at) -> tuple[int, int, int, int]:
    """HH:MM[:SS][ ][AM|PM] at off: (last position used, hour, minute, second)."""
    hr = at(off) - 0x30
    off += 1
    if at(off) != 0x3A:
        if not 0x30 <= at(off) <= 0x39:
            raise _Invalid(off, "a time of day is HH:MM[:SS]")
        hr = hr * 10 + at(off) - 0x30
        off += 1
    if hr > 23:
        raise _Invalid(off - 2, "the hour is not 0-23")
    if at(off) != 0x3A:
        raise _Invalid(off, "a time of day is HH:MM[:SS]")
    off += 1
    mi = _two(at, off)
    if mi is None or mi > 59:
        raise _Invalid(off, "the minutes are not two digits 00-59")
    off += 2
    sec = 0
    if at(off) == 0x3A:
        off += 1
        sec = _two(at, off)
        if sec is None or sec > 59:
            raise _Invalid(off, "the seconds are not two digits 00-59")
        off += 2
    while at(off) in _SPACE and off < len(s):
        off += 1
    suffix = s[off:off + 2].lower()
    if suffix == b"pm":
        hr += 12
        if hr > 23:
            if hr != 24:
                raise _Invalid(off, "PM needs an hour of 12 or less")
            hr = 12
        off += 2
    elif suffix == b"am":
        if hr > 11:
            if hr != 12:
                raise _Invalid(off, "AM needs an hour of 12 or less")
            hr = 0
        off += 2
    return off - 1, hr, mi, sec


def _signed(b: int) -> int:
    return b - 256 if b > 127 else b  # C's char is signed on the platforms Slurm runs on


def _date(s: bytes, off: int, at) -> tuple[int, int, int, int | None]:
    """A date at off: (last position used, month 1-12, day 1-31, year or None)."""
    n = len(s)
    if n >= off + 7 and at(off + 4) == 0x2D and at(off + 7) == 0x2D:  # YYYY-MM-DD
        for k in range(4):
            if not 0x30 <= at(off + k) <= 0x39:
                raise _Invalid(off + k, "a date YYYY-MM-DD has a four-digit year")
        yr = int(s[off:off + 4])
        off += 5
        # libslurm does not check the month's first character is a digit;
        # the range check and the day's position refuse every non-digit.
        mon, off = _one_or_two(_signed(at(off)) - 0x30, at, off + 1)
        if not 1 <= mon <= 12:
            raise _Invalid(off - 2, "the month is not 1-12")
        off += 1
        day, off = _day(at, off)
        return off - 1, mon, day, yr
    mon, off = _one_or_two(at(off) - 0x30, at, off + 1)
    if not 1 <= mon <= 12:
        raise _Invalid(off - 2, "the month is not 1-12 (dates are MM/DD[/YY])")
    if at(off) in (0x2E, 0x2F):
        off += 1
    day, off = _day(at, off)
    if at(off) in (0x2E, 0x2F):
        off += 1
    yr = 0
    if 0x30 <= at(off) <= 0x39:
        yr = _two(at, off)
        if yr is None:
            raise _Invalid(off, "the year of MM/DD/YY has two digits")
        off += 2
    # A two-digit year 00 counts as no year at all in libslurm.
    return off - 1, mon, day, 2000 + yr if yr else None


def _day(at, off: int) -> tuple[int, int]:
    if not 0x30 <= at(off) <= 0x39:
        raise _Invalid(off, "the day is missing")
    day, off = _one_or_two(at(off) - 0x30, at, off + 1)
    if not 1 <= day <= 31:
        raise _Invalid(off - 2, "the day is not 1-31")
    return day, off


_RANGE = "is outside the years 1-9999 slurm-snap can represent"


def _local(epoch: int, tz, bad) -> dt.datetime:
    try:
        return dt.datetime.fromtimestamp(epoch, tz) if tz is not None else dt.datetime.fromtimestamp(epoch)
    except (OverflowError, ValueError, OSError):
        raise bad(f"the time {_RANGE}") from None


def _mktime(year: int, month: int, mday: int, hour: int, minute: int, second: int, tz, bad) -> dt.datetime:
    # mktime() rolls a day past the month's end into the next month
    # (2026-02-30 is 2026-03-02), which libslurm relies on by checking only 1-31.
    try:
        naive = dt.datetime(year, month, 1, hour, minute, second) + dt.timedelta(days=mday - 1)
        local = naive.replace(tzinfo=tz) if tz is not None else naive.astimezone()
        t = local.astimezone(UTC)
    except (OverflowError, ValueError, OSError):
        raise bad(f"the date {_RANGE}") from None
    epoch = int(t.timestamp())
    # 0 is libslurm's "no time", -1 mktime's error: neither reaches sacct as a time.
    if epoch in (0, -1):
        raise bad("is the epoch itself (or one second before), which Slurm's parser cannot return as a time")
    return t


def _from_epoch(epoch: int, bad) -> dt.datetime:
    try:
        return dt.datetime.fromtimestamp(epoch, UTC)
    except (OverflowError, ValueError, OSError):
        raise bad(f"the time {_RANGE}") from None


def _to_local(t: dt.datetime, tz: dt.tzinfo | None) -> dt.datetime:
    return t.astimezone(tz) if tz is not None else t.astimezone()


# Local "YYYY-MM-DDTHH:MM" per minute of a time and zone: report prints
# thousands of times of one day, and converting and strftime'ing each was a
# fifth of its formatting (issue 36). A zone's offset changes only on a minute
# boundary and is whole minutes (else nothing is kept), so the seconds carry over.
_MINUTES: dict[tuple, str] = {}
_MINUTES_KEPT = 4096


def format_time(t: dt.datetime | None, tz: dt.tzinfo | None = None) -> str:
    """sacct's time format: local YYYY-MM-DDTHH:MM:SS; empty when unknown."""
    if t is None:
        return ""
    # tz None is the process's zone, which TZ + tzset may change: its names are in the key.
    key = (t.year, t.month, t.day, t.hour, t.minute, t.utcoffset(), tz if tz is not None else time.tzname)
    prefix = _MINUTES.get(key)
    if prefix is None:
        local = _to_local(t, tz)
        if (local.utcoffset() - t.utcoffset()).total_seconds() % 60:
            return local.strftime("%Y-%m-%dT%H:%M:%S")
        prefix = local.strftime("%Y-%m-%dT%H:%M")
        if len(_MINUTES) >= _MINUTES_KEPT:
            _MINUTES.clear()
        _MINUTES[key] = prefix
    return f"{prefix}:{t.second:02d}"


def format_elapsed(seconds: float | None) -> str:
    """sacct's elapsed format: [D-]HH:MM:SS (negative clock skew shows as 00:00:00)."""
    if seconds is None:
        return ""
    total = int(seconds) if seconds > 0 else 0
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


def iso_utc(t: dt.datetime | None) -> str | None:
    """The JSON form: UTC, second precision kept to microseconds, 'Z' suffix."""
    if t is None:
        return None
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
