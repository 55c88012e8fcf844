"""doctor checks what each hook will really run (issue 35 item 4): Slurm's
documented glob (Prolog=/etc/slurm/prolog.d/*) expanded as slurmd expands
it, a relative path taken from slurm.conf's directory, slurm-snap's entry
point found by its name or, renamed, by its own first comment, a site
wrapper that names it accepted, and a program that does not name it said to
be unverifiable here, with how to check it by hand, instead of a failure."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slurm_snap import config
from slurm_snap.cli import main
from slurm_snap.doctor import probes, slurm_checks
from slurm_snap.doctor.facts import HookScript
from slurm_snap.slurm import commands

REPO = Path(__file__).resolve().parents[2]


def hook(cfg, slurm, key):
    (f,) = [f for f in slurm_checks.check_slurm(cfg, slurm, [], None, probes.all_hook_scripts(slurm))
            if f.what.startswith(f"{key} ") or f.what.startswith(f"{key}:") or f.what.startswith(f"{key}=")]
    return f


@pytest.fixture
def cfg(tmp_path):
    return config.from_dict({"inventory": {"url": f"sqlite:///{tmp_path}/i.db"}, "paths": {"log_dir": "/var/log/ss"}})


def test_a_prolog_glob_is_expanded_and_our_entry_point_found_in_it(tmp_path, cfg):
    d = tmp_path / "prolog.d"
    d.mkdir()
    (d / "10-site").write_text("#!/bin/sh\nexit 0\n")
    shutil.copy(REPO / "prolog" / "slurm-snap-prolog", d / "slurm-snap-prolog")
    f = hook(cfg, {"Prolog": f"{d}/*"}, "Prolog")
    assert f.ok and f.verified
    assert f.what == f"Prolog runs slurm-snap-prolog ({d}/slurm-snap-prolog, from Prolog={d}/*)"


def test_a_renamed_copy_of_the_entry_point_is_known_by_its_first_comment(tmp_path, cfg):
    d = tmp_path / "epilog.d"
    d.mkdir()
    shutil.copy(REPO / "epilog" / "slurm-snap-epilog", d / "50-snapshots")
    f = hook(cfg, {"Epilog": f"{d}/*"}, "Epilog")
    assert f.ok and f.verified and f"{d}/50-snapshots" in f.what
    # ...but the Prolog's copy is not the Epilog's.
    shutil.copy(REPO / "prolog" / "slurm-snap-prolog", d / "50-snapshots")
    assert not hook(cfg, {"Epilog": f"{d}/*"}, "Epilog").verified


def test_a_site_wrapper_that_names_the_entry_point_passes(tmp_path, cfg):
    w = tmp_path / "site-epilog"
    w.write_text("#!/bin/sh\n/usr/local/sbin/site-cleanup\nexec /usr/local/libexec/slurm-snap/slurm-snap-epilog\n")
    f = hook(cfg, {"Epilog": str(w)}, "Epilog")
    assert f.ok and f.verified and f.what == f"Epilog runs slurm-snap-epilog through {w}, which names it"


def test_a_wrapper_that_does_not_name_it_cannot_be_verified_and_says_how_to(tmp_path, cfg):
    w = tmp_path / "site-prolog"
    # Names only the slurmctld hook's entry point: not the Prolog's.
    w.write_text("#!/bin/sh\nrun-parts /etc/slurm/prolog.d # see slurm-snap-prolog-slurmctld\n")
    f = hook(cfg, {"Prolog": str(w)}, "Prolog")
    assert f.ok and not f.verified
    assert f.what == f"Prolog: cannot verify from here that it runs slurm-snap-prolog ({w} does not name slurm-snap-prolog)"
    assert '"hook": "prolog"' in f.fix and "/var/log/ss/hooks.log on the node" in f.fix
    g = hook(cfg, {"PrologSlurmctld": str(tmp_path / "unreadable")}, "PrologSlurmctld")
    assert g.ok and not g.verified and "cannot be read here" in g.what
    assert '"hook": "prolog-slurmctld" or "hook": "prolog-slurmctld-record"' in g.fix and "on the controller" in g.fix


def test_a_glob_that_matches_nothing(tmp_path, cfg):
    empty = tmp_path / "none.d"
    empty.mkdir()
    # The nodes run the Prolog: the controller need not have its files.
    f = hook(cfg, {"Prolog": f"{empty}/*"}, "Prolog")
    assert f.ok and not f.verified and f"{empty}/* matches no file on this host" in f.what
    # The slurmctld hooks run here: nothing here is nothing.
    g = hook(cfg, {"EpilogSlurmctld": f"{empty}/*"}, "EpilogSlurmctld")
    assert not g.ok and g.what == f"EpilogSlurmctld={empty}/* matches no file on this host"
    assert "slurm-snap-epilog-slurmctld" in g.fix


def test_a_relative_path_is_read_from_slurm_confs_directory(tmp_path, cfg):
    (tmp_path / "hooks").mkdir()
    shutil.copy(REPO / "epilog" / "slurm-snap-epilog-slurmctld", tmp_path / "hooks" / "ctld-epilog")
    slurm = {"SLURM_CONF": str(tmp_path / "slurm.conf"), "EpilogSlurmctld": "hooks/ctld-epilog"}
    (s,) = probes.hook_scripts(slurm, "EpilogSlurmctld")
    assert s.path == str(tmp_path / "hooks" / "ctld-epilog") and "hook epilog-slurmctld" in s.text
    assert hook(cfg, slurm, "EpilogSlurmctld").verified


def test_the_entry_point_name_alone_still_passes_and_no_value_still_fails(cfg):
    found = {f.what: f.ok for f in slurm_checks.check_slurm(cfg, {"Prolog": "/x/slurm-snap-prolog"}, [], None,
                                                            {"Prolog": (HookScript("/x/slurm-snap-prolog",
                                                                                   "/x/slurm-snap-prolog"),),
                                                             "Epilog": (), "PrologSlurmctld": (),
                                                             "EpilogSlurmctld": ()})
             if " runs slurm-snap" in f.what}
    assert found == {"Prolog runs slurm-snap-prolog": True, "Epilog runs slurm-snap-epilog": False,
                     "PrologSlurmctld runs slurm-snap-prolog-slurmctld": False,
                     "EpilogSlurmctld runs slurm-snap-epilog-slurmctld": False}


def test_the_command_reads_the_glob_and_prints_what_to_check_by_hand(tmp_path, capsys, monkeypatch):
    d = tmp_path / "prolog.d"
    d.mkdir()
    shutil.copy(REPO / "prolog" / "slurm-snap-prolog", d / "90-slurm-snap")
    site = tmp_path / "site-epilog"
    site.write_text("#!/bin/sh\nrun-parts /etc/slurm/epilog.d\n")
    slurm = {"SLURM_CONF": str(tmp_path / "slurm.conf"), "Prolog": f"{d}/*", "Epilog": str(site),
             "PrologSlurmctld": str(REPO / "prolog" / "slurm-snap-prolog-slurmctld"),
             "EpilogSlurmctld": str(REPO / "epilog" / "slurm-snap-epilog-slurmctld")}
    monkeypatch.setattr(commands, "show_config", lambda timeout=10.0: slurm)
    monkeypatch.setattr(commands, "show_partitions", lambda timeout=10.0: [])
    monkeypatch.setattr(commands, "node_names", lambda timeout=10.0: [])
    (tmp_path / "b").mkdir()
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[inventory]\nurl = "sqlite:///{tmp_path}/inv.db"\n[paths]\nbarrier_dir = "{tmp_path}/b"\n'
                   f'restore_root = "{tmp_path}/r"\nlog_dir = "{tmp_path}/l"\n')
    main(["--config", str(cfg), "doctor"])
    out = capsys.readouterr().out
    assert f"ok    Prolog runs slurm-snap-prolog ({d}/90-slurm-snap, from Prolog={d}/*)" in out
    assert f"CHECK Epilog: cannot verify from here that it runs slurm-snap-epilog ({site} does not name" in out
    assert "      how: submit a job with a slurm-snap option" in out
    assert ", 1 to check by hand, " in out.splitlines()[-1]
    assert "FAIL  Prolog runs" not in out and "FAIL  Epilog" not in out
    main(["--config", str(cfg), "doctor", "--json"])
    data = json.loads(capsys.readouterr().out)
    (epilog,) = [f for f in data["findings"] if f["what"].startswith("Epilog:")]
    assert epilog["ok"] is True and "hooks.log" in epilog["fix"]
