"""`slurm-snap config check`: validate the file and print the effective configuration;
`slurm-snap config get KEY`: one effective value, for install scripts;
`slurm-snap config cli-filter TEMPLATE`: cli_filter.lua with the configured signal;
`slurm-snap config man [PAGE]`: slurm-snap(1) from the CLI's own definitions, or
slurm-snap.toml(5) from the configuration schema."""
from __future__ import annotations

import json

import click

from .. import config as config_mod
from .. import errors


@click.group("config")
def command():
    """Inspect the configuration."""


@command.command("check")
@click.option("--config", "path", metavar="PATH", help="File to check (overrides the global --config).")
@click.option("--json", "as_json", is_flag=True, help="Print the effective configuration as JSON.")
@click.option("--tools/--no-tools", default=False,
              help="Also build the volume classes' backends, which checks that their tools exist (here, or over "
                   "SSH on a shared class's host); node-local classes over SSH are left to `doctor` on each node.")
@click.pass_obj
def check(ctx, path, as_json, tools):
    """Validate the configuration; print the effective values."""
    cfg = config_mod.load(path or ctx.config_path)
    from ..backends.registry import default_registry

    default_registry().load_plugins()  # a plugin clashing with a built-in name is an error here
    for vc in cfg.volume_classes:
        # Options are checked without running anything; tools only with --tools.
        try:
            default_registry().backend_class(vc.backend).parse_options(vc.options)
        except errors.SnapError as exc:
            raise errors.ConfigError(path=cfg.path, key=f"volume_class {vc.name!r}", why=str(exc)) from None
    if tools:
        from ..backends.factory import backend_for_class

        for vc in cfg.volume_classes:
            if vc.scope == "node-local" and vc.transport == "ssh":
                # Its tools are on each compute node: which ones are known
                # only to Slurm, and `doctor` on the controller checks each.
                # With --json, stdout is the document alone.
                click.echo(f"# volume class {vc.name}: node-local over SSH, checked on each node by "
                           "`slurm-snap doctor`", err=as_json)
                continue
            try:
                backend_for_class(cfg, vc, node=None)
            except errors.SnapError as exc:
                where = f" over SSH on {vc.host}" if vc.transport == "ssh" and vc.host else ""
                # Same error, same exit code, but naming the class and host it was about.
                exc.message = f"volume class {vc.name!r}{where}: {exc.message}"
                raise
            click.echo(f"# volume class {vc.name}: backend {vc.backend} tools present"
                       + (f" on {vc.host} (SSH)" if vc.transport == "ssh" and vc.host else ""), err=as_json)
    data = config_mod.as_dict(cfg)
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    click.echo(f"# {cfg.path}: valid")
    for section, values in data.items():
        if section == "path":
            continue
        if section == "volume_class":
            for vc in values:
                click.echo(f"[[volume_class]]  # {vc['name']}")
                for k, v in vc.items():
                    click.echo(f"  {k} = {json.dumps(v)}")
            continue
        click.echo(f"[{section}]")
        for k, v in values.items():
            click.echo(f"  {k} = {json.dumps(v)}")


@command.command("get")
@click.argument("key")
@click.pass_obj
def get(ctx, key):
    """Print one effective value, e.g. `hooks.failure_policy` (booleans as true/false)."""
    data = config_mod.as_dict(config_mod.load(ctx.config_path))
    section, _, name = key.partition(".")
    values = data.get(section)
    if not name or not isinstance(values, dict) or name not in values:
        raise errors.BadValueError(what="configuration key", value=key,
                                   why="expected SECTION.KEY of a scalar setting, e.g. hooks.failure_policy")
    value = values[name]
    if isinstance(value, (dict, list, tuple)):
        raise errors.BadValueError(what="configuration key", value=key, why="is not a scalar setting")
    click.echo(json.dumps(value) if isinstance(value, bool) else str(value))


@command.command("cli-filter")
@click.argument("template", type=click.File("r", encoding="utf-8"))
@click.option("--expedite", is_flag=True,
              help="Also ask for --requeue=expedite (Slurm 25.11+ with SlurmctldParameters=enable_expedited_requeue; "
                   "Slurm refuses the job without that setting).")
@click.pass_obj
def cli_filter(ctx, template, expedite):
    """Print TEMPLATE (etc/cli_filter.lua) with the signal and its time from
    [protocol] checkpoint_signal and grace: the install step writes
    cli_filter.lua with this, so the configuration stays their one source."""
    from ..slurm import clifilter

    click.echo(clifilter.render(template.read(), config_mod.load(ctx.config_path), expedite=expedite), nl=False)


@command.command("man")
@click.argument("page", type=click.Choice(["slurm-snap", "slurm-snap.toml"]), default="slurm-snap")
def man(page):
    """Print a man page in roff: slurm-snap(1), from the commands' own
    definitions, or slurm-snap.toml(5), from the configuration schema
    (install: `slurm-snap config man > /usr/local/share/man/man1/slurm-snap.1`,
    `slurm-snap config man slurm-snap.toml > /usr/local/share/man/man5/slurm-snap.toml.5`)."""
    if page == "slurm-snap.toml":
        from .tomlpage import render as render_toml

        click.echo(render_toml(), nl=False)
        return
    from . import cli
    from .manpage import render

    click.echo(render(cli), nl=False)
