"""slurm-snap.toml(5), written from the configuration schema itself.

config.py is the one place that knows every key: its frozen dataclasses give
each key's name, type and default, and the comment above each field says
what it does. This page is read out of both (`slurm-snap config man
slurm-snap.toml`), so a key added to the schema is in the reference at once,
and a key without a comment is a failing test (tests/unit/test_tomlpage.py),
not a silent gap.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import typing

from .. import __version__, config
from .manpage import roff_escape

MAN_SECTION = "5"
PAGE = "slurm-snap.toml"


def field_comments(cls) -> dict[str, str]:
    """Each field of dataclass `cls` -> the comment above it. A comment over
    a run of fields with no blank line between them (user, key) says what
    each of them is."""
    names = {f.name for f in dataclasses.fields(cls)}
    out: dict[str, str] = {}
    pending: list[str] = []
    after_comment = False
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#"):
            if not after_comment:
                pending = []
            pending.append(text.lstrip("#").strip())
            after_comment = True
            continue
        after_comment = False
        name = text.split(":", 1)[0].strip()
        if ":" in text and name in names:
            if pending:
                out[name] = " ".join(pending)
        else:  # a blank line, a docstring, a method: the comment ends here
            pending = []
    return out


def _type_name(hint) -> str:
    if hint is bool:
        return "boolean"
    if hint is int:
        return "integer"
    if hint is float:
        return "number"
    if hint is str:
        return "string"
    if hint is dict:
        return "table"
    if typing.get_origin(hint) is tuple:
        return "array of strings"
    return str(hint)


def _default(f: dataclasses.Field) -> str | None:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return None
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value)


def keys(cls) -> list[tuple[str, str, str | None, str]]:
    """(key, type, default as TOML or None when required, description) of
    every field of a section's dataclass, in the schema's order."""
    hints = typing.get_type_hints(cls)
    notes = field_comments(cls)
    return [(f.name, _type_name(hints[f.name]), _default(f), notes.get(f.name, ""))
            for f in dataclasses.fields(cls)]


def sections() -> list[tuple[str, type]]:
    """([table header], dataclass) of every table the file may hold."""
    return [(f"[{name}]", cls) for name, cls in config.SECTIONS.items()] + \
        [("[[volume_class]]", config.VolumeClass)]


def render() -> str:
    out = [f'.TH {roff_escape(PAGE.upper())} {MAN_SECTION} "" "slurm-snap {__version__}" "slurm-snap manual"',
           ".nh", ".ad l",
           ".SH NAME", f"{roff_escape(PAGE)} \\- slurm\\-snap's configuration file",
           ".SH SYNOPSIS", f".I {roff_escape(config.DEFAULT_PATH)}",
           ".SH DESCRIPTION",
           roff_escape("One TOML file per host, read by every slurm-snap command and hook (--config PATH, else "
                       f"${config.ENV_VAR}, else {config.DEFAULT_PATH}). Every key below is optional unless marked "
                       "required, and shown with its default. An unknown key or a value of the wrong type is an "
                       "error naming the key and the file (exit 3), so a typo is found by `slurm-snap config "
                       "check`, not at the next preemption."),
           ".PP",
           roff_escape("Durations are strings such as \"30m\", \"2h\", \"1d\"; times in seconds are numbers. "
                       "This page is generated from the schema (slurm_snap/config.py); the commented example "
                       "is etc/slurm-snap.toml.example (/etc/slurm-snap/slurm-snap.toml in the packages).")]
    for header, cls in sections():
        out += [f'.SH "{roff_escape(header)}"']
        intro = (inspect.getdoc(cls) or "") if cls.__doc__ and not cls.__doc__.startswith(cls.__name__ + "(") \
            else ""
        if intro:
            out += [roff_escape(" ".join(intro.split()))]
        for name, kind, default, note in keys(cls):
            head = f"\\fB{roff_escape(name)}\\fR ({roff_escape(kind)}"
            head += ", required)" if default is None else f", default {roff_escape(default)})"
            out += [".TP", head, roff_escape(note or "(undocumented)")]
    out += [".SH FILES", ".TP", f".I {roff_escape(config.DEFAULT_PATH)}",
            roff_escape("The default location."),
            ".SH SEE ALSO", roff_escape("slurm-snap(1), slurm.conf(5), spank(8)")]
    return "\n".join(out) + "\n"
