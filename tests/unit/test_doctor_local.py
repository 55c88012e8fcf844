"""`doctor --local` (issue 34): the checks a fresh install can run, with no
Slurm and no other host; and the PrologSlurmctld entry point's recording
mode read from its DEFAULTS file, as the package's entry points read it."""
from __future__ import annotations

import json

from slurm_snap import config
from slurm_snap.cli import main
from slurm_snap.doctor.slurm_checks import check_entry_point
from slurm_snap.slurm import commands


def write_cfg(tmp_path, url: str, extra: str = "") -> str:
    (tmp_path / "b").mkdir(exist_ok=True)
    p = tmp_path / "c.toml"
    p.write_text(f'[inventory]\nurl = "{url}"\n[paths]\nbarrier_dir = "{tmp_path}/b"\n' + extra)
    # Root's alone, as SECURITY.md asks of a config that may hold a database
    # password (doctor's security check fails anything else).
    p.chmod(0o600)
    return str(p)


LUSTRE_OVER_SSH = '''
[[volume_class]]
name = "pfs"
prefix = "/lustre"
scope = "shared"
backend = "lustre"
transport = "ssh"
host = "mgs01"
[volume_class.options]
fsname = "x"
'''


def doctor_local(cfg: str, capsys) -> tuple[int, dict]:
    code = main(["--config", cfg, "doctor", "--local", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_local_asks_neither_slurm_nor_other_hosts(tmp_path, capsys, monkeypatch):
    def no_slurm(*a, **k):
        raise AssertionError("doctor --local asked Slurm")

    monkeypatch.setattr(commands, "show_config", no_slurm)
    cfg = write_cfg(tmp_path, "postgresql+psycopg2://u:p@192.0.2.1:1/x", LUSTRE_OVER_SSH)
    code, out = doctor_local(cfg, capsys)
    whats = [f["what"] for f in out["findings"]]
    # Neither the database server nor the MGS over SSH: only this host's own facts.
    assert not any(w.startswith("inventory") or "pfs" in w for w in whats), whats
    assert code == 0 and out["ok"] and any("barrier directory" in w for w in whats)


def test_local_checks_a_sqlite_inventory_here(tmp_path, capsys):
    cfg = write_cfg(tmp_path, f"sqlite:///{tmp_path}/inv.db")
    code, out = doctor_local(cfg, capsys)
    assert code == 3
    bad = [f for f in out["findings"] if not f["ok"]]
    assert len(bad) == 1 and "db upgrade" in bad[0]["what"] + bad[0]["fix"]
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    capsys.readouterr()
    code, out = doctor_local(cfg, capsys)
    assert code == 0 and any(f["what"].startswith("inventory reachable") for f in out["findings"])


ENTRY = "HELPER=/usr/lib/slurm-snap/venv/bin/slurm-snap\nRECORD=background\nDEFAULTS=/etc/default/slurm-snap\n"


def test_entry_point_recording_mode_from_its_defaults_file():
    closed = config.from_dict({"hooks": {"failure_policy": "closed"}})
    [f] = check_entry_point(closed, "/usr/libexec/slurm-snap/slurm-snap-prolog-slurmctld", ENTRY)
    assert not f.ok and "set RECORD=foreground in /usr/libexec/slurm-snap/" in f.fix
    [f] = check_entry_point(closed, "/usr/libexec/slurm-snap/slurm-snap-prolog-slurmctld", ENTRY,
                            "CONFIG=/etc/x.toml\nRECORD=foreground\n")
    assert f.ok and "RECORD=foreground" in f.what
    [f] = check_entry_point(config.from_dict({}), "/p", ENTRY, "RECORD=foreground\n")
    assert not f.ok and "set RECORD=background in /etc/default/slurm-snap" in f.fix
