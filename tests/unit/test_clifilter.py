"""One source for the checkpoint signal and its time: slurm-snap.toml
[protocol]. cli_filter.lua is written from it (`slurm-snap config
cli-filter`), doctor compares the installed file with it, and the SPANK
plugin's plugstack.conf line carries neither any more."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_snap import config, errors
from slurm_snap.doctor import slurm_checks
from slurm_snap.cli import main
from slurm_snap.slurm import clifilter

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = (REPO / "etc" / "cli_filter.lua").read_text()


def cfg_with(tmp_path, **protocol):
    return config.from_dict({"inventory": {"url": f"sqlite:///{tmp_path}/i.db"}, "protocol": protocol},
                            path=str(tmp_path / "slurm-snap.toml"))


def test_the_template_asks_for_the_default_configuration(tmp_path):
    assert clifilter.settings(TEMPLATE) == clifilter.wanted(cfg_with(tmp_path)) == ("USR1", 60)


@pytest.mark.parametrize("protocol, want", [({"checkpoint_signal": "SIGUSR2", "grace": 10}, ("USR2", 10)),
                                            ({"grace": 0}, ("USR1", clifilter.DEFAULT_SIGNAL_TIME)),
                                            ({"checkpoint_signal": "SIGTERM", "grace": 300}, ("TERM", 300))])
def test_render_writes_the_configured_signal_and_time(tmp_path, protocol, want):
    text = clifilter.render(TEMPLATE, cfg_with(tmp_path, **protocol))
    assert clifilter.settings(text) == want
    # nothing else of the file changes
    strip = [ln for ln in TEMPLATE.splitlines() if not ln.startswith("local SNAP_SIGNAL")]
    assert [ln for ln in text.splitlines() if not ln.startswith("local SNAP_SIGNAL")] == strip


def test_render_refuses_a_template_without_the_settings(tmp_path):
    with pytest.raises(errors.BadValueError, match="SNAP_SIGNAL_TIME"):
        clifilter.render("function slurm_cli_pre_submit() end\n", cfg_with(tmp_path))


def test_config_cli_filter_prints_the_rendered_file(write_config, capsys):
    path = write_config('[inventory]\nurl = "sqlite:////tmp/x.db"\n[protocol]\ncheckpoint_signal = "SIGUSR2"\n'
                        'grace = 25\n')
    assert main(["--config", path, "config", "cli-filter", str(REPO / "etc" / "cli_filter.lua")]) == 0
    assert clifilter.settings(capsys.readouterr().out) == ("USR2", 25)


def test_doctor_compares_the_installed_cli_filter_with_the_configuration(tmp_path):
    cfg = cfg_with(tmp_path, grace=10)
    (ok,) = slurm_checks.check_cli_filter(cfg, "/etc/slurm/cli_filter.lua", clifilter.render(TEMPLATE, cfg))
    assert ok.ok and "--signal=USR1@10" in ok.what
    (stale,) = slurm_checks.check_cli_filter(cfg, "/etc/slurm/cli_filter.lua", TEMPLATE)
    assert not stale.ok and "has USR1@60" in stale.what and "config cli-filter" in stale.fix
    (missing,) = slurm_checks.check_cli_filter(cfg, "/etc/slurm/cli_filter.lua", None)
    assert not missing.ok and "readable" in missing.what


def test_plugstack_line_carries_no_signal_or_grace(tmp_path):
    plugstack = (REPO / "etc" / "plugstack.conf").read_text()
    (line,) = [ln for ln in plugstack.splitlines() if ln.startswith("required")]
    assert [a.split("=")[0] for a in line.split()[2:]] == ["helper", "config"]
    cfg = cfg_with(tmp_path)

    def finding(text):
        return [f for f in slurm_checks.check_slurm(cfg, {}, [], text) if "carries only" in f.what]

    assert [f.ok for f in finding(plugstack)] == [True]
    (old,) = finding(line + " signal=USR1 grace=60\n")
    assert not old.ok and "remove signal=USR1 grace=60" in old.fix
