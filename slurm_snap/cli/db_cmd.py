"""`slurm-snap db upgrade|status`: create or migrate the inventory schema."""
from __future__ import annotations

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
@click.pass_obj
def status(ctx):
    """Print the schema revision in the database and the newest one known.

    Exit 9 (not initialised) when the database is missing, empty or behind."""
    from ..errors import InventoryNotInitialised

    cur = ctx.inventory.revision()
    head = db.head_revision()
    click.echo(f"current: {cur or '(empty)'}\nhead:    {head}")
    if cur != head:
        raise InventoryNotInitialised(url=db._redact(ctx.config.inventory.url),
                                      why=f"its schema is at revision {cur or '(none)'}, this slurm-snap "
                                          f"needs {head}")
