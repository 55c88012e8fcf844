"""`slurm-snap report`: snapshot sets in the style of sacct (docs/report.md)."""
from __future__ import annotations

import datetime as dt
import json

import click

from .. import access
from ..errors import UsageError
from ..clock import utcnow


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
              help="Only these jobs (all time unless -S); repeatable, as in sacct.")
@click.option("-u", "--user", "users", multiple=True, metavar="USER|UID[,...]",
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
@click.option("-o", "--format", "fmt", metavar="COL[%W],...", help="Columns, as sacct -o; see --helpformat.")
@click.option("-e", "--helpformat", is_flag=True, help="List the columns and exit.")
@click.option("-p", "--parsable", is_flag=True, help="'|' after every field (sacct -p).")
@click.option("-P", "--parsable2", is_flag=True, help="'|' between fields, none at the end (sacct -P).")
@click.option("--delimiter", default="|", metavar="CHARS", help="Field separator of -p/-P instead of '|'.")
@click.option("-n", "--noheader", is_flag=True, help="No header lines.")
@click.option("--json", "as_json", is_flag=True, help="The versioned JSON document (docs/report.md).")
@click.option("--snapshots", is_flag=True, help="One line per snapshot (volume part) instead of per set.")
@click.option("--rpo-by-user", "by_user", is_flag=True, help="One line per user: jobs, verified jobs, best/worst RPO.")
@click.pass_obj
def command(ctx, jobs, users, partitions, all_users, start, end, states, allocations, fmt, helpformat, parsable,
            parsable2, delimiter, noheader, as_json, snapshots, by_user):
    """Snapshot sets of jobs, like sacct: which jobs have a restorable point, and how old it is.

    TIME is Slurm's: now[-N{seconds|minutes|hours|days|weeks}], today, midnight,
    noon, YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY][-HH:MM[:SS]], HH:MM[:SS].
    """
    from ..report import byuser, columns, table
    from ..report.jsonout import VERSION, report_doc
    from ..report.load import load_rows
    from ..report.rows import Env
    from ..report.selection import Selection, build_filter
    from ..report.slurmtime import iso_utc

    if not delimiter:
        raise UsageError("--delimiter needs at least one character")
    registry = byuser.USER_COLUMNS if by_user else columns.COLUMNS
    if helpformat:
        click.echo(columns.helpformat(registry))
        return
    default = (byuser.DEFAULT_USER_FORMAT if by_user
               else columns.DEFAULT_SNAPSHOT_FORMAT if snapshots else columns.DEFAULT_FORMAT)
    fields = columns.parse_format(fmt or default, registry)
    caller, now, tz = caller_and_clock(ctx)
    env = Env(now=now, tz=tz)
    # Repeated options accumulate, as sacct's do (`-j 1 -j 2` is `-j 1,2`).
    sel = Selection(jobs=_joined(jobs), users=_joined(users), start=start, end=end, states=_joined(states),
                    all_users=all_users, partitions=_joined(partitions))
    with ctx.inventory.session(readonly=True) as repo:
        f = build_filter(sel, cfg=ctx.config, caller=caller, repo=repo, now=now, tz=tz)
        need_snaps = as_json or snapshots or any(fd.column.needs_snaps for fd in fields)
        rows = load_rows(repo, f, need_snaps=need_snaps and not by_user)

    if by_user:
        summary = byuser.summarize(rows, now)
        if as_json:
            click.echo(json.dumps({"version": VERSION, "generated_at": iso_utc(now),
                                   "users": [u.doc() for u in summary]}, indent=2))
            return
        values = ([fd.column.get(u, None, env) for fd in fields] for u in summary)
    elif as_json:
        click.echo(json.dumps(report_doc(rows, now=now, f=f), indent=2))
        return
    elif snapshots:
        values = ([fd.column.get(r, s, env) for fd in fields] for r in rows for s in r.snaps)
    else:
        values = ([fd.column.get(r, None, env) for fd in fields] for r in rows)
    layout = table.PARSABLE2 if parsable2 else table.PARSABLE if parsable else table.FIXED
    emit(table.render(fields, values, layout=layout, header=not noheader, delimiter=delimiter))


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
