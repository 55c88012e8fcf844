"""parse_time against the installed libslurm's own slurm_parse_time.

sacct hands -S/-E to slurm_parse_time(optarg, 1); report must read every
value the same way. libslurm reads the process's TZ and time(NULL), so it runs
in a subprocess with TZ set, and reports the second it read the clock at: the
Python side is then given exactly that second and the same zone, and every
answer must be equal to the second, "now"-relative forms included.
"""
from __future__ import annotations

import ctypes.util
import datetime as dt
import json
import subprocess
import sys
from zoneinfo import ZoneInfo

import pytest

from realcomponents import require
from slurm_snap.errors import BadValueError
from slurm_snap.slurm.slurmtime import parse_time

UTC = dt.timezone.utc

# Each form as one argv element would carry it (the shell passes
# "2026-11-30 10:00" as one). Grouped by what they probe.
FORMS = [
    # now and its offsets (22.05 knows only the full unit names)
    "now", "NOW", "now+1", "now-90", "now-0", "now+1day", "now+1days", "now-2weeks", "now-3hours",
    "now-30minutes", "now-45seconds", "now+1 day", "now + 1 day", "now+1DAY", "now- 1 2 minutes",
    "now-90min", "now-2h", "now-1d", "now-5m", "now-10s", "now-1fortnight", "now-", "now+", "nowish",
    "now-1day-1hour", "now-1days ago", "now+1minutes5", " now+1 day",
    # named days and hours, and their combinations
    "today", "tomorrow", "midnight", "noon", "elevenses", "fika", "teatime", "TODAY", "Today", "tOdAy",
    "Teatime", "NOON", "yesterday", "today noon", "noon tomorrow", "tomorrow-10:00", "todayx",
    # ISO dates
    "2026-11-30", "2026-11-30T10:00", "2026-11-30T10:00:07", "2026-11-30 10:00", "2026-11-30-10:00",
    "2026-11-30t10:00", "2026-11-3", "2026-1-30", "2026-02-30", "2026-11-31", "2026-13-01", "2026-00-10",
    "2026-11-32", "2026-11-30T24:00", "2026-11-30T10:60", "2028-02-29", "2027-02-29", "9999-12-31",
    "1970-01-01", "1970-01-01T01:00", "1969-12-31T23:59:59", "1900-01-01", "2026-03-29T02:30",
    "2026-11-30T10:00pm", "2026/11/30",
    # month/day forms
    "11/30", "11/30/26", "11/30/2026", "11/30/00", "11.30.26", "11.30", "11/30.26", "113026", "1130",
    "11301", "1130262", "1/5", "01/05", "11/30/", "11/30-10:00", "11/30 10:00", "11/30T10:00",
    "11/30/26-10:00:30", "13/40", "02/30", "12/31", "01/01", "12/25", "00/10", "11/00", "11/31",
    "11/29-noon", "11/29-",
    # times of day
    "10:00", "10:00:30", "9:15", "23:59", "00:00", "0:00", "24:00", "10:60", "10:00:60", "10am", "10:00PM",
    "10:00pm", "10:00 pm", "12:00AM", "12:00pm", "12:30am", "0:30pm", "13:00pm", "13:00am", "11:59:59PM",
    "10:00-11:00", "10:0", "1:5", "100:00",
    # seconds since the epoch (libslurm's uts prefix)
    "uts1800000000", "UTS1800000000", "uts 1800000000", "uts+1800000000", "uts999999", "uts",
    "uts1800000000x",
    # empty, blank, garbage, big numbers
    "", " ", "-", "T", "---", "garbage", "5", "123456789", "99/99/99", "now+3000000000", "now-2000000000",
    "uts99999999999999999999", "2026-11-30\ngarbage", "11/30\n",
]

# libslurm accepts these, but its answer is outside the years 1-9999 that a
# Python datetime holds: parse_time refuses them (documented in docs/report.md).
BEYOND_DATETIME = ["0000-01-01", "now+1000000000000", "uts300000000000"]

_PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1], use_errno=True)
parse = lib.slurm_parse_time
parse.argtypes = [ctypes.c_char_p, ctypes.c_int]
parse.restype = ctypes.c_int64
libc = ctypes.CDLL(None)
libc.time.argtypes = [ctypes.c_void_p]
libc.time.restype = ctypes.c_int64
out = []
for form in json.load(sys.stdin):
    for past in (1, 0):
        # Retry until the clock did not tick during the call, so the caller
        # knows the exact second libslurm's time(NULL) returned.
        while True:
            before = libc.time(None)
            ctypes.set_errno(0)
            got = parse(form.encode(), past)
            err = ctypes.get_errno()
            if libc.time(None) == before:
                break
        out.append({"form": form, "past": past, "now": before, "got": got, "errno": err})
json.dump(out, sys.stdout)
"""


def _libslurm() -> str:
    name = ctypes.util.find_library("slurm")
    require(name is not None, "libslurm is not installed (apt-get install libslurm38 / libslurm-dev)")
    return name


def _ask_libslurm(zone: str, forms: list[str]) -> list[dict]:
    r = subprocess.run([sys.executable, "-c", _PROBE, _libslurm()], input=json.dumps(forms),
                       capture_output=True, text=True, timeout=120, env={"TZ": zone, "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _ours(form: str, now: int, zone: str, past: int):
    try:
        t = parse_time(form, now=dt.datetime.fromtimestamp(now, UTC), tz=ZoneInfo(zone), past=bool(past),
                       what="start time (-S)")
    except BadValueError as exc:
        return exc
    return int(t.timestamp())


def test_the_table_is_large_enough_and_has_no_duplicates():
    assert len(FORMS) >= 60
    assert len(set(FORMS)) == len(FORMS)


# Berlin has winter now; Auckland has summer time in December and a 13 h offset.
@pytest.mark.parametrize("zone", ["Europe/Berlin", "Pacific/Auckland", "UTC"])
def test_every_form_parses_as_libslurm_parses_it(zone):
    differ = {}
    refused = 0
    for a in _ask_libslurm(zone, FORMS):
        ours = _ours(a["form"], a["now"], zone, a["past"])
        # libslurm says "no time" with 0 (with or without errno): a value
        # that names no time is refused rather than silently meaning "unset".
        if a["got"] == 0:
            refused += 1
            if not (isinstance(ours, BadValueError) and repr(a["form"]) in str(ours)
                    and "start time (-S)" in str(ours)):
                differ[(a["form"], a["past"])] = ("libslurm refuses", ours)
        elif ours != a["got"]:
            differ[(a["form"], a["past"])] = (a["got"], ours)
    assert differ == {}
    # the table exercises both sides of the rule
    assert 40 < refused < 2 * len(FORMS) - 80


def test_forms_beyond_a_datetime_are_refused_by_name():
    for a in _ask_libslurm("UTC", BEYOND_DATETIME):
        assert a["got"] not in (0, -1), a  # libslurm does give a time here ...
        with pytest.raises(BadValueError) as ei:  # ... one that cannot be represented
            parse_time(a["form"], now=dt.datetime.fromtimestamp(a["now"], UTC), tz=UTC, past=bool(a["past"]))
        assert repr(a["form"]) in str(ei.value) and "1-9999" in str(ei.value)


def test_the_repeated_hour_when_clocks_go_back_is_its_first_occurrence():
    # libslurm's answer comes from glibc's mktime, which picks one of the two
    # instants from state left by earlier calls; parse_time always takes the
    # first (summer time), so the same value always means the same instant.
    first, second = 1792888200, 1792891800  # 00:30 and 01:30 UTC
    for a in _ask_libslurm("Europe/Berlin", ["2026-10-25T02:30"]):
        assert a["got"] in (first, second)
    got = parse_time("2026-10-25T02:30", now=dt.datetime(2026, 11, 30, tzinfo=UTC), tz=ZoneInfo("Europe/Berlin"))
    assert int(got.timestamp()) == first


@pytest.mark.parametrize("form", [
    "now+99999999999999999999",  # overflows C's long: libslurm returns a wrapped, meaningless time
    "today now",                 # 'now' not first: libslurm reads past the end of the string
    "noon now+1day",
])
def test_forms_libslurm_reads_with_undefined_behaviour_are_refused(form):
    with pytest.raises(BadValueError) as ei:
        parse_time(form, now=dt.datetime(2026, 11, 30, tzinfo=UTC), tz=UTC)
    assert repr(form) in str(ei.value)
