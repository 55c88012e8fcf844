"""doctor against SECURITY.md: the service's port against every port Slurm
holds (slurm.conf as `scontrol show config` reports it, slurmdbd.conf) and
the ephemeral range; owners and modes of the files slurm-snap trusts, read
from real files by the real probe; SSH as root."""
from __future__ import annotations

import os
import pwd

import pytest

from realcomponents import require
from slurm_snap import config, errors
from slurm_snap.cli import main
from slurm_snap.doctor import probes, security_checks as sc
from slurm_snap.doctor.facts import PortFacts
from test_access_cli import OWNER

SLURM_22 = {"SlurmctldPort": "6817", "SlurmdPort": "6818", "SrunPortRange": "0-0",
            "AccountingStorageType": "accounting_storage/slurmdbd", "AccountingStoragePort": "6819"}


def cfg_with(tmp_path, text: str = "", listen: str = "10.0.0.1:6830", name: str = "c.toml", mode: int = 0o644):
    p = tmp_path / name
    p.write_text(f'[inventory]\nurl = "sqlite:///{tmp_path}/inv.db"\n'
                 + (f'[service]\nlisten = "{listen}"\n' if listen else "") + text)
    os.chmod(p, mode)
    return config.load(str(p))


def failed(findings):
    return [f for f in findings if not f.ok]


def test_the_default_port_collides_with_none_of_slurms(tmp_path):
    cfg = cfg_with(tmp_path, listen="10.0.0.1")
    found = sc.check_service_port(cfg, PortFacts(slurm=SLURM_22, dbd_conf="DbdPort=6819\n", ephemeral=(32768, 60999)))
    assert failed(found) == [] and len(found) == 2
    assert "port 6830 is none of Slurm's" in found[0].what


@pytest.mark.parametrize("listen, slurm, dbd, named", [
    ("ctl:6817", SLURM_22, None, "SlurmctldPort 6817"),
    ("ctl:6818", SLURM_22, None, "SlurmdPort 6818"),
    ("ctl:6819", SLURM_22, None, "AccountingStoragePort 6819"),
    ("ctl:6819", {}, None, "slurmdbd's default DbdPort 6819"),
    ("ctl:7000", {}, "# ours\ndbdport = 7000  # moved\n", "DbdPort (slurmdbd.conf) 7000"),
    ("ctl:6820", {}, None, "slurmrestd's usual port 6820"),
    ("ctl:6825", {**SLURM_22, "SlurmctldPort": "6817-6827"}, None, "SlurmctldPort 6817-6827"),
    ("ctl:6830", {**SLURM_22, "SrunPortRange": "6000-7000"}, None, "SrunPortRange 6000-7000"),
])
def test_a_port_slurm_holds_is_a_failure_naming_the_setting(tmp_path, listen, slurm, dbd, named):
    cfg = cfg_with(tmp_path, listen=listen)
    bad = failed(sc.check_service_port(cfg, PortFacts(slurm=slurm, dbd_conf=dbd, ephemeral=None)))
    assert len(bad) == 1 and named in bad[0].what, bad
    assert "6830" in bad[0].fix and "[inventory] url" in bad[0].fix


def test_the_dbd_port_counts_only_when_accounting_goes_through_slurmdbd_or_slurmdbd_conf_says_so(tmp_path):
    cfg = cfg_with(tmp_path, listen="ctl:7031")
    slurm = {**SLURM_22, "AccountingStorageType": "accounting_storage/none", "AccountingStoragePort": "7031"}
    assert failed(sc.check_service_port(cfg, PortFacts(slurm=slurm, dbd_conf="DbdPort=6819", ephemeral=None))) == []
    assert sc.dbd_port("DbdHost=ctl\n") == 6819 and sc.dbd_port("DBDPORT=7100") == 7100


def test_a_port_in_the_ephemeral_range_is_a_failure_with_the_reservation_fix(tmp_path):
    cfg = cfg_with(tmp_path, listen="ctl:40000")
    bad = failed(sc.check_service_port(cfg, PortFacts(slurm=SLURM_22, dbd_conf=None, ephemeral=(32768, 60999))))
    assert [("ephemeral range 32768-60999" in f.what, "ip_local_reserved_ports=40000" in f.fix) for f in bad] \
        == [(True, True)]


def test_no_service_here_no_port_check(tmp_path):
    cfg = cfg_with(tmp_path, listen="")
    assert sc.check_service_port(cfg, PortFacts(slurm={"SlurmctldPort": "6830"}, dbd_conf=None, ephemeral=None)) == []


def test_port_facts_reads_slurmdbd_conf_beside_slurm_conf_and_the_kernels_range(tmp_path):
    (tmp_path / "slurmdbd.conf").write_text("DbdPort=7777\n")
    facts = probes.port_facts({"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert sc.dbd_port(facts.dbd_conf) == 7777
    lo, hi = facts.ephemeral
    assert 0 < lo <= hi < 65536


# -- files -----------------------------------------------------------------------------------------
def test_a_config_without_secrets_may_be_read_by_all_but_written_by_root_alone(tmp_path):
    require(os.geteuid() == 0, "files owned by root")
    cfg = cfg_with(tmp_path, mode=0o644)
    assert failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),))) == []
    os.chmod(cfg.path, 0o664)
    bad = failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),)))
    assert len(bad) == 1 and "mode 0664 lets others write it" in bad[0].what and "chmod go-w" in bad[0].fix


def test_a_config_with_the_database_password_is_roots_alone(tmp_path):
    require(os.geteuid() == 0, "files owned by root")
    cfg = cfg_with(tmp_path, mode=0o644)
    p = tmp_path / "pw.toml"
    p.write_text('[inventory]\nurl = "postgresql+psycopg2://slurmsnap:SECRET@db/slurmsnap"\n')
    os.chmod(p, 0o640)
    cfg = config.load(str(p))
    bad = failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),)))
    assert len(bad) == 1 and "lets others read it" in bad[0].what and "chmod 0600" in bad[0].fix
    os.chmod(p, 0o600)
    assert failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),))) == []


def test_a_file_owned_by_a_user_or_in_a_directory_others_may_write_is_a_failure(tmp_path):
    require(os.geteuid() == 0, "chown needs root")
    d = tmp_path / "etc"
    d.mkdir()
    cfg = cfg_with(d, mode=0o644)
    uid = pwd.getpwnam(OWNER).pw_uid
    os.chown(cfg.path, uid, -1)
    bad = failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),)))
    assert len(bad) == 1 and f"owned by {OWNER}" in bad[0].what
    os.chown(cfg.path, 0, -1)
    os.chmod(d, 0o777)
    bad = failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),)))
    assert len(bad) == 1 and "its directory (mode 0777) lets others replace it" in bad[0].what
    os.chmod(d, 0o1777)   # sticky, like /tmp: others may not replace root's file
    assert failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),))) == []
    os.chmod(d, 0o755)
    os.chown(d, uid, -1)
    bad = failed(sc.check_files(cfg, (probes.file_facts("configuration", cfg.path),)))
    assert len(bad) == 1 and f"its directory is {OWNER}'s" in bad[0].what


def test_the_sqlite_inventory_the_ssh_key_and_munges_key_are_readable_by_their_owner_alone(tmp_path):
    require(os.geteuid() == 0, "files owned by root and munge")
    cfg = cfg_with(tmp_path, text=f'[ssh]\nkey = "{tmp_path}/id"\nknown_hosts = "{tmp_path}/kh"\n'
                                  f'[[volume_class]]\nname = "s"\nprefix = "{tmp_path}/s"\nscope = "node-local"\n'
                                  'backend = "btrfs"\ntransport = "ssh"\n')
    assert main(["--config", cfg.path, "db", "upgrade"]) == 0
    for name in ("id", "kh"):
        (tmp_path / name).write_text("x\n")
    os.chmod(tmp_path / "id", 0o600)
    os.chmod(tmp_path / "kh", 0o644)
    files = probes.trusted_files(cfg)
    roles = [f.role for f in files if f.exists]
    assert roles[:2] == ["configuration", "SQLite inventory"] and "SSH key" in roles and "SSH known_hosts" in roles
    assert failed(sc.check_files(cfg, tuple(f for f in files if f.role != "munge key"))) == []
    os.chmod(tmp_path / "inv.db", 0o644)
    os.chmod(tmp_path / "id", 0o640)
    os.chmod(tmp_path / "kh", 0o666)
    bad = failed(sc.check_files(cfg, tuple(f for f in probes.trusted_files(cfg) if f.role != "munge key")))
    assert sorted(f.what.split(":")[0] for f in bad) == sorted([
        f"SQLite inventory {tmp_path}/inv.db", f"SSH key {tmp_path}/id", f"SSH known_hosts {tmp_path}/kh"])
    # munge's key: munge's (or root's), nobody else reads it.
    key = tmp_path / "munge.key"
    key.write_text("k" * 128)
    os.chown(key, pwd.getpwnam("munge").pw_uid if _has("munge") else 0, -1)
    os.chmod(key, 0o400)
    assert failed(sc.check_files(cfg, (probes.file_facts("munge key", str(key)),))) == []
    os.chmod(key, 0o444)
    bad = failed(sc.check_files(cfg, (probes.file_facts("munge key", str(key)),)))
    assert len(bad) == 1 and "lets others read it" in bad[0].what


def _has(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def test_a_missing_optional_file_is_no_finding_and_an_unreadable_one_says_so(tmp_path):
    cfg = cfg_with(tmp_path)
    assert sc.check_files(cfg, (probes.file_facts("SSH key", str(tmp_path / "none")),)) == []
    from slurm_snap.doctor.facts import FileFacts

    bad = sc.check_files(cfg, (FileFacts("SSH key", "/x/id", exists=False, error="Permission denied"),))
    assert [f.ok for f in bad] == [False] and "cannot be checked (Permission denied)" in bad[0].what


# -- SSH -------------------------------------------------------------------------------------------
def test_ssh_as_root_is_a_failure_a_restricted_account_is_not(tmp_path):
    vc = (f'[[volume_class]]\nname = "lustre"\nprefix = "{tmp_path}/l"\nscope = "shared"\nbackend = "btrfs"\n'
          'transport = "ssh"\nhost = "mgs"\n')
    bad = failed(sc.check_ssh_account(cfg_with(tmp_path, text=vc, name="a.toml")))
    assert len(bad) == 1 and "logs in as 'root'" in bad[0].what and "forced command" in bad[0].fix
    ok = sc.check_ssh_account(cfg_with(tmp_path, text='[ssh]\nuser = "snapsnap"\n' + vc, name="b.toml"))
    assert failed(ok) == [] and "logs in as 'snapsnap'" in ok[0].what
    none = sc.check_ssh_account(cfg_with(tmp_path, name="c.toml"))
    assert failed(none) == [] and "no volume class reaches a host over SSH" in none[0].what


SUDO_L = """Matching Defaults entries for snapshot on mgs01:
    env_reset, mail_badpass, secure_path=/usr/local/sbin\\:/usr/local/bin\\:/usr/sbin\\:/usr/bin

User snapshot may run the following commands on mgs01:
    (root) NOPASSWD: /usr/sbin/lctl snapshot_create *, /usr/sbin/lctl snapshot_destroy *,
        /usr/sbin/lctl snapshot_list *
"""


def test_a_sudo_rule_is_read_as_its_commands():
    assert sc.sudo_commands(SUDO_L) == ["/usr/sbin/lctl snapshot_create *", "/usr/sbin/lctl snapshot_destroy *",
                                        "/usr/sbin/lctl snapshot_list *"]
    assert sc.sudo_commands("User x may run the following commands on h:\n    (ALL : ALL) ALL\n") == ["ALL"]
    assert sc.sudo_commands("Sorry, user snapshot may not run sudo on mgs01.\n") is None
    assert sc.sudo_commands("") is None


def test_the_sudo_rule_of_a_restricted_account_is_checked_on_each_host():
    from slurm_snap.doctor.facts import SudoFacts

    good, everything, shell, copies, forced, away = sc.check_sudo_rules("snapshot", [
        SudoFacts("mgs01", 0, SUDO_L),
        SudoFacts("n1", 0, "User snapshot may run the following commands on n1:\n    (ALL : ALL) NOPASSWD: ALL\n"),
        SudoFacts("n2", 0, "User snapshot may run the following commands on n2:\n    (root) /bin/bash\n"),
        SudoFacts("n3", 0, "User snapshot may run the following commands on n3:\n    (root) NOPASSWD: "
                           "/usr/bin/btrfs subvolume snapshot *, /usr/bin/cp --reflink=always *\n"),
        SudoFacts("n4", 1, "only the snapshot verbs, please\n"),
        SudoFacts("n5", error="snapshot@n5: connection refused")])
    assert good.ok and not good.warning and "allows only: /usr/sbin/lctl snapshot_create *" in good.what
    assert not everything.ok and "allows ALL: any command as root" in everything.what
    assert not shell.ok and "/bin/bash" in shell.what
    assert copies.ok and copies.warning and "cp --reflink=always" in copies.what
    assert (forced.ok, forced.verified) == (True, False) and "forced command" in forced.what
    assert (away.ok, away.verified) == (True, False) and "connection refused" in away.what


def test_sudo_is_asked_where_a_non_root_account_logs_in(tmp_path):
    shared = ('[[volume_class]]\nname = "pfs"\nprefix = "/l"\nscope = "shared"\nbackend = "lustre"\n'
              'transport = "ssh"\nhost = "mgs01"\n[volume_class.options]\nfsname = "l"\n')
    local = ('[[volume_class]]\nname = "scratch"\nprefix = "/scratch"\nscope = "node-local"\nbackend = "btrfs"\n'
             'transport = "ssh"\n')
    as_root = cfg_with(tmp_path, text=shared + local, name="a.toml")
    assert sc.sudo_hosts(as_root, ["n1"]) == []          # root's own finding: check_ssh_account
    cfg = cfg_with(tmp_path, text='[ssh]\nuser = "snapshot"\n[ssh.addresses]\nn1 = "10.0.0.11"\n' + shared + local,
                   name="b.toml")
    assert sc.sudo_hosts(cfg, None) == ["mgs01"]
    assert sc.sudo_hosts(cfg, ["n1", "n2"]) == ["mgs01", "10.0.0.11", "n2"]


def test_doctor_prints_the_file_checks_and_fails_on_a_bad_mode(tmp_path, capsys):
    require(os.geteuid() == 0, "files owned by root")
    (tmp_path / "b").mkdir()
    p = tmp_path / "c.toml"
    p.write_text(f'[inventory]\nurl = "sqlite:///{tmp_path}/inv.db"\n[paths]\nbarrier_dir = "{tmp_path}/b"\n')
    os.chmod(p, 0o644)
    assert main(["--config", str(p), "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["--config", str(p), "doctor", "--no-slurm"]) == 0, capsys.readouterr().out
    assert f"ok    configuration {p}: owner root, nobody else writes it" in capsys.readouterr().out
    os.chmod(p, 0o646)
    assert main(["--config", str(p), "doctor", "--no-slurm"]) == errors.CONFIG
    out = capsys.readouterr().out
    assert f"FAIL  configuration {p}: owner root, nobody else writes it: mode 0646 lets others write it" in out
