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
    """Create the schema, or migrate it to the newest revision."""
    rev = ctx.inventory.upgrade()
    click.echo(f"inventory {db._redact(ctx.config.inventory.url)}: schema at revision {rev}")


@command.command("status")
@click.pass_obj
def status(ctx):
    """Print the schema revision in the database and the newest one known."""
    cur = db.current_revision(ctx.inventory.engine)
    head = db.head_revision()
    click.echo(f"current: {cur or '(empty)'}\nhead:    {head}")
    if cur != head:
        raise click.exceptions.Exit(3)
