"""`slurm-snap repair`: label abandoned snapshot sets and remove orphan snapshots."""
from __future__ import annotations

import json

import click

from .. import access, errors


@click.command("repair")
@click.option("--older-than", type=click.FloatRange(min=0), default=0.0, metavar="SECONDS",
              help="Only consider sets requested at least this long ago.")
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the actions as JSON.")
@click.pass_obj
def command(ctx, older_than, dry_run, as_json):
    """Find sets still in flight whose coordinator died or whose deadline
    passed; label them PARTIAL/FAILED/ROLLED_BACK (or finalize a fully
    recorded one) and delete snapshots cut for them but never recorded.
    Operators only."""
    from ..protocol.repair import repair

    caller = access.current_caller()
    if not access.is_operator(ctx.config, caller):
        raise errors.PermissionDenied(why=f"repair is for operators; {caller.name} is not one")
    actions = repair(ctx.config, ctx.inventory, older_than=older_than, dry_run=dry_run)
    if as_json:
        click.echo(json.dumps([a.as_dict() for a in actions], indent=2, sort_keys=True))
        return
    if not actions:
        click.echo("nothing to repair")
    for a in actions:
        verb = "would label" if dry_run else "labelled"
        click.echo(f"set {a.set_id} job {a.job_id}: {verb} {a.old_state} -> {a.new_state}: {a.reason}")
        for o in a.orphans:
            click.echo(f"  orphan {'(would delete)' if dry_run else 'deleted'}: {o}")
        for e in a.errors:
            click.echo(f"  error: {e}")
    if any(a.errors for a in actions):
        raise errors.BackendError(backend="repair", why="some orphans could not be listed or removed (see above)")
