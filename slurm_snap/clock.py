"""The one clock: aware UTC datetimes everywhere (SQLite stores no zone, so
the inventory's UTC type restores it on read). Code that must be testable
takes a `clock` argument defaulting to this function."""
from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def aware(t: dt.datetime) -> dt.datetime:
    """A time the database or Slurm gave without a zone is UTC."""
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
