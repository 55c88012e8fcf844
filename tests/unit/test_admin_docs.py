"""The admin's documents hold what the code holds (issue 34): the
troubleshooting table has one row per error class with its exit code and
message as slurm_snap/errors.py defines them, and each "shows more" is a
command the CLI has; the other documents exist and are linked from README."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from slurm_snap import errors
from slurm_snap.cli import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def error_classes() -> list[type]:
    """Every class of the error tree, in the order errors.py defines them."""
    return [obj for obj in vars(errors).values()
            if isinstance(obj, type) and issubclass(obj, errors.SnapError) and obj.__module__ == errors.__name__]


def table_rows(text: str, heading: str) -> list[list[str]]:
    section = text.split(heading, 1)[1]
    section = re.split(r"\n## ", section, maxsplit=1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            # Cells split on " | " outside code spans (messages hold no pipes).
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows[1:]   # the header


def code(cell: str) -> str:
    m = re.fullmatch(r"``\s(.*)\s``|`(.*)`", cell)
    assert m, f"not a code span: {cell}"
    return m.group(1) if m.group(1) is not None else m.group(2)


@pytest.fixture(scope="module")
def troubleshooting_rows():
    return table_rows((DOCS / "troubleshooting.md").read_text(), "## Every error")


def test_one_row_per_error_class_in_errors_py_order(troubleshooting_rows):
    assert [r[0] for r in troubleshooting_rows] == [c.__name__ for c in error_classes()]


def test_exit_codes_and_messages_are_the_classes(troubleshooting_rows):
    by_name = {c.__name__: c for c in error_classes()}
    for name, exit_code, message, where, more in troubleshooting_rows:
        cls = by_name[name]
        assert int(exit_code) == cls.exit_code, name
        assert code(message) == cls.template, name
        assert where and more, name
        assert int(exit_code) in errors.EXIT_CODES


def _check_command(text: str) -> None:
    """`slurm-snap [-v] CMD [SUB] [--opt ...] [ARGS]`: the command path exists and
    every --option is one of that command's (placeholders in capitals pass)."""
    argv = shlex.split(text)
    assert argv[0] == "slurm-snap", text
    args = [a for a in argv[1:] if a not in ("-v", "-vv", "...")]
    cmd: click.Command = cli
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        if args[0] == "COMMAND":
            return
        sub = cmd.get_command(None, args[0])
        assert sub is not None, f"{text}: no command {args[0]!r}"
        cmd, args = sub, args[1:]
    known = {o for p in cmd.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
    known |= {"-h", "--help"}
    for a in args:
        if a.startswith("-"):
            assert a.split("=")[0] in known, f"{text}: {a} is not an option of {cmd.name}"


def test_every_shows_more_command_is_a_real_command(troubleshooting_rows):
    commands = [c for row in troubleshooting_rows for c in re.findall(r"`(slurm-snap [^`]*)`", row[4])]
    assert len(commands) >= len(troubleshooting_rows)
    for c in commands:
        _check_command(c)


def test_where_to_look_commands_are_real_commands():
    text = (DOCS / "troubleshooting.md").read_text()
    first = text.split("## Where to look first", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"`(slurm-snap [^`]*)`", first)
    assert len(commands) >= 5
    for c in commands:
        _check_command(c.replace("...", "").strip())


@pytest.mark.parametrize("doc", ["troubleshooting.md", "upgrade.md", "backup.md", "uninstall.md", "packaging.md"])
def test_each_admin_document_exists_and_readme_links_it(doc):
    assert (DOCS / doc).is_file()
    assert f"docs/{doc}" in (ROOT / "README.md").read_text()


def test_changelog_names_this_version_and_the_schema_head():
    from slurm_snap import __version__

    text = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)", text, re.M)
    assert newest and newest.group(1) == __version__
    heads = sorted(p.stem for p in (ROOT / "slurm_snap/inventory/migrations/versions").glob("0*.py"))
    entry = text.split("\n## ", 2)[1]
    assert f"Schema: {heads[-1]}." in entry, "CHANGELOG's newest entry names another schema head than the tree's"
    debian = (ROOT / "debian/changelog").read_text().splitlines()[0]
    assert debian.startswith(f"slurm-snap ({__version__})")
