"""`slurm-snap show JOB|set:ID`: one snapshot set in full, with a timeline."""
from __future__ import annotations

import json

import click

from .. import access
from ..errors import BadValueError, NotFound, UsageError
from ..report.selection import refuse_array_or_het
from ..slurm.jobenv import MAX_ID
from .report_cmd import caller_and_clock


def parse_target(target: str | None, set_id: int | None) -> tuple[str, int, int | None]:
    """-> ("set", id, None) or ("job", job_id, restart_count or None)."""
    if (target is None) == (set_id is None):
        raise UsageError("show needs exactly one of JOB, JOB.RESTART, set:ID or --set ID")
    if set_id is not None:
        return "set", set_id, None
    text = target.strip()
    if text.lower().startswith("set:"):
        num = text[4:]
        if not (num.isascii() and num.isdigit()) or int(num) > 2**63 - 1:
            raise BadValueError(what="set", value=target, why="expected set:ID with a numeric ID")
        return "set", int(num), None
    head, dot, tail = text.partition(".")
    refuse_array_or_het(target, head, what="job")
    if not (text.isascii() and head.isdigit()) or (dot and not tail.isdigit()) \
            or int(head) > MAX_ID or (dot and int(tail) > MAX_ID):
        raise BadValueError(what="job", value=target, why="expected JOBID, JOBID.RESTART or set:ID")
    return "job", int(head), int(tail) if dot else None


@click.command("show")
@click.argument("target", required=False, metavar="JOB|JOB.RESTART|set:ID")
@click.option("--set", "set_id", type=click.IntRange(min=1, max=2**63 - 1), metavar="ID", help="The set with this id.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable (docs/report.md, show schema).")
@click.pass_obj
def command(ctx, target, set_id, as_json):
    """Show one snapshot set: phases, barriers, volumes, drills, events, timeline.

    JOB means the job's newest set (any state); JOB.RESTART the newest of that run.
    A run without a set (its volumes refused by a Prolog, or nothing cut yet) is
    shown as the run: declared volumes, each refusal, the job's events.
    """
    from ..inventory import refusals
    from ..report.show import job_doc, render, render_job, show_doc

    kind, ident, restart = parse_target(target, set_id)
    caller, _now, tz = caller_and_clock(ctx)
    with ctx.inventory.session(readonly=True) as repo:
        if kind == "job":
            # Whose job it is comes first: whether it has a set is the owner's business.
            access.require_jobs(ctx.config, caller, repo.report_job_owners([ident]))
            newest = repo.report_newest_set(ident, restart)
            if newest is None:
                run = repo.find_job_run(ident, restart)
                if run is None:
                    label = ident if restart is None else f"{ident}.{restart}"
                    raise NotFound(what="snapshot set of job", value=str(label))
                # A recorded run without a set (the Prolog refused its volumes,
                # or nothing has been cut yet): say what is known of it.
                volumes = repo.volumes(run)
                refused = refusals.of_runs(repo, [run.id]).get(run.id, [])
                events = repo.events(job_id=run.job_id)
                lines = None if as_json else render_job(run, volumes, refused, events, tz=tz)
                doc = job_doc(run, volumes, refused, events) if as_json else None
                click.echo(json.dumps(doc, indent=2) if as_json else "\n".join(lines))
                return
            ident = newest.id
        st = repo.report_set_detail(ident)
        access.require_owner_or_operator(ctx.config, caller, owner_uid=st.job_run.uid,
                                         owner_name=st.user_name, what=f"job {st.job_run.label}")
        events = repo.report_events(st.id, st.job_id)
        refused = refusals.of_runs(repo, [st.job_run_id]).get(st.job_run_id, [])
        copies = repo.copies(st.id)
        lines = None if as_json else render(st, events, tz=tz, refused=refused, copies=copies)
        doc = show_doc(st, events, refused=refused, copies=copies) if as_json else None
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo("\n".join(lines))
