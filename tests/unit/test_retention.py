"""Retention policy: exact kept/deleted ids for given inputs, with an injected clock."""
from __future__ import annotations

import datetime as dt

import pytest

from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.retention.policy import DELETE, KEEP, Policy, SetSummary, decide

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=UTC)  # a Monday, ISO week 49


def clock():
    return NOW


def t(day: int, hour: int, minute: int = 0, month: int = 11, year: int = 2026) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, tzinfo=UTC)


def s(id_, when, state=S.COMPLETE, consistency=S.APP, job=1):
    return SetSummary(id=id_, job_id=job, cut_at=when, state=state, consistency=consistency)


# One job's history: ids in cut order, with a verified set, a failed drill,
# one set in flight, one unusable, one left DELETING by an interrupted prune.
HISTORY = [
    s(1, t(16, 10)),                         # Mon W47
    s(2, t(20, 10), S.VERIFIED),             # Fri W47
    s(3, t(24, 9)),                          # Tue W48
    s(4, t(28, 8), S.FAILED_RESTORE),        # Sat W48
    s(5, t(29, 8), consistency=S.CRASH),     # Sun W48
    s(6, t(29, 20)),                         # Sun W48
    s(7, t(30, 6)),                          # Mon W49
    s(8, t(30, 11)),                         # Mon W49
    s(9, t(30, 11, 30), S.CUT),              # in flight
    s(10, t(30, 5), S.PARTIAL),              # nothing restorable
    s(11, t(25, 1), S.DELETING),             # interrupted prune
]


def split(decisions):
    keep = sorted(d.set_id for d in decisions if d.action == KEEP)
    delete = sorted(d.set_id for d in decisions if d.action == DELETE)
    return keep, delete


def reasons(decisions, set_id):
    return next(d.reasons for d in decisions if d.set_id == set_id)


def test_keep_last_keeps_newest_restorable_and_newest_verified():
    out = decide(HISTORY, Policy(keep_last=3), clock)
    assert split(out) == ([2, 6, 7, 8, 9], [1, 3, 4, 5, 10, 11])
    assert reasons(out, 8) == ("last 1 of 3",)
    assert reasons(out, 6) == ("last 3 of 3",)
    assert reasons(out, 2) == ("newest verified set",)
    assert reasons(out, 9) == ("in flight (CUT): never touched",)
    assert reasons(out, 10) == ("nothing restorable (state PARTIAL)",)
    assert reasons(out, 11) == ("interrupted prune: finishing the deletion",)
    assert reasons(out, 1) == ("matched no keep rule",)


def test_decisions_come_back_in_input_order():
    shuffled = list(reversed(HISTORY))
    out = decide(shuffled, Policy(keep_last=1), clock)
    assert [d.set_id for d in out] == [x.id for x in shuffled]


def test_keep_daily_keeps_newest_of_each_day_with_a_set():
    out = decide(HISTORY, Policy(keep_daily=3, keep_verified=False, force=True), clock)
    assert split(out) == ([4, 6, 8, 9], [1, 2, 3, 5, 7, 10, 11])
    assert reasons(out, 8) == ("daily 2026-11-30",)
    assert reasons(out, 6) == ("daily 2026-11-29",)
    assert reasons(out, 4) == ("daily 2026-11-28",)


def test_keep_weekly_keeps_newest_of_each_iso_week():
    out = decide(HISTORY, Policy(keep_weekly=3, keep_verified=False, force=True), clock)
    assert split(out) == ([2, 6, 8, 9], [1, 3, 4, 5, 7, 10, 11])
    assert reasons(out, 2) == ("weekly 2026-W47",)


def test_rules_combine_and_reasons_accumulate():
    out = decide(HISTORY, Policy(keep_last=2, keep_daily=3, keep_weekly=2), clock)
    assert split(out) == ([2, 4, 6, 7, 8, 9], [1, 3, 5, 10, 11])
    assert reasons(out, 8) == ("last 1 of 2", "daily 2026-11-30", "weekly 2026-W49")
    assert reasons(out, 6) == ("daily 2026-11-29", "weekly 2026-W48")


def test_keep_within_uses_the_injected_clock():
    out = decide(HISTORY, Policy(keep_within=dt.timedelta(days=1), keep_verified=False, force=True), clock)
    assert split(out) == ([6, 7, 8, 9], [1, 2, 3, 4, 5, 10, 11])
    assert reasons(out, 6) == ("within 1d",)
    later = decide(HISTORY, Policy(keep_within=dt.timedelta(days=1), keep_verified=False, force=True),
                   lambda: NOW + dt.timedelta(days=30))
    assert split(later) == ([9], [1, 2, 3, 4, 5, 6, 7, 8, 10, 11])


def test_only_verified_set_survives_no_keep_verified_unless_forced():
    out = decide(HISTORY, Policy(keep_last=1, keep_verified=False), clock)
    assert split(out) == ([2, 8, 9], [1, 3, 4, 5, 6, 7, 10, 11])
    assert "only verified set" in reasons(out, 2)[0] and "--force" in reasons(out, 2)[0]
    forced = decide(HISTORY, Policy(keep_last=1, keep_verified=False, force=True), clock)
    assert split(forced) == ([8, 9], [1, 2, 3, 4, 5, 6, 7, 10, 11])


def test_force_alone_still_keeps_the_newest_verified_when_asked():
    out = decide(HISTORY, Policy(keep_last=1, keep_verified=True, force=True), clock)
    assert split(out) == ([2, 8, 9], [1, 3, 4, 5, 6, 7, 10, 11])


def test_with_several_verified_the_newest_is_kept_when_none_would_be():
    sets = [s(1, t(1, 0), S.VERIFIED), s(2, t(2, 0), S.VERIFIED), s(3, t(3, 0)), s(4, t(4, 0))]
    out = decide(sets, Policy(keep_last=2, keep_verified=False), clock)
    assert split(out) == ([2, 3, 4], [1])
    assert "newest of the job's verified sets" in reasons(out, 2)[0]
    # A verified set kept by another rule is enough: no extra one is kept.
    out = decide(sets, Policy(keep_last=3, keep_verified=False), clock)
    assert split(out) == ([2, 3, 4], [1])
    assert reasons(out, 2) == ("last 3 of 3",)


def test_in_flight_sets_are_never_touched_even_forced():
    sets = [s(i, t(i, 0), st) for i, st in enumerate([S.PENDING, S.QUIESCING, S.CUTTING, S.CUT], start=1)]
    out = decide(sets, Policy(keep_last=0, keep_daily=0, keep_verified=False, force=True), clock)
    assert split(out) == ([1, 2, 3, 4], [])


def test_unrestorable_sets_are_deleted_whatever_the_rules():
    sets = [s(1, t(1, 0), S.FAILED), s(2, t(2, 0), S.ROLLED_BACK), s(3, t(3, 0), S.PARTIAL),
            s(4, t(4, 0), consistency=S.NONE), s(5, t(5, 0))]
    out = decide(sets, Policy(keep_last=10), clock)
    assert split(out) == ([5], [1, 2, 3, 4])
    assert reasons(out, 4) == ("nothing restorable (labelled none)",)


def test_deleted_sets_are_ignored():
    out = decide([s(1, t(1, 0), S.DELETED), s(2, t(2, 0))], Policy(keep_last=1), clock)
    assert [d.set_id for d in out] == [2]


def test_rules_apply_per_job():
    sets = [s(1, t(1, 0), job=1), s(2, t(2, 0), job=2), s(3, t(3, 0), job=1), s(4, t(4, 0), job=2),
            s(5, t(5, 0), job=1)]
    out = decide(sets, Policy(keep_last=1), clock)
    assert split(out) == ([4, 5], [1, 2, 3])
    assert {d.set_id: d.job_id for d in out} == {1: 1, 2: 2, 3: 1, 4: 2, 5: 1}


def test_same_cut_time_higher_id_is_newer():
    out = decide([s(1, t(1, 0)), s(2, t(1, 0)), s(3, t(1, 0))], Policy(keep_last=1), clock)
    assert split(out) == ([3], [1, 2])


def test_iso_week_spans_the_new_year():
    # 2026-12-31 (Thu) and 2027-01-02 (Sat) are both in ISO week 2026-W53.
    sets = [s(1, t(31, 0, month=12)), s(2, t(2, 0, month=1, year=2027)), s(3, t(4, 0, month=1, year=2027))]
    out = decide(sets, Policy(keep_weekly=2), clock)
    assert split(out) == ([2, 3], [1])
    assert reasons(out, 2) == ("weekly 2026-W53",)
    assert reasons(out, 3) == ("weekly 2027-W01",)


def test_days_are_utc_days():
    # 23:30 at UTC-5 is already the next day in UTC.
    est = dt.timezone(dt.timedelta(hours=-5))
    sets = [s(1, dt.datetime(2026, 11, 1, 23, 30, tzinfo=est)), s(2, t(2, 6))]
    out = decide(sets, Policy(keep_daily=2), clock)
    assert split(out) == ([2], [1])


def test_no_rule_keeps_only_in_flight_and_newest_verified():
    out = decide(HISTORY, Policy(), clock)
    assert split(out) == ([2, 9], [1, 3, 4, 5, 6, 7, 8, 10, 11])
    assert not Policy().has_rule and Policy(keep_daily=1).has_rule


def test_empty_input():
    assert decide([], Policy(keep_last=1), clock) == []


@pytest.mark.parametrize("kwargs", [{"keep_last": -1}, {"keep_daily": 1.5}, {"keep_weekly": True},
                                    {"keep_within": dt.timedelta(seconds=-1)}])
def test_bad_policy_values_are_refused(kwargs):
    with pytest.raises(errors.BadValueError):
        Policy(**kwargs)


def test_a_running_jobs_newest_verified_set_survives_every_rule():
    """Issue 17: whatever the rules, --no-keep-verified or --force say, the
    newest VERIFIED set of a job Slurm says runs is kept, and says why; when
    Slurm could not say, every job counts as running."""
    job = HISTORY[0].job_id
    forced = decide(HISTORY, Policy(keep_last=1, keep_verified=False, force=True), clock)
    live = decide(HISTORY, Policy(keep_last=1, keep_verified=False, force=True, live_jobs=frozenset({job})), clock)
    unknown = decide(HISTORY, Policy(keep_last=1, keep_verified=False, force=True, live_jobs=None), clock)
    assert split(forced) == ([8, 9], [1, 2, 3, 4, 5, 6, 7, 10, 11])
    assert split(live) == ([2, 8, 9], [1, 3, 4, 5, 6, 7, 10, 11])
    assert reasons(live, 2) == ("newest verified set of a running job: kept whatever the rules say",)
    assert split(unknown) == split(live)
    assert reasons(unknown, 2) == ("newest verified set: Slurm could not say whether the job runs",)
    other = decide(HISTORY, Policy(keep_last=1, keep_verified=False, force=True, live_jobs=frozenset({job + 1})),
                   clock)
    assert split(other) == split(forced)
