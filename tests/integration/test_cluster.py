"""The dev cluster itself and Slurm's preemption path slurm-snap relies on.

Preemption timings come from Slurm's timers (low partition GraceTime=10,
KillWait=2, cred_expire=5): about 30-40 s for preempt -> requeue -> restart.
Both preemption scenarios share one preemptor so the module stays fast.
"""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster import (REPO, Cluster, ClusterError, loops_backed_by, mounts_under, new_state_dir, pid_alive,
                     processes_using, remove_state_dir, run_dev_cluster, start_cluster)

pytestmark = pytest.mark.integration

# One rank: records its start and every SIGUSR1 in files on the shared pfs,
# named by node and restart count. `sleep & wait` lets bash run the trap at once.
RANK_SCRIPT = """#!/bin/bash
out=$1
run=${SLURM_RESTART_COUNT:-0}
trap 'date +%s.%N > "$out/usr1.$SLURMD_NODENAME.$run"' USR1
echo "$SLURM_JOB_ID" > "$out/start.$SLURMD_NODENAME.$run"
while :; do sleep 1 & wait $!; done
"""

BATCH_SCRIPT = """#!/bin/bash
srun {rank} {out}
"""


def node_names_from_srun(cluster: Cluster, user: str | None = None) -> list[str]:
    proc = cluster.run(["srun", "-N3", "--ntasks-per-node=1", "/bin/sh", "-c", "echo $SLURMD_NODENAME"],
                       user=user if user is not None else cluster.user,
                       cwd=cluster.user_dir(user=user or cluster.user), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return sorted(proc.stdout.split())


def test_three_node_job_as_test_user(cluster):
    assert node_names_from_srun(cluster) == ["n1", "n2", "n3"]


def test_filesystems_and_sshd_are_set_up(cluster):
    mounts = mounts_under(cluster.state / "mnt")
    expected = {str(cluster.state / "mnt" / p) for p in ("scratch/n1", "scratch/n2", "scratch/n3", "pfs", "xfs")}
    assert expected <= set(mounts)
    fstypes = {line.split()[1]: line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()}
    assert fstypes[str(cluster.state / "mnt" / "pfs")] == "btrfs"
    assert fstypes[str(cluster.state / "mnt" / "xfs")] == "xfs"
    barriers = cluster.pfs / ".slurm-snap" / "barriers"
    assert barriers.is_dir() and barriers.stat().st_uid == 0 and barriers.stat().st_mode & 0o777 == 0o755
    assert (cluster.pfs / "users").stat().st_mode & 0o7777 == 0o1777
    # Key auth works with the files dev-cluster hands out.
    import subprocess
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", cluster.env["SLURM_SNAP_SSH_KEY"], "-p", cluster.env["SLURM_SNAP_SSH_PORT"],
         "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={cluster.env['SLURM_SNAP_KNOWN_HOSTS']}", "root@127.0.0.1", "echo", "ok"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_status_lists_daemons_mounts_and_sshd(cluster):
    proc = run_dev_cluster("status", cluster.state, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pids = cluster.pids()
    assert f"slurmctld pid {pids['slurmctld']}" in proc.stdout
    for node in cluster.nodes:
        assert f"slurmd {node} pid {pids[f'slurmd-{node}']}" in proc.stdout
    assert f"sshd pid {pids['sshd']} on 127.0.0.1:{cluster.env['SLURM_SNAP_SSH_PORT']}" in proc.stdout
    assert f"on {cluster.pfs}" in proc.stdout


def test_up_twice_is_harmless(cluster):
    before = cluster.pids()
    proc = run_dev_cluster("up", cluster.state, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "already up" in proc.stderr
    assert cluster.pids() == before
    assert all(pid_alive(pid) for pid in before.values())
    assert node_names_from_srun(cluster) == ["n1", "n2", "n3"]


# --- hook entry points ----------------------------------------------------

ENTRY_POINTS = {
    "prolog/slurm-snap-prolog": "prolog",
    "prolog/slurm-snap-prolog-slurmctld": "prolog-slurmctld",
    "epilog/slurm-snap-epilog": "epilog",
    "epilog/slurm-snap-epilog-slurmctld": "epilog-slurmctld",
}
# PrologSlurmctld's entry point as installed: RECORD=background (the default)
# hands the recording to a detached helper; foreground runs the hook itself.
CASES = [(rel, hook, None) for rel, hook in sorted(ENTRY_POINTS.items()) if hook != "prolog-slurmctld"] + [
    ("prolog/slurm-snap-prolog-slurmctld", "prolog-slurmctld-record", "background"),
    ("prolog/slurm-snap-prolog-slurmctld", "prolog-slurmctld", "foreground"),
]

# Stands in for the helper: records its argv and what its stdin is.
RECORDER = """#!/bin/sh
printf '%s\\n' "$@" > "$0.argv"
/usr/bin/readlink /proc/self/fd/0 > "$0.stdin"
"""


def install_entry_point(rel: str, dest: Path, helper: str, config: str, record: str | None = None) -> Path:
    """The install step etc/README.md gives admins: copy, rewrite HELPER=, CONFIG= (and RECORD=)."""
    text = (REPO / rel).read_text()
    text = re.sub(r"^HELPER=.*$", f"HELPER={helper}", text, flags=re.M)
    text = re.sub(r"^CONFIG=.*$", f"CONFIG={config}", text, flags=re.M)
    if record:
        text, n = re.subn(r"^RECORD=.*$", f"RECORD={record}", text, flags=re.M)
        assert n == 1, rel
    path = dest / Path(rel).name
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("rel, hook, record", CASES)
def test_entry_point_execs_helper_only_for_opted_in_jobs(tmp_path, rel, hook, record):
    helper = tmp_path / "helper"
    helper.write_text(RECORDER)
    helper.chmod(0o755)
    script = install_entry_point(rel, tmp_path, str(helper), "/site/slurm-snap.toml", record)
    # Hooks run without PATH: the script must not need one.
    quiet = subprocess.run([str(script)], env={"SLURM_JOB_ID": "7"}, capture_output=True, timeout=10)
    time.sleep(0.3 if record == "background" else 0)   # a detached helper, had one started, would have run
    assert quiet.returncode == 0 and not Path(f"{helper}.argv").exists()
    opted = subprocess.run([str(script)], env={"SPANK_SLURM_SNAP": "1", "SLURM_JOB_ID": "7"},
                           stdin=subprocess.PIPE, capture_output=True, timeout=10)
    assert opted.returncode == 0, opted.stderr
    deadline = time.monotonic() + 10   # background: the helper runs after the entry point exited
    while not Path(f"{helper}.stdin").exists() or not Path(f"{helper}.stdin").read_text():
        assert time.monotonic() < deadline, "helper never ran"
        time.sleep(0.05)
    assert Path(f"{helper}.argv").read_text().split("\n")[:4] == ["--config", "/site/slurm-snap.toml", "hook", hook]
    assert Path(f"{helper}.stdin").read_text().strip() == "/dev/null"


def test_entry_point_fails_open_without_helper(tmp_path):
    script = install_entry_point("prolog/slurm-snap-prolog", tmp_path, "/nonexistent/slurm-snap", "/x.toml")
    proc = subprocess.run([str(script)], env={"SPANK_SLURM_SNAP": "1"}, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0
    assert "slurm-snap: helper /nonexistent/slurm-snap missing" in proc.stderr


def test_cluster_hooks_are_installed_with_absolute_paths(cluster):
    conf = Path(cluster.slurm_conf).read_text()
    for rel, hook in ENTRY_POINTS.items():
        key = {"prolog": "Prolog", "epilog": "Epilog", "prolog-slurmctld": "PrologSlurmctld",
               "epilog-slurmctld": "EpilogSlurmctld"}[hook]
        installed = cluster.state / "libexec" / Path(rel).name
        assert re.search(rf"^{key}={re.escape(str(installed))}$", conf, re.M), key
        text = installed.read_text()
        assert f"HELPER={cluster.env['SLURM_SNAP_HELPER']}\n" in text
        assert f"CONFIG={cluster.env['SLURM_SNAP_CONFIG']}\n" in text
        if hook == "prolog-slurmctld":  # the dev config: policy open, record_in_background on
            assert "\nRECORD=background\n" in text


# --- preemption ---------------------------------------------------------

@dataclass
class PreemptRun:
    out: dict[str, Path] = field(default_factory=dict)
    job_id: dict[str, int] = field(default_factory=dict)
    submit_error: dict[str, str] = field(default_factory=dict)
    preemptor: int | None = None


def wait_files(paths: list[Path], timeout: float, what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            missing = [p.name for p in paths if not p.exists()]
            raise AssertionError(f"{what}: missing {missing} after {timeout:.0f} s; "
                                 f"jobs: {cluster.jobs()}\nslurmctld log tail:\n{cluster.daemon_log()[-2000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="class")
def preempted(cluster):
    """Two 3-node jobs on `low`, one with --signal=USR1@10, one with only
    --snapshot-on-preempt (cli_filter adds the signal); one preemptor for both."""
    run = PreemptRun()
    rank = cluster.write_user_file("rank-usr1.sh", RANK_SCRIPT, mode=0o755)
    variants = {"signal": ["--signal=USR1@10"], "snapshot": ["--snapshot-on-preempt"]}
    for name, extra in variants.items():
        out = cluster.make_user_dir(f"preempt-{name}-{time.monotonic_ns()}")
        run.out[name] = out
        try:
            run.job_id[name] = cluster.sbatch(
                "-p", "low", "-N3", "--ntasks-per-node=1", "-c1", "--requeue", "-J", f"preempt-{name}",
                "-o", f"{out}/slurm-%j.out", *extra,
                script=BATCH_SCRIPT.format(rank=rank, out=out))
        except ClusterError as exc:
            run.submit_error[name] = str(exc)
    try:
        for name in list(run.job_id):
            # A job that does not start (e.g. its Prolog fails) is reported by
            # its own test; the other scenario still runs.
            try:
                wait_files([run.out[name] / f"start.{node}.0" for node in cluster.nodes], 60,
                           f"{name}: ranks of the first run started", cluster)
            except AssertionError as exc:
                run.submit_error[name] = f"{exc}\nhook log:\n{cluster.hook_log()[-3000:]}"
                cluster.cancel(run.job_id.pop(name))
        if run.job_id:
            run.preemptor = cluster.preempt(nodes=3)
        yield run
    finally:
        cluster.cancel(*run.job_id.values(), *([run.preemptor] if run.preemptor else []))


def check_preempt_signal_and_requeue(cluster: Cluster, run: PreemptRun, name: str) -> None:
    assert name not in run.submit_error, run.submit_error.get(name)
    job_id, out = run.job_id[name], run.out[name]
    # SIGUSR1 at preemption on every node (grace is 10 s, the signal comes at once).
    wait_files([out / f"usr1.{node}.0" for node in cluster.nodes], 30, f"{name}: SIGUSR1 in first run", cluster)
    # Requeued under the same id, restarted with SLURM_RESTART_COUNT=1 on all nodes.
    wait_files([out / f"start.{node}.1" for node in cluster.nodes], 90, f"{name}: second run started", cluster)
    assert {(out / f"start.{node}.1").read_text().strip() for node in cluster.nodes} == {str(job_id)}
    job = cluster.job(job_id)
    # preempt_time is cleared when the requeued run starts; restart_cnt stays.
    assert job is not None and job.restart_count == 1, job


class TestPreemption:
    """Class scope: the preempted jobs are cancelled before later tests need the nodes."""

    def test_preemption_signals_all_ranks_then_requeues(self, cluster, preempted):
        check_preempt_signal_and_requeue(cluster, preempted, "signal")

    def test_snapshot_on_preempt_alone_gets_the_signal(self, cluster, preempted):
        """cli_filter.lua turns --snapshot-on-preempt into --signal=USR1@GRACE."""
        check_preempt_signal_and_requeue(cluster, preempted, "snapshot")


# --- a second cluster side by side, then down ------------------------------

def test_second_cluster_side_by_side_and_down_leaves_nothing(cluster):
    state = new_state_dir("slurm-snap-it2-")
    second = None
    try:
        second = start_cluster(state)
        port = re.search(r"^SlurmctldPort=(\d+)", Path(second.slurm_conf).read_text(), re.M).group(1)
        first_port = re.search(r"^SlurmctldPort=(\d+)", Path(cluster.slurm_conf).read_text(), re.M).group(1)
        assert port != first_port
        assert second.env["SLURM_SNAP_SSH_PORT"] != cluster.env["SLURM_SNAP_SSH_PORT"]
        # Both answer at the same time.
        assert node_names_from_srun(second) == ["n1", "n2", "n3"]
        assert node_names_from_srun(cluster) == ["n1", "n2", "n3"]
        # A job left running must not keep `down` from cleaning up.
        second.sbatch("-N1", "-o", "/dev/null", "--wrap", "sleep 300")
        pids = second.pids()
        assert {"slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3", "sshd"} <= set(pids)

        proc = second.down()
        assert proc.returncode == 0, proc.stderr
        second = None
        assert [name for name, pid in pids.items() if pid_alive(pid)] == []
        assert mounts_under(state) == []
        assert loops_backed_by(state) == []
        assert processes_using(state) == []
        # The first cluster (and the shared munged) keep working.
        assert node_names_from_srun(cluster) == ["n1", "n2", "n3"]
    finally:
        if second is not None:
            second.down()
        remove_state_dir(state)
