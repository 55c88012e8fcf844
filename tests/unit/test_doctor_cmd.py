"""`slurm-snap doctor` and `db status` as an admin runs them (issue 18):
Slurm unreachable is a finding with its fix and the documented exit code,
--json carries the same findings, a shared class over SSH is checked on its
host over SSH, and a node's doctor --json becomes the controller's findings."""
from __future__ import annotations

import json

import pytest

from slurm_snap import config, errors
from slurm_snap.doctor import probes, site_checks
from slurm_snap.doctor.facts import NodeReport
from slurm_snap.doctor.finding import Finding
from slurm_snap.cli import main
from slurm_snap.inventory import db
from slurm_snap.slurm import commands


def write_cfg(tmp_path, extra=""):
    (tmp_path / "b").mkdir(exist_ok=True)
    p = tmp_path / "c.toml"
    p.write_text(f'''
[inventory]
url = "sqlite:///{tmp_path}/inv.db"
[paths]
barrier_dir = "{tmp_path}/b"
restore_root = "{tmp_path}/r"
log_dir = "{tmp_path}/l"
[ssh]
known_hosts = "{tmp_path}/known_hosts"
key = "{tmp_path}/id"
''' + extra)
    return str(p)


@pytest.fixture
def slurm_down(monkeypatch):
    """scontrol answers as it does with slurmctld stopped."""
    def refuse(timeout=10.0):
        raise errors.CommandFailed(argv0="scontrol", status=1,
                                   stderr="slurm_load_ctl_conf error: Unable to contact slurm controller")
    for name in ("show_config", "show_partitions", "node_names"):
        monkeypatch.setattr(commands, name, refuse)


def test_slurm_unreachable_is_a_finding_and_the_other_checks_still_print(tmp_path, capsys, slurm_down):
    cfg = write_cfg(tmp_path)
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    capsys.readouterr()
    rc = main(["--config", cfg, "doctor"])
    out = capsys.readouterr().out
    assert rc == errors.CONFIG            # a failed check, not a backend tool's 7
    assert "FAIL  Slurm unreachable: " in out and "Unable to contact slurm controller" in out
    assert "fix: start slurmctld" in out and "--no-slurm" in out
    assert "ok    inventory reachable" in out and "ok    barrier directory" in out
    assert out.rstrip().endswith("1 problem(s)")


def test_doctor_json_has_the_documented_shape_and_the_same_exit(tmp_path, capsys, slurm_down):
    cfg = write_cfg(tmp_path)
    rc = main(["--config", cfg, "doctor", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == errors.CONFIG
    assert set(data) == {"version", "ok", "problems", "findings"} and data["version"] == 1
    assert data["ok"] is False and data["problems"] == sum(1 for f in data["findings"] if not f["ok"]) == 2
    whats = [f["what"] for f in data["findings"]]
    assert whats[0].startswith("Slurm unreachable: ")
    # No inventory yet (no db upgrade): the second problem, with its fix.
    (inv,) = [f for f in data["findings"] if f["what"].startswith("inventory")]
    assert not inv["ok"] and "db upgrade" in inv["fix"]
    assert all(set(f) == {"ok", "what", "fix"} for f in data["findings"])


def test_doctor_json_all_well_exits_0(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["--config", cfg, "doctor", "--no-slurm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["problems"] == 0
    # inventory, barrier directory, then the files SECURITY.md names, SSH, and who runs drills where (issue 31).
    whats = [f["what"] for f in data["findings"]]
    assert [w.split(" ")[0] for w in whats[:2]] == ["inventory", "barrier"]
    assert any(w.startswith("configuration") for w in whats) and whats[-2].startswith("no volume class")
    assert "Slurm jobs of the job's owner" in whats[-1]


def test_a_shared_class_over_ssh_is_checked_on_its_host_over_ssh(tmp_path, monkeypatch):
    """The Lustre MGS's lctl is not on the controller: building the backend
    with local=True would look in the wrong PATH."""
    import slurm_snap.backends.factory as factory

    cfg = config.load(write_cfg(tmp_path, '''
[[volume_class]]
name = "pfs"
prefix = "/lustre/projects"
scope = "shared"
backend = "lustre"
transport = "ssh"
host = "mgs01"
[volume_class.options]
fsname = "lustre"
'''))
    calls = []

    def build(cfg_, vc, node, *, local=False):
        calls.append((vc.name, node, local))
        raise errors.TransportError(f"root@{vc.host}: connection refused")
    monkeypatch.setattr(factory, "backend_for_class", build)
    found = [f for f in site_checks.check_local(cfg, probes.local(cfg, node_local=False))
             if f.what.startswith("volume class pfs")]
    assert calls == [("pfs", None, False)]
    assert len(found) == 1 and not found[0].ok
    assert found[0].what == "volume class pfs over SSH on mgs01: root@mgs01: connection refused"
    assert "mgs01's sshd" in found[0].fix
    # A node's own doctor leaves it to the controller's.
    calls.clear()
    assert not [f for f in site_checks.check_local(cfg, probes.local(cfg, node="n1")) if "pfs" in f.what]
    assert calls == []


def test_a_nodes_json_becomes_findings_named_by_the_node():
    text = json.dumps({"version": 1, "ok": False, "problems": 1, "findings": [
        {"ok": True, "what": "inventory reachable", "fix": ""},
        {"ok": False, "what": "volume class scratch on this host: /scratch is ext2/ext3", "fix": "mount btrfs"}]})
    got = site_checks.node_findings(NodeReport(node="n2", helper="/opt/x/slurm-snap", status=3, stdout=text))
    assert got == [Finding(True, "n2: inventory reachable", ""),
                   Finding(False, "n2: volume class scratch on this host: /scratch is ext2/ext3",
                                  "mount btrfs")]


@pytest.mark.parametrize("stdout, stderr", [("", "slurm-snap: no such option: --json"), ("ok    x\n", "")])
def test_a_node_that_printed_no_json_is_a_failure_naming_what_it_said(stdout, stderr):
    (f,) = site_checks.node_findings(NodeReport(node="n3", helper="/opt/x/slurm-snap", status=2, stdout=stdout,
                                                stderr=stderr))
    assert not f.ok and f.what.startswith("n3: doctor --json printed no findings (status 2: ")
    assert (stdout.strip() or stderr) in f.what and "/opt/x/slurm-snap on n3" in f.fix


# --- db status --json --------------------------------------------------------

def test_db_status_json_at_head(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["--config", cfg, "db", "status", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == {"version": 1, "url": f"sqlite:///{tmp_path}/inv.db", "current": db.SCHEMA_HEAD,
                    "head": db.SCHEMA_HEAD, "ok": True}


def test_db_status_json_behind_prints_then_exits_9(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/inv.db"
    engine = db.make_engine(url, create=True)
    db.upgrade(engine, "0002_report_indexes")
    engine.dispose()
    rc = main(["--config", write_cfg(tmp_path), "db", "status", "--json"])
    cap = capsys.readouterr()
    assert rc == errors.INVENTORY
    assert json.loads(cap.out) == {"version": 1, "url": url, "current": "0002_report_indexes",
                                   "head": db.SCHEMA_HEAD, "ok": False}
    assert "0002_report_indexes" in cap.err


def test_db_status_json_of_a_missing_inventory_prints_then_exits_9(tmp_path, capsys):
    rc = main(["--config", write_cfg(tmp_path), "db", "status", "--json"])
    cap = capsys.readouterr()
    assert rc == errors.INVENTORY and "not initialised" in cap.err
    assert json.loads(cap.out)["current"] is None
    assert not (tmp_path / "inv.db").exists()


def test_db_status_text_is_unchanged(tmp_path, capsys):
    cfg = write_cfg(tmp_path)
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["--config", cfg, "db", "status"]) == 0
    assert capsys.readouterr().out == f"current: {db.SCHEMA_HEAD}\nhead:    {db.SCHEMA_HEAD}\n"


def test_doctor_asks_a_restricted_ssh_accounts_sudo_rule_on_its_host(tmp_path, capsys, monkeypatch):
    """SECURITY.md: the account runs only the snapshot tools; doctor asks
    `sudo -n -l` on the class's host and fails a rule that allows ALL."""
    from slurm_snap.doctor.facts import SudoFacts

    cfg = write_cfg(tmp_path, '''user = "snapshot"
[[volume_class]]
name = "pfs"
prefix = "/lustre/projects"
scope = "shared"
backend = "lustre"
transport = "ssh"
host = "mgs01"
[volume_class.options]
fsname = "lustre"
''')
    assert main(["--config", cfg, "db", "upgrade"]) == 0
    asked = []

    def sudo_rules(cfg_, hosts):
        asked.append((cfg_.ssh.user, hosts))
        return [SudoFacts(h, 0, f"User snapshot may run the following commands on {h}:\n    (ALL) NOPASSWD: ALL\n")
                for h in hosts]
    monkeypatch.setattr(probes, "sudo_rules", sudo_rules)
    capsys.readouterr()
    assert main(["--config", cfg, "doctor", "--no-slurm", "--json"]) == errors.CONFIG
    found = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["what"].startswith("snapshot's sudo rule")]
    assert asked == [("snapshot", ["mgs01"])]
    assert [(f["ok"], f["what"]) for f in found] == [(False, "snapshot's sudo rule on mgs01 allows ALL: any command "
                                                             "as root")]
