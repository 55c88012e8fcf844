"""slurm-snap(1), written from the click definitions themselves.

A man page kept by hand drifts from `--help` at the first new option; this
one is walked out of the command tree (`slurm-snap config man`), so every
command, option, default and exit code it lists is the one the CLI has.
"""
from __future__ import annotations

import inspect

import click

from .. import __version__, errors

MAN_SECTION = "1"


def roff_escape(text: str) -> str:
    """Text as roff reads it literally: backslashes, and a leading '.' or "'"
    that would start a request; '-' as \\- so options copy-paste as ASCII."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    lines = []
    for line in text.splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _paragraphs(help_text: str | None) -> list[str]:
    # click stops reading help at \f and keeps \b-marked blocks unwrapped.
    text = inspect.cleandoc((help_text or "").split("\f", 1)[0])
    paras = []
    for block in text.split("\n\n"):
        lines = [ln for ln in block.splitlines() if ln.strip() != "\b"]
        if lines:
            paras.append(" ".join(ln.strip() for ln in lines))
    return paras


def walk(cmd: click.Command, ctx: click.Context):
    """(context, command) for `cmd` and every visible command below it, in
    the order `--help` lists them."""
    yield ctx, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from walk(sub, click.Context(sub, info_name=name, parent=ctx, **sub.context_settings))


def options(cmd: click.Command, ctx: click.Context) -> list[tuple[str, str]]:
    """(option strings with metavar, help with default) as `--help` prints them."""
    out = []
    for p in cmd.get_params(ctx):
        if isinstance(p, click.Option) and not p.hidden:
            record = p.get_help_record(ctx)
            if record:
                out.append(record)
    return out


def render(cli: click.Group, prog: str = "slurm-snap") -> str:
    # As click builds them when the command runs, so -h shows where it works.
    root = click.Context(cli, info_name=prog, **cli.context_settings)
    out = [f'.TH {roff_escape(prog.upper())} {MAN_SECTION} "" "{prog} {__version__}" "slurm-snap manual"',
           # No hyphenation or justification: option names stay whole (and greppable).
           ".nh", ".ad l",
           ".SH NAME", f"{roff_escape(prog)} \\- {roff_escape(_paragraphs(cli.help)[0])}",
           ".SH SYNOPSIS", f".B {roff_escape(prog)}",
           roff_escape("[GLOBAL OPTIONS] COMMAND [OPTIONS] [ARGS]..."),
           ".SH DESCRIPTION"]
    for para in _paragraphs(cli.help)[1:]:
        out += [".PP", roff_escape(para)]
    out += [".PP", roff_escape(f"Every command below is also `{prog} COMMAND --help`. The guides are in the "
                               "project's README.md and docs/.")]
    out += [".SH GLOBAL OPTIONS"]
    out += _option_list(cli, root)
    out += [".SH COMMANDS"]
    for ctx, cmd in walk(cli, root):
        if cmd is cli:
            continue
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out += [f'.SS "{roff_escape(ctx.command_path)}"', f".B {roff_escape(ctx.command_path)}",
                roff_escape(usage)]
        for para in _paragraphs(cmd.help):
            out += [".PP", roff_escape(para)]
        if isinstance(cmd, click.Group):
            names = [n for n in cmd.list_commands(ctx) if not cmd.get_command(ctx, n).hidden]
            out += [".PP", roff_escape("Commands: " + ", ".join(names) + ".")]
        out += _option_list(cmd, ctx)
    out += [".SH ENVIRONMENT",
            ".TP", ".B SLURM_SNAP_CONFIG",
            roff_escape("The configuration file when --config is not given "
                        "(default /etc/slurm-snap/slurm-snap.toml)."),
            ".TP", ".B _SLURM_SNAP_COMPLETE",
            roff_escape(f"Shell completion (click's): `_SLURM_SNAP_COMPLETE=bash_source {prog}` prints the bash "
                        "script (zsh_source, fish_source for those shells)."),
            ".SH FILES",
            ".TP", ".I /etc/slurm\\-snap/slurm\\-snap.toml",
            roff_escape("The configuration (etc/slurm-snap.toml.example documents every key)."),
            ".SH EXIT STATUS"]
    for code, meaning in sorted(errors.EXIT_CODES.items()):
        out += [".TP", f".B {code}", roff_escape(meaning)]
    out += [".SH SEE ALSO", roff_escape("sbatch(1), sacct(1), scontrol(1), slurm.conf(5), spank(8)")]
    return "\n".join(out) + "\n"


def _option_list(cmd: click.Command, ctx: click.Context) -> list[str]:
    out = []
    for names, help_text in options(cmd, ctx):
        out += [".TP", f"\\fB{roff_escape(names)}\\fR",
                roff_escape(" ".join(help_text.split()) or "(no description)")]
    return out
