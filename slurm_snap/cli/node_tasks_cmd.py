"""`slurm-snap node-tasks`: one pass of this node's tasks and drill leftovers
(slurm_snap/nodetasks, restore/onnode.py), run by
etc/slurm-snap-node-tasks.timer: a unit of its own beside the node agent's
(slurm_snap/nodeagent), whose spool deliveries must not wait behind a
partner copy (nodeagent/agent.py says why)."""
from __future__ import annotations

import json
import os

import click

from .. import errors


@click.command("node-tasks")
@click.option("--json", "as_json", is_flag=True, help="Print the pass as JSON.")
@click.pass_obj
def command(ctx, as_json):
    """Do what the service has for this node ([node] name, else the host
    name), as root on its own disk: delete node-local parts and copies
    (prune), send or receive partner copies to or from another node's agent
    (MUNGE-authenticated, no SSH), and remove drill directories whose drill
    has ended. One pass, then exit: 0 when it ran, 9 when the service was away."""
    from ..nodetasks.agent import node_name, run_pass
    from ..restore.onnode import sweep_leftovers

    cfg = ctx.config
    if os.geteuid() != 0:
        raise errors.PermissionDenied(why="node tasks act on the node's own disk: run them as root")
    inventory = None if cfg.via_service else ctx.inventory
    report = run_pass(cfg, inventory)
    drills = [] if report.away else sweep_leftovers(cfg, inventory, node_name(cfg))
    doc = {"node": node_name(cfg), "done": report.done, "left": report.left, "away": report.away or None,
           "lines": report.lines, "errors": report.errors, "drills": drills}
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        click.echo(f"{doc['node']}: {report.done} task(s) done, {report.left} left"
                   + (f"; the service is away: {report.away}" if report.away else ""))
        for line in [*report.lines, *(f"failed: {e}" for e in report.errors), *drills]:
            click.echo(f"  {line}")
    if report.away:
        raise errors.ServiceUnavailable(why=report.away)
