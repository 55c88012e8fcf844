"""Issue 4 acceptance on the dev cluster: the hooks record every declared
volume on every node, prepare the node-local subvolumes with the right owner,
leave no trace for jobs that did not opt in, and never drain a node."""
from __future__ import annotations

import contextlib
import os
import pwd
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def _inventory(cluster):
    from slurm_snap.config import load
    from slurm_snap.inventory.repository import Inventory

    cfg = load(cluster.env["SLURM_SNAP_CONFIG"])
    inv = Inventory.from_config(cfg)
    inv.upgrade()
    return cfg, inv


def _wait_done(cluster, job_id, timeout=60):
    cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=timeout)


@contextlib.contextmanager
def _config_edit(cluster, old: str, new: str):
    """Temporarily change the cluster's slurm-snap.toml (hooks read it on every run)."""
    path = Path(cluster.env["SLURM_SNAP_CONFIG"])
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    try:
        yield
    finally:
        path.write_text(text)


def _drained(cluster) -> list[str]:
    out = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout.split("\n")
    return [ln for ln in out if ln.strip() and ln.split()[1].startswith(("drain", "drng", "down"))]


def _wait_recorded(inv, jid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with inv.session() as repo:
            if repo.find_job_run(jid) is not None:
                return
        assert time.monotonic() < deadline, f"job {jid} not recorded within {timeout:g} s"
        time.sleep(0.1)


def test_opted_in_job_records_every_volume_on_every_node(cluster):
    cfg, inv = _inventory(cluster)
    jid = cluster.sbatch("-N3", "--snapshot-volumes=scratch,pfs", "-o", "/dev/null",
                         "--wrap", "srun /bin/true")
    _wait_done(cluster, jid)
    _wait_recorded(inv, jid)   # PrologSlurmctld records in the background (the default)
    with inv.session() as repo:
        run = repo.job_run(jid)
        vols = repo.volumes(run)
        assert sorted(run.nodes) == ["n1", "n2", "n3"]
        assert run.user_name == cluster.user
        got = sorted((v.volume_class, v.node) for v in vols)
        assert got == [("pfs", ""), ("scratch", "n1"), ("scratch", "n2"), ("scratch", "n3")]
    uid = pwd.getpwnam(cluster.user).pw_uid
    for v in vols:
        st = os.stat(v.path)
        assert st.st_uid == uid, v.path
        # A btrfs subvolume's root inode is 256: it can be snapshotted on its own.
        assert st.st_ino == 256, f"{v.path} is not a subvolume"
    jd = Path(cfg.paths.barrier_dir) / str(jid)
    assert (jd / "job.json").exists()
    assert os.stat(jd / "ack").st_uid == uid and (os.stat(jd / "ack").st_mode & 0o077) == 0


def test_job_without_options_leaves_no_trace(cluster):
    cfg, inv = _inventory(cluster)
    jid = cluster.sbatch("-N3", "-o", "/dev/null", "--wrap", "srun /bin/true")
    _wait_done(cluster, jid)
    with inv.session() as repo:
        assert repo.find_job_run(jid) is None
    assert not (Path(cfg.paths.barrier_dir) / str(jid)).exists()
    assert f'"job_id": {jid},' not in cluster.hook_log()


def test_inventory_unreachable_hooks_exit_0_and_node_stays_up(cluster):
    with _config_edit(cluster, 'url = "sqlite:///', 'url = "postgresql+psycopg2://nobody@127.0.0.1:1/none"\n#'):
        jid = cluster.sbatch("-N3", "--snapshot-volumes=scratch", "-o", "/dev/null", "--wrap", "srun /bin/true")
        _wait_done(cluster, jid)
    log = cluster.hook_log()
    assert f'"job_id": {jid}' in log and "127.0.0.1" in log
    assert _drained(cluster) == []
    # The job itself ran to completion: fail-open.
    assert cluster.job(jid) is None or cluster.job(jid).state == "COMPLETED"


def test_backend_tool_missing_open_then_closed(cluster):
    cfg, inv = _inventory(cluster)
    marker = 'backend = "btrfs"\ndefault = true\n'
    broken = marker + 'options = { tool_dir = "/nonexistent-tools" }\n'
    with _config_edit(cluster, marker, broken):
        jid = cluster.sbatch("-N3", "--snapshot-volumes=scratch", "-o", "/dev/null", "--wrap", "srun /bin/true")
        _wait_done(cluster, jid)
        assert "btrfs" in cluster.hook_log() and "not found" in cluster.hook_log()
        assert _drained(cluster) == []
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
    # A closed Prolog failure drains the node (Slurm's rule): give it back.
    cluster.run(["scontrol", "update", "nodename=n2", "state=resume"], timeout=30)
    time.sleep(1)


def test_doctor_all_well_then_names_problems(cluster):
    helper = cluster.env["SLURM_SNAP_HELPER"]
    env = ["/usr/bin/env", f"SLURM_CONF={cluster.slurm_conf}"]
    import subprocess

    def doctor():
        return subprocess.run([*env, helper, "--config", cluster.env["SLURM_SNAP_CONFIG"], "doctor"],
                              capture_output=True, text=True, timeout=120)

    ok = doctor()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 problem(s)" in ok.stdout
    cluster.run(["scontrol", "update", "partitionname=low", "gracetime=1"], timeout=30, check=True)
    try:
        bad = doctor()
    finally:
        cluster.run(["scontrol", "update", "partitionname=low",
                     f"gracetime={cluster.env.get('SLURM_SNAP_GRACE', '10')}"], timeout=30, check=True)
    assert bad.returncode == 3
    assert "FAIL  partition low: GraceTime 1 s" in bad.stdout and "raise GraceTime of low" in bad.stdout


def test_doctor_detects_missing_user_signal_in_real_config(cluster):
    """The same check on the running Slurm's own output, with the setting taken out."""
    from slurm_snap import doctor
    from slurm_snap.config import load
    from slurm_snap.slurm import commands

    os.environ["SLURM_CONF"] = cluster.slurm_conf
    try:
        conf = commands.show_config()
        parts = commands.show_partitions()
    finally:
        del os.environ["SLURM_CONF"]
    cfg = load(cluster.env["SLURM_SNAP_CONFIG"])
    assert all(f.ok for f in doctor.check_slurm(cfg, conf, parts, "required /x/slurm_snap.so"))
    conf["SlurmctldParameters"] = conf["SlurmctldParameters"].replace("preempt_send_user_signal", "")
    conf["PrologFlags"] = "(null)"
    bad = [f for f in doctor.check_slurm(cfg, conf, parts, "") if not f.ok]
    whats = " | ".join(f.what for f in bad)
    assert "user's signal is sent at preemption" in whats and "PrologFlags" in whats and "plugstack" in whats
    assert any("preempt_send_user_signal" in f.fix for f in bad)
