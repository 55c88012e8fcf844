"""Issue 4 acceptance on the dev cluster: the hooks record every declared
volume on every node, prepare the node-local subvolumes with the right owner
on each node's own disk, leave no trace for jobs that did not opt in, and
never drain a node. The inventory is read on ctl, where it lives."""
from __future__ import annotations

import contextlib
import os
import pwd
import re
import time
from pathlib import Path

import pytest

from test_lockstep_cluster import _wait

pytestmark = pytest.mark.integration


def _cfg(cluster):
    from slurm_snap.config import load

    return load(cluster.config_path("ctl"))


def _job_record(repo, jid: int):
    """(nodes, user, [(class, node, path)]) of a recorded job, or None."""
    run = repo.find_job_run(jid)
    if run is None:
        return None
    return (sorted(run.nodes), run.user_name,
            sorted((v.volume_class, v.node, v.path) for v in repo.volumes(run)))


def _wait_done(cluster, job_id, timeout=60):
    cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=timeout)


@contextlib.contextmanager
def _config_edit(cluster, old: str, new: str, *, regex: bool = False):
    """Temporarily change every host's slurm-snap.toml (hooks read it on every run)."""
    saved = {}
    for host in cluster.hosts:
        path = cluster.config_path(host)
        text = saved[path] = path.read_text()
        if regex:
            edited, n = re.subn(old, new, text, count=1, flags=re.M)
        else:
            n, edited = text.count(old), text.replace(old, new, 1)
        assert n >= 1, (host, old)
        path.write_text(edited)
    try:
        yield
    finally:
        for path, text in saved.items():
            path.write_text(text)



def _wait_recorded(cluster, jid: int, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        got = cluster.inventory(_job_record, jid)
        if got is not None:
            return got
        assert time.monotonic() < deadline, f"job {jid} not recorded within {timeout:g} s"
        time.sleep(0.2)


def _stat_on_node(path: str):
    st = os.stat(path)
    return st.st_uid, st.st_ino, st.st_dev


def test_opted_in_job_records_every_volume_on_every_node(cluster):
    cfg = _cfg(cluster)
    jid = cluster.sbatch("-N3", "--snapshot-volumes=scratch,pfs", "-o", "/dev/null",
                         "--wrap", "srun /bin/true")
    _wait_done(cluster, jid)
    # PrologSlurmctld records in the background (the default)
    nodes, user, vols = _wait_recorded(cluster, jid)
    assert nodes == ["n1", "n2", "n3"]
    assert user == cluster.user
    assert [(c, n) for c, n, _p in vols] == [("pfs", ""), ("scratch", "n1"), ("scratch", "n2"), ("scratch", "n3")]
    uid = pwd.getpwnam(cluster.user).pw_uid
    for vclass, node, path in vols:
        if node:
            # Each node prepared its volume on its own disk: seen inside the node
            # on that node's device, and in the machine room on that disk alone.
            assert path == f"{cluster.scratch}/jobs/{jid}"
            # (A btrfs subvolume has an st_dev of its own, the same in every namespace.)
            inside = cluster.on(node, _stat_on_node, path)
            st = os.stat(cluster.root_path(path, node))
            assert (st.st_uid, st.st_ino, st.st_dev) == inside, (node, path)
            others = [os.stat(cluster.root_path(path, n)).st_dev for n in cluster.nodes if n != node]
            assert inside[2] not in others, (node, path)
        else:
            st = os.stat(path)
        assert st.st_uid == uid, (node, path)
        # A btrfs subvolume's root inode is 256: it can be snapshotted on its own.
        assert st.st_ino == 256, f"{path} on {node or 'pfs'} is not a subvolume"
    jd = Path(cfg.paths.barrier_dir) / str(jid)
    assert (jd / "job.json").exists()
    assert os.stat(jd / "ack").st_uid == uid and (os.stat(jd / "ack").st_mode & 0o077) == 0


def test_job_without_options_leaves_no_trace(cluster):
    cfg = _cfg(cluster)
    jid = cluster.sbatch("-N3", "-o", "/dev/null", "--wrap", "srun /bin/true")
    _wait_done(cluster, jid)
    assert cluster.inventory(_job_record, jid) is None
    for node in cluster.nodes:
        assert not cluster.root_path(f"{cluster.scratch}/jobs/{jid}", node).exists(), node
    assert not (Path(cfg.paths.barrier_dir) / str(jid)).exists()
    assert f'"job_id": {jid},' not in cluster.hook_log()


def test_inventory_unreachable_hooks_exit_0_and_node_stays_up(cluster):
    with _config_edit(cluster, r'^url = ".*"$', 'url = "postgresql+psycopg2://nobody@127.0.0.1:1/none"', regex=True):
        jid = cluster.sbatch("-N3", "--snapshot-volumes=scratch", "-o", "/dev/null", "--wrap", "srun /bin/true")
        _wait_done(cluster, jid)
        # PrologSlurmctld records in the background (after handing the launch
        # back): its failure line may land after the job has ended.
        deadline = time.monotonic() + 30
        while True:
            log = cluster.hook_log()
            failed = [ln for ln in log.splitlines() if f'"job_id": {jid},' in ln and '"failed"' in ln]
            if any("127.0.0.1" in ln for ln in failed) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert any("127.0.0.1" in ln for ln in failed), log[-3000:]
    assert cluster.drained() == []
    # The job itself ran to completion: fail-open.
    assert cluster.job(jid) is None or cluster.job(jid).state == "COMPLETED"


def test_backend_tool_missing_open_then_closed(cluster):
    marker = 'backend = "btrfs"\ndefault = true\n'
    broken = marker + 'options = { tool_dir = "/nonexistent-tools" }\n'
    with _config_edit(cluster, marker, broken):
        jid = cluster.sbatch("-N3", "--snapshot-volumes=scratch", "-o", "/dev/null", "--wrap", "srun /bin/true")
        _wait_done(cluster, jid)
        assert "btrfs" in cluster.hook_log() and "not found" in cluster.hook_log()
        assert cluster.drained() == []
        with _config_edit(cluster, 'failure_policy = "open"', 'failure_policy = "closed"'):
            jid2 = cluster.sbatch("-N1", "-w", "n2", "--snapshot-volumes=scratch", "-o", "/dev/null",
                                  "--wrap", "srun /bin/true")
            # PrologSlurmctld records; the node Prolog fails on the missing tool and,
            # closed, exits 1: Slurm does not run the job.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                j = cluster.job(jid2)
                if j is None or j.state != "RUNNING" and (j.reason not in ("None", "Priority", "Resources")):
                    break
                time.sleep(0.5)
            j = cluster.job(jid2)
            assert j is not None and j.state != "COMPLETED", j
            cluster.cancel(jid2)
            # A closed Prolog failure drains the node (Slurm's rule). Wait for
            # the drain before giving the node back: a resume that lands first
            # is undone by it, and the next test finds n2 drained.
            _wait(lambda: any(ln.startswith("n2 ") for ln in cluster.drained()), 30,
                   lambda: f"n2 was not drained by the closed Prolog failure: {cluster.drained()}")
    cluster.run(["scontrol", "update", "nodename=n2", "state=resume"], timeout=30, host="ctl")
    _wait(lambda: cluster.drained() == [], 30, lambda: f"nodes still drained after resume: {cluster.drained()}")


def test_doctor_all_well_then_names_problems(cluster):
    def doctor():   # the admin's view, on ctl
        return cluster.cli("doctor", host="ctl", timeout=120)

    def grace(seconds):
        cluster.run(["scontrol", "update", "partitionname=low", f"gracetime={seconds}"], timeout=30, check=True,
                    host="ctl")

    # Earlier tests of this session preempted jobs under load and injected
    # faults: doctor sizes GraceTime from those checkpoints too. All well is
    # "a GraceTime with room for them", whatever they took.
    grace(300)
    try:
        ok = doctor()
    finally:
        grace(cluster.env.get("SLURM_SNAP_GRACE", "10"))
    # The live setup against SECURITY.md: the service's port, the trusted
    # files' owners and modes pass on the dev cluster. While its node-local
    # classes still reach the nodes over SSH as root, doctor says so, and
    # that is the only problem.
    fails = [ln for ln in ok.stdout.splitlines() if ln.startswith("FAIL")]
    cfg = _cfg(cluster)
    ssh_root = cfg.ssh.user == "root" and any(vc.transport == "ssh" for vc in cfg.volume_classes)
    assert fails == ([ln for ln in fails if "logs in as 'root'" in ln] if ssh_root else []), ok.stdout + ok.stderr
    assert len(fails) == (1 if ssh_root else 0) and ok.returncode == (3 if ssh_root else 0), ok.stdout
    assert f"ok    slurm-snap service port {cfg.service.listen.rsplit(':', 1)[1]} is none of Slurm's" in ok.stdout
    assert f"ok    configuration {cluster.config}: owner root" in ok.stdout, ok.stdout
    # Every node's own scratch disk is checked, on that node; ctl's root disk is not.
    for node in cluster.nodes:
        assert f"{node}: volume class scratch on this host" in ok.stdout, ok.stdout
    assert "\nok    volume class scratch on this host" not in ok.stdout, ok.stdout
    grace(1)
    try:
        bad = doctor()
    finally:
        grace(cluster.env.get("SLURM_SNAP_GRACE", "10"))
    assert bad.returncode == 3
    assert "FAIL  partition low: GraceTime 1 s" in bad.stdout and "raise GraceTime of low" in bad.stdout


def _slurm_config_on_ctl(slurm_conf: str):
    from slurm_snap.slurm import commands

    os.environ["SLURM_CONF"] = slurm_conf
    return commands.show_config(), commands.show_partitions()


def test_doctor_detects_missing_user_signal_in_real_config(cluster):
    """The same check on the running Slurm's own output, with the setting taken out."""
    from slurm_snap.doctor import slurm_checks
    from slurm_snap.slurm.version import SlurmVersion

    conf, parts = cluster.on("ctl", _slurm_config_on_ctl, cluster.slurm_conf)
    cfg = _cfg(cluster)
    assert all(f.ok for f in slurm_checks.check_slurm(cfg, conf, parts, "required /x/slurm_snap.so"))
    # The running version's spelling (22.05: SlurmctldParameters, 24.11: PreemptParameters).
    key, value = SlurmVersion.parse(conf["SLURM_VERSION"]).preempt_signal_setting
    assert value in conf[key]
    conf[key] = conf[key].replace(value, "")
    conf["PrologFlags"] = "(null)"
    bad = [f for f in slurm_checks.check_slurm(cfg, conf, parts, "") if not f.ok]
    whats = " | ".join(f.what for f in bad)
    assert "user's signal is sent at preemption" in whats and "PrologFlags" in whats and "plugstack" in whats
    assert any(f"{key}={value}" in f.fix for f in bad)
