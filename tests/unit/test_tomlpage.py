"""slurm-snap.toml(5), the configuration reference (issue 34): generated from
config.py's schema, so every key the loader accepts is on the page with its
type, default and description, and the page renders without a warning."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess

import pytest

from realcomponents import require
from slurm_snap import config
from slurm_snap.cli import main
from slurm_snap.cli.tomlpage import field_comments, keys, render, sections


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    p = tmp_path_factory.mktemp("man") / "slurm-snap.toml.5"
    p.write_text(render())
    return p


def test_config_man_prints_the_generated_reference(capsys):
    assert main(["config", "man", "slurm-snap.toml"]) == 0
    assert capsys.readouterr().out == render()


def test_every_table_the_loader_accepts_is_a_section():
    headers = [h for h, _ in sections()]
    assert headers == [f"[{n}]" for n in config.SECTIONS] + ["[[volume_class]]"]
    # And the loader accepts no table the page lacks: an unknown one is refused.
    with pytest.raises(config.ConfigError, match="unknown key"):
        config.from_dict({"nosuchtable": {}})


@pytest.mark.parametrize("header,cls", sections(), ids=[h for h, _ in sections()])
def test_every_key_has_a_description(header, cls):
    undocumented = [name for name, _, _, note in keys(cls) if not note]
    assert undocumented == [], f"{header}: add a comment above {undocumented} in slurm_snap/config.py"
    assert {f.name for f in dataclasses.fields(cls)} == set(field_comments(cls))


def test_defaults_on_the_page_are_the_loaders():
    """What the page says a missing key means is what loading an empty file gives."""
    empty = config.from_dict({}, "x.toml")
    for header, cls in sections():
        if header == "[[volume_class]]":
            continue
        loaded = getattr(empty, header.strip("[]"))
        for name, _, default, _ in keys(cls):
            value = getattr(loaded, name)
            assert default == json.dumps(list(value) if isinstance(value, tuple) else value), name


def test_required_volume_class_keys_are_marked_required():
    required = {name for name, _, default, _ in keys(config.VolumeClass) if default is None}
    assert required == {"name", "prefix", "scope", "backend"}
    with pytest.raises(config.ConfigError, match="required key missing"):
        config.from_dict({"volume_class": [{"name": "x", "scope": "shared", "backend": "btrfs"}]})


def test_groff_reads_the_reference_without_a_warning(page):
    groff = shutil.which("groff")
    require(groff is not None, "groff not installed (apt-get install groff-base)")
    r = subprocess.run([groff, "-man", "-ww", "-z", str(page)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_man_shows_every_key_under_its_table(page):
    man = shutil.which("man")
    require(man is not None, "man not installed (apt-get install man-db)")
    env = {**os.environ, "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "200", "LC_ALL": "C.UTF-8"}
    r = subprocess.run([man, "-l", str(page)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    for header, cls in sections():
        start = lines.index(header)
        end = next((i for i in range(start + 1, len(lines)) if re.fullmatch(r"\[\[?[a-z_]+\]\]?|FILES", lines[i])),
                   len(lines))
        shown = {ln.split(" (", 1)[0] for ln in lines[start:end]}
        assert {f.name for f in dataclasses.fields(cls)} <= shown, header
    # The keys the old example did not show are on the page.
    text = "\n".join(lines)
    assert "[service]" in text and "addresses (table" in text
