"""`slurm-snap serve`: the inventory for nodes and login hosts (docs/design.md, "Hosts")."""
from __future__ import annotations

import click

from .. import errors


@click.command("serve")
@click.option("--listen", metavar="ADDR[:PORT]",
              help="Address to listen on, port 6830 when left out [default: service.listen].")
@click.option("--pidfile", metavar="FILE", help="Write the server's PID here (removed on exit).")
@click.pass_obj
def command(ctx, listen, pidfile):
    """Serve users' report/show/snapshot/restore-test and the hooks' recording
    to hosts without the inventory, authenticated with MUNGE (controller, root).
    Every [service] sweep_every seconds its sweeper finalizes sets left in
    flight [service] sweep_after seconds past their deadline and records
    drills left RUNNING, so no set waits for a person (repair stays for
    operators: it also removes orphan snapshots)."""
    import os
    import sys

    from ..protocol.recorder import OPS
    from ..service.server import serve
    from . import main

    cfg = ctx.config
    listen = listen or cfg.service.listen
    if not listen:
        raise errors.UsageError("serve needs --listen ADDR[:PORT] or [service] listen in the configuration")
    if cfg.via_service:
        raise errors.UsageError(f"{cfg.path} names the service itself as the inventory ({cfg.inventory.url}); "
                                "the controller's configuration names the database")
    if os.geteuid() != 0:
        raise errors.PermissionDenied(why="serve runs as root: it acts for the users MUNGE vouches for")
    # A bug in a user's command: the user sees one line, the service's log the traceback.
    serve(cfg, listen=listen, pidfile=pidfile, run_cli=lambda argv: main(argv, bug_log=sys.__stderr__.write),
          ops=OPS, sweep=sweep)


def sweep(cfg) -> list[str]:
    """The sweeper serve runs every [service] sweep_every seconds (in a
    forked child): sets left in flight sweep_after seconds past their
    deadline are labelled as repair would, without touching a snapshot
    (protocol.repair.sweep); drills whose process died, or whose Slurm job
    ended or ran past its deadline, are recorded and cleaned up as
    `restore-test --collect` does. Returns one line per thing done."""
    from ..inventory.repository import Inventory
    from ..protocol.repair import sweep as sweep_sets
    from ..restore.drill import Drill
    from ..restore.submit import SlurmSubmitter
    from .repair_cmd import describe

    inv = Inventory.from_config(cfg)
    try:
        lines = [line for a in sweep_sets(cfg, inv) for line in describe(a)]
        lines += Drill(cfg, inv, submitter=SlurmSubmitter(cfg)).sweeper.sweep()
        return lines
    finally:
        inv.dispose()
