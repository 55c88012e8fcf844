"""One table of hook names (slurm_snap/slurm/hooknames.py): the entry-point
scripts, slurm.conf's lines, the hook runner, the CLI and doctor all agree
with it, so a hook renamed in one place cannot go unnoticed in another."""
from __future__ import annotations

import os
import re
from pathlib import Path

from slurm_snap import entry
from slurm_snap.doctor import slurm_checks
from slurm_snap.cli import main
from slurm_snap.hooks.jobhooks import HOOKS
from slurm_snap.slurm import hooknames

REPO = Path(__file__).resolve().parents[2]
EXEC = re.compile(r'"\$HELPER" --config "\$CONFIG" hook ([a-z-]+)')


def test_every_entry_point_execs_hooks_of_its_own_slurm_parameter():
    seen = set()
    for key, rel in hooknames.ENTRY_POINTS.items():
        script = REPO / rel
        assert script.is_file() and os.access(script, os.X_OK), rel
        names = EXEC.findall(script.read_text())
        assert names, f"{rel} execs no hook"
        for name in names:
            assert hooknames.SLURM_KEY.get(name) == key, (rel, name)
        seen.update(names)
    assert seen == set(hooknames.NAMES)  # every name is run by some entry point
    on_disk = {f"{d}/{f}" for d in ("prolog", "epilog") for f in os.listdir(REPO / d)}
    assert on_disk == set(hooknames.ENTRY_POINTS.values())


def test_slurm_conf_lines_name_the_entry_points():
    text = (REPO / "etc" / "slurm.conf.slurm-snap").read_text()
    for key in hooknames.ENTRY_POINTS:
        (value,) = re.findall(rf"^{key}=(\S+)$", text, re.M)
        assert os.path.basename(value) == hooknames.entry_point_name(key)


def test_runner_fast_path_and_cli_take_the_names_of_the_table(capsys):
    assert tuple(HOOKS) == hooknames.NAMES == entry.HOOK_NAMES
    assert main(["hook", "--help"]) == 0
    listed = set(re.findall(r"^  ([a-z-]+)\s", capsys.readouterr().out, re.M)) - set(hooknames.PLUGIN_COMMANDS)
    assert listed == set(hooknames.LISTED)


def test_doctor_asks_for_every_entry_point(tmp_path):
    from slurm_snap import config

    cfg = config.from_dict({"inventory": {"url": f"sqlite:///{tmp_path}/i.db"}})
    whats = " ".join(f.what for f in slurm_checks.check_slurm(cfg, {}, [], None))
    for key in hooknames.ENTRY_POINTS:
        assert f"{key} runs {hooknames.entry_point_name(key)}" in whats
