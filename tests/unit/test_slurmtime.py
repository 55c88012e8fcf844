"""Slurm's time syntax (-S/-E) with an injected clock and zone."""
from __future__ import annotations

import datetime as dt

import pytest

from slurm_snap.errors import BadValueError
from slurm_snap.slurm.slurmtime import format_elapsed, format_time, iso_utc, parse_time

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 30, 15, 45, 30, tzinfo=UTC)


def p(text, tz=UTC):
    return parse_time(text, now=NOW, tz=tz)


def u(text):
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize("text, expected", [
    ("now", "2026-11-30T15:45:30"),
    ("NOW", "2026-11-30T15:45:30"),
    ("now-1days", "2026-11-29T15:45:30"),
    ("now+2hours", "2026-11-30T17:45:30"),
    ("now-30minutes", "2026-11-30T15:15:30"),
    ("now-90", "2026-11-30T15:44:00"),
    ("now-45seconds", "2026-11-30T15:44:45"),
    ("now-2weeks", "2026-11-16T15:45:30"),
    ("now+1 day", "2026-12-01T15:45:30"),
    ("today", "2026-11-30T00:00:00"),
    ("midnight", "2026-11-30T00:00:00"),
    ("noon", "2026-11-30T12:00:00"),
    ("fika", "2026-11-30T15:00:00"),
    ("teatime", "2026-11-30T16:00:00"),
    ("tomorrow", "2026-12-01T00:00:00"),
    ("today noon", "2026-11-30T12:00:00"),
    ("noon tomorrow", "2026-12-01T12:00:00"),
    ("2026-11-30", "2026-11-30T00:00:00"),
    ("2026-11-30T10:00", "2026-11-30T10:00:00"),
    ("2026-11-30T10:00:07", "2026-11-30T10:00:07"),
    ("2026-11-30 10:00", "2026-11-30T10:00:00"),
    ("2026-02-30", "2026-03-02T00:00:00"),   # mktime rolls the day over, as in libslurm
    ("11/29", "2026-11-29T00:00:00"),
    ("12/25", "2025-12-25T00:00:00"),        # a later month than now is last year's (past rule)
    ("11/29/25", "2025-11-29T00:00:00"),
    ("11/30/00", "2026-11-30T00:00:00"),     # year 00 counts as no year
    ("11.29.25", "2025-11-29T00:00:00"),
    ("112925", "2025-11-29T00:00:00"),
    ("1129", "2026-11-29T00:00:00"),
    ("11/29-08:30", "2026-11-29T08:30:00"),
    ("11/29 08:30", "2026-11-29T08:30:00"),
    ("11/29-noon", "2026-11-29T12:00:00"),
    ("11/29/25-08:30:15", "2025-11-29T08:30:15"),
    ("10:00", "2026-11-30T10:00:00"),
    ("10:00:05", "2026-11-30T10:00:05"),
    ("9:15", "2026-11-30T09:15:00"),
    ("3:00pm", "2026-11-30T15:00:00"),
    ("3:00 PM", "2026-11-30T15:00:00"),
    ("12:00AM", "2026-11-30T00:00:00"),
    ("10:00-11:00", "2026-11-30T11:00:00"),  # the later token wins
    ("uts1800000000", "2027-01-15T08:00:00"),
])
def test_formats(text, expected):
    assert p(text) == u(expected)


def test_a_time_of_day_later_than_now_is_still_today_as_in_sacct():
    # sacct passes past=1: no roll-over to tomorrow.
    assert p("23:00") == u("2026-11-30T23:00:00")


def test_without_past_the_next_such_time_is_meant():
    def f(text):
        return parse_time(text, now=NOW, tz=UTC, past=False)

    assert f("10:00") == u("2026-12-01T10:00:00")
    assert f("23:00") == u("2026-11-30T23:00:00")
    assert f("12/25") == u("2026-12-25T00:00:00")
    assert f("11/29") == u("2027-11-29T00:00:00")


def test_local_zone_is_applied_then_converted_to_utc():
    cet = dt.timezone(dt.timedelta(hours=1))
    assert p("2026-11-30T10:00", tz=cet) == u("2026-11-30T09:00:00")
    # today is the caller's today: 15:45 UTC is 16:45 in CET, same date.
    assert p("today", tz=cet) == u("2026-11-29T23:00:00")


def test_result_is_aware_utc_in_whole_seconds():
    assert p("noon").tzinfo == UTC
    assert parse_time("now", now=NOW.replace(microsecond=999999), tz=UTC) == NOW


@pytest.mark.parametrize("bad", [
    "", " ", "-", "yesterday", "now-1fortnights", "now-", "now-2h", "now-90min", "2026-13-01", "25:00", "10:61",
    "13:00pm", "10am", "11/31/2026", "11/29/2025", "2026/11/30", "2026-11-30t10:00", "now-1days ago",
    "elevenses", "Today", "uts999999", "1970-01-01",
])
def test_bad_values_name_the_value(bad):
    with pytest.raises(BadValueError) as ei:
        parse_time(bad, now=NOW, tz=UTC, what="start time (-S)")
    assert repr(bad) in str(ei.value)
    assert "start time (-S)" in str(ei.value)


def test_the_error_says_where_the_scan_stopped():
    with pytest.raises(BadValueError) as ei:
        parse_time("now-2h", now=NOW, tz=UTC)
    assert "at character 6 ('h')" in str(ei.value)


def test_naive_clock_is_a_programming_error():
    with pytest.raises(ValueError):
        parse_time("now", now=NOW.replace(tzinfo=None))


def test_output_formats():
    assert format_time(u("2026-11-30T10:00:07"), UTC) == "2026-11-30T10:00:07"
    assert format_time(None, UTC) == ""
    assert format_elapsed(59.9) == "00:00:59"
    assert format_elapsed(3 * 86400 + 3723) == "3-01:02:03"
    assert format_elapsed(-5) == "00:00:00"
    assert format_elapsed(None) == ""
    assert iso_utc(u("2026-11-30T10:00:07")) == "2026-11-30T10:00:07Z"
    assert iso_utc(None) is None
