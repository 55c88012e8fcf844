"""The one duration parser (slurm_snap/slurm/duration.py): what users type
(prune --keep-within) and what scontrol prints (GraceTime, PrologEpilogTimeout)."""
from __future__ import annotations

import datetime as dt

import pytest

from slurm_snap import errors
from slurm_snap.slurm.duration import parse_duration, slurm_seconds


@pytest.mark.parametrize("text, expected", [("7d", dt.timedelta(days=7)), ("12h", dt.timedelta(hours=12)),
                                            ("1d12h", dt.timedelta(days=1, hours=12)),
                                            ("30m", dt.timedelta(minutes=30)), ("90s", dt.timedelta(seconds=90))])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "1w", "-1d", "1h1d"])
def test_parse_duration_refuses(text):
    with pytest.raises(errors.BadValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize("text, expected", [("30", 30), ("00:00:30", 30), ("05:00", 300), ("1-00:00:00", 86400),
                                            ("2-03:04:05", ((2 * 24 + 3) * 60 + 4) * 60 + 5), (" 60 ", 60)])
def test_slurm_seconds_reads_what_scontrol_prints(text, expected):
    assert slurm_seconds(text) == expected


@pytest.mark.parametrize("text", ["", None, "UNLIMITED", "infinite", "NONE", "soon", "1:2:3:4"])
def test_slurm_seconds_has_nothing_to_compare_for_no_limit_or_garbage(text):
    assert slurm_seconds(text) is None


def test_a_bare_number_is_seconds_only_where_scontrol_printed_it():
    # sbatch --time=30 means minutes: a user's bare number is ambiguous.
    assert parse_duration("30", bare_seconds=True) == dt.timedelta(seconds=30)
    with pytest.raises(errors.BadValueError, match="keep-within"):
        parse_duration("30", what="keep-within")
