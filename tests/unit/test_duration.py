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


@pytest.mark.parametrize("text, expected", [
    # Slurm's unit words (as in now+2hours), singular or plural, and weeks.
    ("7days", dt.timedelta(days=7)), ("1day", dt.timedelta(days=1)), ("2hours30minutes", dt.timedelta(hours=2.5)),
    ("90seconds", dt.timedelta(seconds=90)), ("1week", dt.timedelta(weeks=1)), ("2w", dt.timedelta(weeks=2)),
    ("30min", dt.timedelta(minutes=30)), ("1day12hours", dt.timedelta(days=1, hours=12)),
    # Slurm's time-limit forms: after a '-' come hours, as sbatch --time reads them.
    ("1-12", dt.timedelta(days=1, hours=12)), ("1-05:00", dt.timedelta(days=1, hours=5)),
    ("1-05:30:10", dt.timedelta(days=1, hours=5, minutes=30, seconds=10)), ("05:00", dt.timedelta(minutes=5)),
    ("01:00:00", dt.timedelta(hours=1))])
def test_parse_duration_reads_slurms_forms(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "-1d", "1h1d", "7x", "now-7days", "1.5h", "1d1d", "７d"])
def test_parse_duration_refuses_and_lists_the_forms(text):
    with pytest.raises(errors.BadValueError, match="duration") as exc:
        parse_duration(text)
    # Every refusal lists what is accepted.
    assert "7days" in str(exc.value) and "D-HH" in str(exc.value), str(exc.value)


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


# --- every option that takes a duration (issue 35 item 5) ---------------------------------------

def _all_options():
    import click

    from slurm_snap.cli import cli

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                yield from walk(cmd.get_command(ctx, name), path + [name])
        else:
            for p in cmd.params:
                if isinstance(p, click.Option):
                    yield path, cmd, p

    return list(walk(cli, []))


DURATION_OPTIONS = {("prune", "--keep-within"), ("metrics", "--job-window"), ("snapshot", "--deadline"),
                    ("restore-test", "--deadline"), ("restore-test", "--queue-timeout"), ("repair", "--older-than"),
                    ("node-agent", "--loop")}
SECONDS_OPTIONS = {("snapshot", "--deadline"), ("restore-test", "--deadline"), ("restore-test", "--queue-timeout"),
                   ("repair", "--older-than"), ("node-agent", "--loop")}


def test_every_duration_option_reads_the_one_grammar():
    """A guard for siblings: an option that takes a time span (its metavar,
    or a name that says so) must use the one parser."""
    from slurm_snap.cli.context import DurationType

    found = set()
    for path, _cmd, opt in _all_options():
        longest = max(opt.opts, key=len)
        spanish = (opt.metavar or "").upper() in ("DURATION", "SECONDS", "S") or any(
            w in longest for w in ("deadline", "older", "within", "window", "every", "timeout"))
        if (" ".join(path), longest) == ("hook validate-options", "--every"):
            # sbatch's --snapshot-every, handed over by the SPANK plugin: parsed
            # with the same parse_duration, so its refusal names sbatch's option.
            continue
        if spanish:
            assert isinstance(opt.type, DurationType), (path, longest)
            found.add((" ".join(path), longest))
    assert found == DURATION_OPTIONS


def _parse(path, option, value):
    from slurm_snap.cli import cli

    import click

    cmd, ctx = cli, click.Context(cli)
    for name in path.split():
        cmd = cmd.get_command(ctx, name)
    extra = {"snapshot": ["1"], "restore-test": ["1"]}.get(path, [])
    return cmd.make_context(path, [*extra, option, value]).params


@pytest.mark.parametrize("path, option", sorted(DURATION_OPTIONS))
@pytest.mark.parametrize("value, seconds", [("7days", 7 * 86400), ("7d", 7 * 86400), ("1-00:00:00", 86400),
                                            ("12h", 12 * 3600), ("2weeks", 14 * 86400)])
def test_each_duration_option_takes_slurms_forms(path, option, value, seconds):
    params = _parse(path, option, value)
    assert seconds in params.values(), params


@pytest.mark.parametrize("path, option", sorted(DURATION_OPTIONS))
def test_each_duration_option_refuses_with_the_forms_it_accepts(path, option):
    import click

    with pytest.raises(click.BadParameter) as exc:
        _parse(path, option, "7x")
    msg = exc.value.format_message()
    assert "'7x'" in msg and "7days" in msg and "D-HH" in msg, msg
    # Options that took seconds still do, and say so.
    assert ("number of seconds" in msg) == ((path, option) in SECONDS_OPTIONS), msg


@pytest.mark.parametrize("path, option", sorted(SECONDS_OPTIONS))
def test_seconds_options_still_take_a_number_of_seconds(path, option):
    assert 0.2 in _parse(path, option, "0.2").values()
    assert 120.0 in _parse(path, option, "120").values()


def test_snapshot_every_at_submit_lists_the_forms(write_config, tmp_path, capsys):
    from slurm_snap.cli import main

    cfg = write_config(f'[inventory]\nurl = "sqlite:///{tmp_path}/i.db"\n')
    assert main(["--config", cfg, "hook", "validate-options", "--every", "7x"]) == errors.USAGE
    err = capsys.readouterr().err
    assert "--snapshot-every" in err and "'7x'" in err and "7days" in err and "D-HH" in err, err


@pytest.mark.parametrize("path, option", [("prune", "--keep-within"), ("metrics", "--job-window")])
def test_a_bare_number_is_refused_where_it_never_meant_seconds(path, option):
    import click

    with pytest.raises(click.BadParameter, match="ambiguous"):
        _parse(path, option, "30")
