"""Slurm's time syntax for -S/-E, and sacct's way of printing times.

Accepted (as sacct documents them; times are the caller's local time):
  now[{+|-}COUNT[seconds|minutes|hours|days|weeks]]
  today, midnight, noon, elevenses (11:00), fika (15:00), teatime (16:00), tomorrow
  YYYY-MM-DD[THH:MM[:SS]]
  MM/DD[/YY][-HH:MM[:SS]], MM.DD[.YY][-HH:MM[:SS]], MMDD[YY][-HH:MM[:SS]]
  HH:MM[:SS][AM|PM]
Like sacct (which parses with Slurm's "past" rule), a bare time of day means
today and a date without a year means this year: report looks backwards.

The clock (`now`) and the zone (`tz`) are parameters so tests do not depend on
when or where they run; tz=None means the system's local zone.
"""
from __future__ import annotations

import datetime as dt
import re

from ..errors import BadValueError

UTC = dt.timezone.utc

_UNITS = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
    "w": 604800, "week": 604800, "weeks": 604800,
}
_NAMED_HOURS = {"midnight": 0, "noon": 12, "elevenses": 11, "fika": 15, "teatime": 16}

_NOW = re.compile(r"now(?:([+-])(\d+)([a-z]*))?")
_ISO = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?")  # input is lower-cased
_SLASH = re.compile(r"(\d{1,2})([/.])(\d{1,2})(?:\2(\d{2}|\d{4}))?")
_PACKED = re.compile(r"(\d{2})(\d{2})(\d{2})?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(am|pm)?")


def parse_time(value: str, *, now: dt.datetime, tz: dt.tzinfo | None = None, what: str = "time") -> dt.datetime:
    """Parse one Slurm time specification into an aware UTC datetime."""
    if now.tzinfo is None:
        raise ValueError("now must be an aware datetime")
    text = (value or "").strip().lower()

    def bad(why: str) -> BadValueError:
        return BadValueError(what=what, value=value, why=why)

    if not text:
        raise bad("empty")
    local_now = _to_local(now, tz)
    today = local_now.date()

    m = _NOW.fullmatch(text)
    if m:
        if not m.group(1):
            return now.astimezone(UTC)
        unit = m.group(3)
        if unit not in _UNITS:
            raise bad(f"unknown unit {unit!r} (seconds, minutes, hours, days or weeks)")
        delta = dt.timedelta(seconds=int(m.group(2)) * _UNITS[unit])
        return (now + delta if m.group(1) == "+" else now - delta).astimezone(UTC)
    if text == "today":
        return _at(today, dt.time(0), tz)
    if text == "tomorrow":
        return _at(today + dt.timedelta(days=1), dt.time(0), tz)
    if text in _NAMED_HOURS:
        return _at(today, dt.time(_NAMED_HOURS[text]), tz)

    m = _ISO.fullmatch(text)
    if m:
        day = _date(int(m.group(1)), int(m.group(2)), int(m.group(3)), bad)
        clock = _clock(m.group(4), m.group(5), m.group(6), None, bad) if m.group(4) else dt.time(0)
        return _at(day, clock, tz)

    date_part, dash, clock_part = text.partition("-")
    day = _parse_date(date_part, today, bad)
    if day is not None:
        clock = _parse_clock(clock_part, bad) if dash else dt.time(0)
        if clock is None:
            raise bad("the time after '-' must be HH:MM[:SS]")
        return _at(day, clock, tz)
    if dash:
        raise bad("not a Slurm time (see --help for the accepted formats)")
    clock = _parse_clock(text, bad)
    if clock is not None:
        return _at(today, clock, tz)
    raise bad("not a Slurm time: use now[-N{seconds|minutes|hours|days|weeks}], today, midnight, noon, "
              "YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY][-HH:MM[:SS]] or HH:MM[:SS]")


def _parse_date(text: str, today: dt.date, bad) -> dt.date | None:
    m = _SLASH.fullmatch(text)
    if m:
        month, day, year = int(m.group(1)), int(m.group(3)), m.group(4)
    else:
        m = _PACKED.fullmatch(text)
        if not m:
            return None
        month, day, year = int(m.group(1)), int(m.group(2)), m.group(3)
    if year is None:
        y = today.year
    else:
        y = int(year)
        if len(year) == 2:
            y += 2000
    return _date(y, month, day, bad)


def _parse_clock(text: str, bad) -> dt.time | None:
    m = _CLOCK.fullmatch(text)
    if not m:
        return None
    return _clock(m.group(1), m.group(2), m.group(3), m.group(4), bad)


def _date(year: int, month: int, day: int, bad) -> dt.date:
    try:
        return dt.date(year, month, day)
    except ValueError as exc:
        raise bad(str(exc)) from None


def _clock(hh, mm, ss, ampm, bad) -> dt.time:
    hour, minute, second = int(hh), int(mm), int(ss or 0)
    if ampm:
        if not 1 <= hour <= 12:
            raise bad(f"hour {hour} is not 1-12 with {ampm.upper()}")
        hour = hour % 12 + (12 if ampm == "pm" else 0)
    try:
        return dt.time(hour, minute, second)
    except ValueError as exc:
        raise bad(str(exc)) from None


def _at(day: dt.date, clock: dt.time, tz: dt.tzinfo | None) -> dt.datetime:
    naive = dt.datetime.combine(day, clock)
    # astimezone() on a naive value applies the system zone's rules for that
    # date (DST included), which a fixed offset taken from "now" would not.
    local = naive.replace(tzinfo=tz) if tz is not None else naive.astimezone()
    return local.astimezone(UTC)


def _to_local(t: dt.datetime, tz: dt.tzinfo | None) -> dt.datetime:
    return t.astimezone(tz) if tz is not None else t.astimezone()


def format_time(t: dt.datetime | None, tz: dt.tzinfo | None = None) -> str:
    """sacct's time format: local YYYY-MM-DDTHH:MM:SS; empty when unknown."""
    if t is None:
        return ""
    return _to_local(t, tz).strftime("%Y-%m-%dT%H:%M:%S")


def format_elapsed(seconds: float | None) -> str:
    """sacct's elapsed format: [D-]HH:MM:SS (negative clock skew shows as 00:00:00)."""
    if seconds is None:
        return ""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


def iso_utc(t: dt.datetime | None) -> str | None:
    """The JSON form: UTC, second precision kept to microseconds, 'Z' suffix."""
    if t is None:
        return None
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")
