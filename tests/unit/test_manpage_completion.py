"""slurm-snap(1) and bash completion, both from the click definitions
(issue 18): the man page renders without a warning and names every command
and option the CLI has; click's completion script completes commands and
options in a real bash."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from realcomponents import require
from slurm_snap.cli import COMMANDS, cli, main
from slurm_snap.cli.manpage import render, roff_escape

ROOT = Path(__file__).resolve().parents[2]


def every_command() -> dict[str, click.Command]:
    """'slurm-snap db status' -> its command, read from the CLI's tables (not
    from the man page generator's own walk)."""
    out = {}
    for name in COMMANDS:
        cmd = cli.get_command(None, name)
        out[f"slurm-snap {name}"] = cmd
        if isinstance(cmd, click.Group):
            for sub_name, sub in cmd.commands.items():
                out[f"slurm-snap {name} {sub_name}"] = sub
    return out


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("man") / "slurm-snap.1"
    p.write_text(render(cli))
    return p


def test_config_man_prints_the_generated_page(capsys):
    assert main(["config", "man"]) == 0
    assert capsys.readouterr().out == render(cli)


def test_groff_reads_the_page_without_a_warning(page):
    groff = shutil.which("groff")
    require(groff is not None, "groff not installed (apt-get install groff-base)")
    r = subprocess.run([groff, "-man", "-ww", "-z", str(page)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_man_renders_every_command_and_option(page):
    man = shutil.which("man")
    require(man is not None, "man not installed (apt-get install man-db)")
    env = {**os.environ, "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "300", "LC_ALL": "C.UTF-8"}
    r = subprocess.run([man, "-l", str(page)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    text = "\n".join(lines)
    commands = every_command()
    assert len(commands) >= len(COMMANDS) + 8        # the groups' subcommands are in too
    headings = {i: ln for i, ln in enumerate(lines) if ln in commands or ln == "ENVIRONMENT"}
    assert set(commands) <= set(headings.values())    # each command has its own heading
    for start, path in headings.items():
        if path not in commands:
            continue
        end = min(i for i in headings if i > start)
        # Each option is in its own command's section, as a word of its own.
        section = re.split(r"[\s,/=\[\]]+", " ".join(lines[start:end]))
        for p in commands[path].params:
            if isinstance(p, click.Option) and not p.hidden:
                for opt in p.opts + p.secondary_opts:
                    assert opt in section, f"{path}: {opt}"
    for p in cli.params:
        for opt in p.opts:
            assert opt in text, opt
    assert "SLURM_SNAP_CONFIG" in text and "_SLURM_SNAP_COMPLETE=bash_source slurm-snap" in text
    assert "EXIT STATUS" in text and "the backend does not support this operation" in text


def test_roff_escape_keeps_text_literal():
    assert roff_escape(".TH not a request\n'also not") == "\\&.TH not a request\n\\&'also not"
    assert roff_escape("a\\b --json") == "a\\eb \\-\\-json"


@pytest.fixture
def on_path(tmp_path) -> dict[str, str]:
    """A `slurm-snap` on PATH that runs this checkout: the completion script
    calls the command by the name the user typed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "slurm-snap"
    exe.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                   "from slurm_snap.entry import entry\nentry()\n")
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


def test_bash_completion_script_is_generated_by_click(on_path):
    r = subprocess.run(["slurm-snap"], env={**on_path, "_SLURM_SNAP_COMPLETE": "bash_source"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "complete -o nosort -F _slurm_snap_completion slurm-snap" in r.stdout
    assert subprocess.run(["bash", "-n"], input=r.stdout, text=True, timeout=30).returncode == 0


@pytest.mark.parametrize("words, want", [
    ("slurm-snap re", ["repair", "report", "restore-test", "resume-path"]),
    ("slurm-snap db ", ["status", "upgrade"]),
    ("slurm-snap doctor --j", ["--json"]),
    ("slurm-snap db status --", ["--json", "--help"]),
])
def test_bash_completes_commands_and_options(on_path, tmp_path, words, want):
    script = subprocess.run(["slurm-snap"], env={**on_path, "_SLURM_SNAP_COMPLETE": "bash_source"},
                            capture_output=True, text=True, timeout=60).stdout
    (tmp_path / "completion.bash").write_text(script)
    parts = words.split(" ")
    # What bash does on TAB: COMP_WORDS/COMP_CWORD set, the registered function called.
    driver = (f'source {tmp_path / "completion.bash"}\n'
              f'COMP_WORDS=({" ".join(repr(p) for p in parts)})\n'
              f"COMP_CWORD={len(parts) - 1}\n"
              "_slurm_snap_completion slurm-snap\n"
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    r = subprocess.run(["bash", "-c", driver], env=on_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(want)
