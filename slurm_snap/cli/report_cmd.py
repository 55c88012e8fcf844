"""`slurm-snap report`: snapshot sets in the style of sacct (docs/report.md)."""
from __future__ import annotations

import datetime as dt
import json

import click

from .. import access
from ..errors import BadValueError, UsageError
from ..clock import utcnow


# The default -o of per-set lines, as SACCT_FORMAT is sacct's (whose column
# names are sacct's, so it is not read).
FORMAT_ENV = "SLURM_SNAP_REPORT_FORMAT"


def caller_and_clock(ctx) -> tuple[access.Caller, dt.datetime, dt.tzinfo | None]:
    """Who asks, what time it is, which zone times print in.

    Tests put `caller`, `now` and `tz` on the context object; they are never
    read from the environment, since that would let anyone claim to be root.
    """
    caller = getattr(ctx, "caller", None) or access.current_caller()
    now = getattr(ctx, "now", None) or utcnow()
    return caller, now, getattr(ctx, "tz", None)


@click.command("report")
@click.option("-j", "--jobs", multiple=True, metavar="JOB[,JOB.RESTART...]",
              help="Only these jobs (all time unless -S); repeatable, as in sacct. A SLUID (Slurm 25.11+) "
                   "selects the run it names, as JOB.RESTART does.")
@click.option("-u", "--user", "--uid", "users", multiple=True, metavar="USER|UID[,...]",
              help="Only these users, by name or UID (operators only for others); repeatable.")
@click.option("-r", "--partition", "partitions", multiple=True, metavar="PART[,PART...]",
              help="Only runs in these partitions; repeatable.")
@click.option("-a", "--allusers", "all_users", is_flag=True, help="Every user's jobs (operators).")
@click.option("-S", "--starttime", "start", metavar="TIME",
              help="Sets requested at or after TIME [default: midnight today, unless -j].")
@click.option("-E", "--endtime", "end", metavar="TIME", help="Sets requested at or before TIME [default: no bound].")
@click.option("-s", "--state", "states", multiple=True, metavar="STATE[,STATE...]",
              help="Only sets in these states; UNPROTECTED: runs without a set whose declared volumes a "
                   "node's Prolog refused (listed by default too); repeatable.")
@click.option("-X", "--allocations", is_flag=True,
              help="Accepted for sacct's habit: every line is already a job allocation's (slurm-snap has no "
                   "step lines).")
@click.option("-o", "--format", "fmt", metavar="COL[%W],...",
              help=f"Columns, as sacct -o; see --helpformat [default: ${FORMAT_ENV}, else the built-in list].")
@click.option("-l", "--long", "long_", is_flag=True,
              help="The long column list (docs/report.md); not with -o, as in sacct.")
@click.option("-e", "--helpformat", is_flag=True, help="List the columns and exit (needs no configuration).")
@click.option("-p", "--parsable", is_flag=True, help="'|' after every field (sacct -p).")
@click.option("-P", "--parsable2", is_flag=True, help="'|' between fields, none at the end (sacct -P).")
@click.option("--delimiter", default="|", metavar="CHARS", help="Field separator of -p/-P instead of '|'.")
@click.option("-n", "--noheader", is_flag=True, help="No header lines.")
@click.option("-v", "--verbose", is_flag=True, help="Print the filter used (users, jobs, window) to stderr.")
@click.option("--json", "as_json", is_flag=True, help="The versioned JSON document (docs/report.md).")
@click.option("--snapshots", is_flag=True, help="One line per snapshot (volume part) instead of per set.")
@click.option("--rpo-by-user", "by_user", is_flag=True, help="One line per user: jobs, verified jobs, best/worst RPO.")
@click.option("--rpo-missed", is_flag=True,
              help="Only sets of periodic jobs whose verified RPO is past their objective (RPOMet no).")
@click.pass_obj
def command(ctx, jobs, users, partitions, all_users, start, end, states, allocations, fmt, long_, helpformat,
            parsable, parsable2, delimiter, noheader, verbose, as_json, snapshots, by_user, rpo_missed):
    """Snapshot sets of jobs, like sacct: which jobs have a restorable point, and how old it is.

    JOB.RESTART is one requeued run of a job (`show` takes the same form),
    where sacct's JOB.STEP is a step: slurm-snap has no steps. Array tasks
    (1234_5) and het components (1234+0) are recorded under their own job
    id: pass that id.

    TIME is Slurm's, read as libslurm 22.05 reads it:
    now[{+|-}N[seconds|minutes|hours|days|weeks]] (full unit names), today,
    tomorrow, midnight, noon, fika, teatime, YYYY-MM-DD[THH:MM[:SS]],
    MM/DD[/YY][-HH:MM[:SS]], MMDD[YY], HH:MM[:SS][AM|PM], uts<epoch>; local
    time. Times print in local time, --json in UTC.
    """
    from ..report import byuser, columns, table
    from ..report.jsonout import VERSION, envelope, report_doc
    from ..report.load import load_rows
    from ..report.rows import Env
    from ..report.selection import Selection, build_filter
    from ..slurm.slurmtime import iso_utc

    if not delimiter:
        raise UsageError("--delimiter needs at least one character")
    registry = byuser.USER_COLUMNS if by_user else columns.COLUMNS
    if helpformat:
        click.echo(columns.helpformat(registry))
        return
    fields = _fields(fmt, long_, by_user, snapshots)
    caller, now, tz = caller_and_clock(ctx)
    env = Env(now=now, tz=tz)
    # Repeated options accumulate, as sacct's do (`-j 1 -j 2` is `-j 1,2`).
    sel = Selection(jobs=_joined(jobs), users=_joined(users), start=start, end=end, states=_joined(states),
                    all_users=all_users, partitions=_joined(partitions))
    with ctx.inventory.session(readonly=True) as repo:
        f = build_filter(sel, cfg=ctx.config, caller=caller, repo=repo, now=now, tz=tz)
        if verbose:
            click.echo(describe_filter(f, tz), err=True)
        need_snaps = as_json or snapshots or any(fd.column.needs_snaps for fd in fields)
        need_drills = (as_json or any(fd.column.needs_drills for fd in fields)) and not by_user
        rows = load_rows(repo, f, need_snaps=need_snaps and not by_user,
                         keys=None if as_json or by_user else _keys(fields, rpo_missed),
                         need_drills=need_drills)
    if rpo_missed:
        # After the load: the objective and the RPO base are per job, known once rows are.
        rows = [r for r in rows if r.rpo_missed(now)]

    getters = [fd.column.get for fd in fields]   # looked up once, not per line
    if by_user:
        summary = byuser.summarize(rows, now)
        if as_json:
            click.echo(json.dumps({**envelope("report"), "version": VERSION, "generated_at": iso_utc(now),
                                   "users": [u.doc() for u in summary]}, indent=2))
            return
        values = ([get(u, None, env) for get in getters] for u in summary)
    elif as_json:
        click.echo(json.dumps(report_doc(rows, now=now, f=f), indent=2))
        return
    elif snapshots:
        values = ([get(r, s, env) for get in getters] for r in rows for s in r.snaps)
    else:
        values = ([get(r, None, env) for get in getters] for r in rows)
    layout = table.PARSABLE2 if parsable2 else table.PARSABLE if parsable else table.FIXED
    emit(table.render(fields, values, layout=layout, header=not noheader, delimiter=delimiter))


def _fields(fmt: str | None, long_: bool, by_user: bool, snapshots: bool):
    """Columns: -o, else -l, else $SLURM_SNAP_REPORT_FORMAT (per-set lines
    only; it plays SACCT_FORMAT's part, whose names are sacct's and not read),
    else the built-in default."""
    import os

    from ..report import byuser, columns

    if fmt is not None and long_:
        raise UsageError("-o/--format and -l/--long exclude each other (as in sacct): give one")
    if by_user:
        if long_:
            raise UsageError("--rpo-by-user has no long format: its default already lists every column")
        return columns.parse_format(fmt or byuser.DEFAULT_USER_FORMAT, byuser.USER_COLUMNS)
    if fmt is not None:
        return columns.parse_format(fmt)
    if long_:
        return columns.parse_format(columns.LONG_SNAPSHOT_FORMAT if snapshots else columns.LONG_FORMAT)
    if snapshots:
        return columns.parse_format(columns.DEFAULT_SNAPSHOT_FORMAT)
    env = os.environ.get(FORMAT_ENV)
    if env is None:
        return columns.parse_format(columns.DEFAULT_FORMAT)
    try:
        return columns.parse_format(env)
    except BadValueError as exc:
        raise BadValueError(what=f"${FORMAT_ENV} ({exc.kwargs.get('what', 'format')})",
                            value=exc.kwargs.get("value", env), why=exc.kwargs.get("why", str(exc))) from None


def _keys(fields, rpo_missed: bool) -> frozenset[str] | None:
    """The set columns the chosen fields print (None: some field does not say)."""
    keys = {"snapshot_every"} if rpo_missed else set()
    for fd in fields:
        if fd.column.keys is None:
            return None
        keys.update(fd.column.keys)
    return frozenset(keys)


def describe_filter(f, tz) -> str:
    """-v: the selection as report applied it, times in the zone it prints in."""
    from ..report.jsonout import job_labels
    from ..slurm.slurmtime import format_time

    def listed(items) -> str:
        return ",".join(str(i) for i in items) or "any"

    return (f"report: jobs {listed(job_labels(f))}; users {listed(f.users)}; states {listed(f.states)}; "
            f"partitions {listed(f.partitions)}; requested from {format_time(f.start, tz) or 'any time'} "
            f"to {format_time(f.end, tz) or 'now'}")


def _joined(values: tuple[str, ...]) -> str | None:
    return ",".join(values) if values else None


def emit(lines, batch: int = 2000) -> None:
    """Write lines in batches: click.echo flushes on every call, which costs more
    than formatting when a window holds many thousand sets."""
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= batch:
            click.echo("\n".join(chunk))
            chunk = []
    if chunk:
        click.echo("\n".join(chunk))
