"""doctor's view of a multi-host cluster (issue 15): SQLite without the
service, a service that does not answer, a node without a known host key,
a path that is not the filesystem its backend snapshots."""
from __future__ import annotations

import os
import socket
import threading

from slurm_snap import config
from slurm_snap.doctor import probes, site_checks


def cfg_of(tmp_path, *, url=None, listen="", known="", ssh_scratch=True):
    kh = tmp_path / "known_hosts"
    kh.write_text(known)
    text = f'''
[inventory]
url = "{url or f"sqlite:///{tmp_path}/inv.db"}"
[paths]
barrier_dir = "{tmp_path}/b"
restore_root = "{tmp_path}/r"
log_dir = "{tmp_path}/l"
[ssh]
known_hosts = "{kh}"
key = "{tmp_path}/id"
[ssh.addresses]
n1 = "10.9.9.1"
n2 = "10.9.9.2"
[[volume_class]]
name = "scratch"
prefix = "{tmp_path}/scratch"
scope = "node-local"
backend = "btrfs"
transport = "{"ssh" if ssh_scratch else "local"}"
'''
    if listen:
        text += f'[service]\nlisten = "{listen}"\n'
    p = tmp_path / "c.toml"
    p.write_text(text)
    return config.load(p)


def topology(cfg, nodes):
    """The controller's view, gathered and judged as doctor does."""
    return site_checks.check_topology(cfg, probes.topology(cfg, nodes, local_host="ctl"))


def failed(findings):
    return [f for f in findings if not f.ok]


def test_sqlite_across_hosts_without_the_service_is_refused_with_the_fix(tmp_path):
    cfg = cfg_of(tmp_path, ssh_scratch=False)
    bad = failed(topology(cfg, ["n1", "n2"]))
    assert len(bad) == 1 and "SQLite inventory on ctl with 2 other hosts" in bad[0].what
    assert "slurm-snap serve" in bad[0].fix and "PostgreSQL/MariaDB" in bad[0].fix
    # One host: nothing to say.
    assert failed(topology(cfg, ["ctl"])) == []
    # A server database: nodes may write it themselves.
    cfg = cfg_of(tmp_path, url="postgresql+psycopg2://u@db/x", ssh_scratch=False)
    assert failed(topology(cfg, ["n1", "n2"])) == []


def test_service_that_does_not_answer_is_named(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = cfg_of(tmp_path, listen=f"127.0.0.1:{port}", ssh_scratch=False)
    bad = failed(topology(cfg, ["n1"]))
    assert [f.what.split(" (")[0] for f in bad] == [f"slurm-snap service not answering on 127.0.0.1:{port}"]
    # A port that accepts and closes (slurmdbd's, say) is not the service
    # answering: doctor asks it for a MUNGE-sealed ping (test_service.py has
    # the real service answering it).
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        threading.Thread(target=lambda: srv.accept()[0].close(), daemon=True).start()
        cfg = cfg_of(tmp_path, listen=f"127.0.0.1:{port}", ssh_scratch=False)
        bad = failed(topology(cfg, ["n1"]))
    assert [f.what.split(" (")[0] for f in bad] == [f"slurm-snap service not answering on 127.0.0.1:{port}"]


def test_node_without_a_known_host_key_is_named_with_its_address(tmp_path):
    cfg = cfg_of(tmp_path, url="postgresql+psycopg2://u@db/x",
                 known="10.9.9.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample\n")
    seen = []
    findings = site_checks.check_topology(cfg, probes.topology(cfg, ["n2"], local_host="ctl",
                                                                node_doctor=lambda cfg, n: seen.append(n)))
    bad = failed(findings)
    assert len(bad) == 1 and "n2: SSH host key of 10.9.9.2" in bad[0].what and "missing" in bad[0].what
    assert "ssh-keyscan" in bad[0].fix
    assert seen == []   # no SSH to a host whose key is unknown


def test_path_on_the_wrong_filesystem_is_named(tmp_path):
    from slurm_snap.backends.transport import LocalTransport

    class Fake:
        FS_TYPES = ("btrfs",)
        transport = LocalTransport()
        timeout = 10.0

    from slurm_snap.doctor.facts import ClassTools

    cfg = cfg_of(tmp_path, ssh_scratch=False)
    os.makedirs(tmp_path / "scratch", exist_ok=True)
    fs = probes.fs_type(Fake(), str(tmp_path / "scratch"))
    got = site_checks.check_class(cfg, ClassTools("scratch", "btrfs", over_ssh="node", host="n1", fs=fs))[1:]
    fstype = os.popen(f"stat -f -c %T {tmp_path}").read().strip()
    assert len(got) == 1 and got[0].ok is (fstype == "btrfs")
    assert f"is {fstype}" in got[0].what and "needs btrfs" in got[0].what
    if not got[0].ok:
        assert "mount the btrfs filesystem" in got[0].fix


def test_controller_view_leaves_node_local_classes_to_the_nodes(tmp_path):
    """On the controller a node-local prefix is a directory of its own root
    disk: checking it there would call every healthy cluster broken. The
    nodes check it (`doctor --node NAME`)."""
    cfg = cfg_of(tmp_path, ssh_scratch=False)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "b").mkdir()
    on_ctl = site_checks.check_local(cfg, probes.local(cfg, node_local=False))
    assert not any("volume class scratch" in f.what for f in on_ctl)
    as_node = site_checks.check_local(cfg, probes.local(cfg, node="n1"))
    named = [f for f in as_node if "volume class scratch" in f.what]
    assert named, as_node
    # tmp_path is not btrfs: the node's check says so, naming the path.
    fs_checks = [f for f in named if "is " in f.what and "needs btrfs" in f.what]
    assert fs_checks and not fs_checks[0].ok and str(tmp_path / "scratch") in fs_checks[0].what


def test_doctor_says_who_runs_what_where():
    """Issue 31: drills as jobs (the local mode is a warning), SSH to nodes is
    a warning, named (the SSH account is security_checks' own finding)."""
    from slurm_snap import config as config_mod
    from slurm_snap.doctor.site_checks import check_who_runs_what

    def found(**data):
        return [(f.ok, f.warning, f.what) for f in check_who_runs_what(config_mod.from_dict(data))]

    (job,) = found()
    assert job[:2] == (True, False) and "Slurm jobs of the job's owner" in job[2]
    (local,) = found(restore={"mode": "local"})
    assert local[:2] == (True, True) and 'mode = "local"' in local[2]
    classes = [{"name": "scratch", "prefix": "/scratch", "scope": "node-local", "backend": "btrfs",
                "transport": "ssh"},
               {"name": "pfs", "prefix": "/lustre", "scope": "shared", "backend": "lustre", "transport": "ssh",
                "host": "mgs01"}]
    warned = [w for _ok, w, what in found(volume_class=classes) if w]
    assert len(warned) == 1
    text = " ".join(what for _ok, w, what in found(volume_class=classes) if w)
    assert "scratch" in text and "pfs" not in text and "cuts" in text and "move_budget = 60" in text
    assert not [w for _ok, w, _what in found(volume_class=classes[1:]) if w]
    # A node-local class on the node's own tools: only the requeued run's
    # moves still go over SSH, and not with move_budget = 0.
    local_classes = [{**classes[0], "transport": "local"}, classes[1]]
    text = " ".join(what for _ok, w, what in found(volume_class=local_classes) if w)
    assert "move_budget" in text and "cuts" not in text
    assert not [w for _ok, w, _what in found(volume_class=local_classes, restore={"move_budget": 0}) if w]
