"""`slurm-snap db upgrade|status`: create or migrate the inventory schema."""
from __future__ import annotations

import json

import click

from ..inventory import db


@click.group("db")
def command():
    """Manage the inventory database."""


@command.command("upgrade")
@click.pass_obj
def upgrade(ctx):
    """Create the schema, or migrate it to the newest revision.

    The only command that creates or migrates the inventory: every other
    command and hook reports a missing or older one as "not initialised" (exit 9)."""
    rev = ctx.inventory.upgrade()
    click.echo(f"inventory {db._redact(ctx.config.inventory.url)}: schema at revision {rev}")


@command.command("status")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"version": 1, "url", "current", "head", "ok"} (current null when there is no schema).')
@click.pass_obj
def status(ctx, as_json):
    """Print the schema revision in the database and the newest one known.

    Exit 9 (not initialised) when the database is missing, empty or behind;
    with --json the document is printed first, then the same exit."""
    from ..errors import InventoryNotInitialised

    url = db._redact(ctx.config.inventory.url)
    head = db.head_revision()
    try:
        cur, missing = ctx.inventory.revision(), None
    except InventoryNotInitialised as exc:
        if not as_json:
            raise
        cur, missing = None, exc
    if as_json:
        click.echo(json.dumps({"version": 1, "url": url, "current": cur, "head": head, "ok": cur == head},
                              indent=2))
    else:
        click.echo(f"current: {cur or '(empty)'}\nhead:    {head}")
    if missing is not None:
        raise missing
    if cur != head:
        raise InventoryNotInitialised(url=url, why=f"its schema is at revision {cur or '(none)'}, this slurm-snap "
                                                   f"needs {head}")
