"""`slurm-snap repair`: label abandoned snapshot sets and remove orphan snapshots."""
from __future__ import annotations

import json

import click

from .. import access, errors
from .context import DurationType


@click.command("repair")
@click.option("--older-than", type=DurationType(bare_seconds=True), default=0.0, metavar="DURATION",
              help="Only consider sets requested at least this long ago: seconds (600) or a duration (10min, 1h).")
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the actions as JSON.")
@click.option("--node-check/--no-node-check", default=True, show_default=True,
              help="Also make PARTIAL every restorable set whose only copy of a node-local part was on a lost "
                   "node (Slurm DOWN/DRAIN/FAIL with a [repair] lost_reason) or is gone from its node's disk.")
@click.pass_obj
def command(ctx, older_than, dry_run, as_json, node_check):
    """Find sets still in flight whose coordinator died or whose deadline
    passed; label them PARTIAL/FAILED/ROLLED_BACK (or finalize a fully
    recorded one) and delete snapshots cut for them but never recorded.
    Then find sets that lost a node-local part with its node and make them
    PARTIAL (their RPO no longer counts). Operators only."""
    from ..protocol.repair import repair

    caller = access.current_caller()
    if not access.is_operator(ctx.config, caller):
        raise errors.PermissionDenied(why=f"repair is for operators; {caller.name} is not one")
    actions = repair(ctx.config, ctx.inventory, older_than=older_than, dry_run=dry_run, node_check=node_check)
    if as_json:
        click.echo(json.dumps([a.as_dict() for a in actions], indent=2, sort_keys=True))
        return
    if not actions:
        click.echo("nothing to repair")
    for a in actions:
        click.echo("\n".join(describe(a)))
    if any(a.errors for a in actions):
        raise errors.BackendError(backend="repair", why="some orphans or parts could not be listed, checked or "
                                  "removed (see above)")


def describe(a) -> list[str]:
    """What repair did to one set, in words that match the state it left."""
    if not a.set_id:
        return ["node check incomplete:"] + [f"  error: {e}" for e in a.errors]
    if not a.acted:
        return [f"set {a.set_id} job {a.job_id}: left alone: it was {a.old_state} when repair looked, and "
                f"another process ended it meanwhile (now {a.new_state}"
                + (f": {a.reason})" if a.reason else ")")]
    verb = "would label" if a.dry_run else "labelled"
    out = [f"set {a.set_id} job {a.job_id}: {verb} {a.old_state} -> {a.new_state}: {a.reason}"]
    out += [f"  orphan {'(would delete)' if a.dry_run else 'deleted'}: {o}" for o in a.orphans]
    out += [f"  cut, not yet delivered (left for its node's spool): {u}" for u in a.undelivered]
    out += [f"  error: {e}" for e in a.errors]
    return out
