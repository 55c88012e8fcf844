"""`slurm-snap serve`: the inventory for nodes and login hosts (docs/design.md, "Hosts")."""
from __future__ import annotations

import click

from .. import errors


@click.command("serve")
@click.option("--listen", metavar="ADDR:PORT", help="Address to listen on [default: service.listen].")
@click.option("--pidfile", metavar="FILE", help="Write the server's PID here (removed on exit).")
@click.pass_obj
def command(ctx, listen, pidfile):
    """Serve users' report/show/snapshot/restore-test and the hooks' recording
    to hosts without the inventory, authenticated with MUNGE (controller, root)."""
    import os

    from ..protocol.recorder import OPS
    from ..nodetasks.ops import OPS as TASK_OPS
    from ..restore.nodeops import OPS as DRILL_OPS
    from ..service.server import serve
    from . import main

    cfg = ctx.config
    listen = listen or cfg.service.listen
    if not listen:
        raise errors.UsageError("serve needs --listen ADDR:PORT or [service] listen in the configuration")
    if cfg.via_service:
        raise errors.UsageError(f"{cfg.path} names the service itself as the inventory ({cfg.inventory.url}); "
                                "the controller's configuration names the database")
    if os.geteuid() != 0:
        raise errors.PermissionDenied(why="serve runs as root: it acts for the users MUNGE vouches for")
    serve(cfg, listen=listen, pidfile=pidfile, run_cli=main, ops={**OPS, **DRILL_OPS, **TASK_OPS})
