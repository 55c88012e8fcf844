"""The dev cluster itself (hosts ctl, n1..n3, login in their own network and
mount namespaces) and Slurm's preemption path slurm-snap relies on.

Preemption timings come from Slurm's timers (low partition GraceTime=10,
KillWait=2, cred_expire=5): about 30-40 s for preempt -> requeue -> restart.
Both preemption scenarios share one preemptor so the module stays fast.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster import (loops_backed_by, mounts_under, namespace_inodes, netns_named, new_state_dir, pid_alive,
                     processes_in, processes_using, remove_state_dir, root_links_named, start_cluster)
from testkit.cluster import REPO, Cluster, ClusterError, layout, run_dev_cluster
from slurm_snap.slurm import hooknames

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


def _mount_table() -> dict[str, tuple[str, str]]:
    """mount point -> (fstype, source) in the calling process's mount namespace."""
    out = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        out[fields[4]] = (fields[sep + 1], fields[sep + 2])
    return out


def test_filesystems_are_set_up_in_the_machine_room(cluster):
    mounts = _mount_table()
    for node in cluster.nodes:
        assert mounts[str(cluster.disk(node, "scratch"))][0] == "btrfs"
        assert mounts[str(cluster.disk(node, "xscratch"))][0] == "xfs"
    assert mounts[str(cluster.pfs)][0] == "btrfs"
    assert mounts[str(cluster.xfs)][0] == "xfs"
    devices = [mounts[str(cluster.disk(n, fs))][1] for n in cluster.nodes for fs in ("scratch", "xscratch")]
    assert len(set(devices)) == 6, devices  # every node's disks are its own
    barriers = cluster.pfs / ".slurm-snap" / "barriers"
    assert barriers.is_dir() and barriers.stat().st_uid == 0 and barriers.stat().st_mode & 0o777 == 0o755
    assert (cluster.pfs / "users").stat().st_mode & 0o7777 == 0o1777


def _host_view(state: str):
    """What a host sees: its mounts under STATE, the machine room's trees, its own files."""
    table = _mount_table()
    return {"mounts": {k: v for k, v in table.items() if k.startswith(state + "/")},
            "devs": {rel: os.stat(f"{state}/{rel}").st_dev for rel in ("mnt/scratch", "mnt/xscratch", "mnt/pfs")},
            "hidden": {d: os.listdir(f"{state}/{d}") for d in ("disks", "hosts", "img")},
            "local": sorted(os.listdir(f"{state}/local")),
            "loops": sorted(v[1] for v in table.values() if v[1].startswith("/dev/loop"))}


def test_each_node_sees_only_its_own_disks_and_its_own_tree(cluster):
    state = str(cluster.state)
    pfs_dev = os.stat(cluster.pfs).st_dev
    table = _mount_table()
    root_loops = {n: {table[str(cluster.disk(n, fs))][1] for fs in ("scratch", "xscratch")} for n in cluster.nodes}
    for host in cluster.hosts:
        view = cluster.on(host, _host_view, state)
        # The machine room's trees are empty inside every host.
        assert view["hidden"] == {"disks": [], "hosts": [], "img": []}, (host, view["hidden"])
        assert view["devs"]["mnt/pfs"] == pfs_dev
        if host in cluster.nodes:
            # STATE/mnt/scratch and xscratch are this node's own disks, nobody else's.
            assert view["devs"]["mnt/scratch"] == os.stat(cluster.disk(host, "scratch")).st_dev, host
            assert view["devs"]["mnt/xscratch"] == os.stat(cluster.disk(host, "xscratch")).st_dev, host
            assert view["mounts"][f"{state}/mnt/scratch"][0] == "btrfs"
            others = set().union(*(root_loops[n] for n in cluster.nodes if n != host))
            assert not others & set(view["loops"]), (host, view["loops"])
            assert {"slurmd.log", "sshd.log"} <= set(os.listdir(cluster.host_dir(host) / "log"))
        else:
            # ctl and login have no scratch at all.
            assert f"{state}/mnt/scratch" not in view["mounts"], host
            assert view["devs"]["mnt/scratch"] == os.stat(cluster.state / "mnt").st_dev
        assert view["local"] == sorted(os.listdir(cluster.host_dir(host))), host
    # Per-host private state: slurmctld's state and the SSH client key exist on ctl only.
    assert (cluster.host_dir("ctl") / "state").is_dir()
    for host in cluster.hosts:
        if host != "ctl":
            assert not (cluster.host_dir(host) / "state").exists(), host
            assert not (cluster.host_dir(host) / "etc" / "ssh" / "id_ed25519").exists(), host
            assert "[ssh]" not in cluster.config_path(host).read_text(), host
    assert "[ssh.addresses]" in cluster.config_path("ctl").read_text()


def test_hosts_talk_over_their_own_addresses_and_ssh_verifies_host_keys(cluster):
    ssh = ["ssh", "-F", "/dev/null", "-i", cluster.env["SLURM_SNAP_SSH_KEY"], "-o", "BatchMode=yes",
           "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5"]
    table = _mount_table()
    for node in cluster.nodes:
        # From ctl, with the known_hosts dev-cluster wrote: the node's own sshd on
        # its own address, and behind it the node's own scratch disk.
        proc = cluster.run([*ssh, "-o", f"UserKnownHostsFile={cluster.env['SLURM_SNAP_KNOWN_HOSTS']}",
                            f"root@{cluster.addr(node)}", "findmnt", "-n", "-o", "SOURCE", str(cluster.scratch)],
                           host="ctl", timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [table[str(cluster.disk(node))][1]], (node, proc.stdout)
        # An unknown host key is refused.
        empty = cluster.run([*ssh, "-o", "UserKnownHostsFile=/dev/null", f"root@{cluster.addr(node)}", "true"],
                            host="ctl", timeout=30)
        assert empty.returncode != 0 and "Host key verification failed" in empty.stderr, empty.stderr
    # The machine room has no interface or address on the cluster's network.
    assert root_links_named(cluster.env["SLURM_SNAP_NETNS_TAG"]) == []
    subnet = cluster.addr("ctl").rsplit(".", 1)[0] + "."
    assert subnet not in subprocess.run(["/usr/sbin/ip", "-4", "addr"], capture_output=True, text=True).stdout


def test_status_lists_hosts_daemons_mounts_and_sshd(cluster):
    proc = run_dev_cluster("status", cluster.state, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pids = cluster.pids()
    assert f"slurmctld pid {pids['slurmctld']}" in proc.stdout
    for node in cluster.nodes:
        assert f"slurmd {node} pid {pids[f'slurmd-{node}']}" in proc.stdout
        assert f"sshd {node} pid {pids[f'sshd-{node}']} on {cluster.addr(node)}:22" in proc.stdout
    for host in cluster.hosts:
        assert f"host {host} {cluster.addr(host)}: netns {cluster.env['SLURM_SNAP_NETNS_TAG']}-{host}" in proc.stdout
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

# entry point -> the hook it runs in the foreground, from the one table of names
ENTRY_POINTS = {hooknames.ENTRY_POINTS[hooknames.SLURM_KEY[h]]: h for h in hooknames.LISTED}
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


def test_background_recording_survives_slurmctld_killing_the_hooks_process_group(tmp_path):
    """slurmctld SIGKILLs a PrologSlurmctld's process group when the script
    exits; the detached recorder must already be in its own session by then
    (the load test lost a recording now and then before the entry point
    waited for that)."""
    lost = []
    for i in range(20):
        d = tmp_path / str(i)
        d.mkdir()
        helper = d / "helper"
        helper.write_text(RECORDER)
        helper.chmod(0o755)
        script = install_entry_point("prolog/slurm-snap-prolog-slurmctld", d, str(helper), "/x.toml", "background")
        proc = subprocess.Popen([str(script)], env={"SPANK_SLURM_SNAP": "1", "SLURM_JOB_ID": "7"},
                                stdin=subprocess.DEVNULL, start_new_session=True)
        assert proc.wait(timeout=10) == 0
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # what slurmctld does right after
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while not Path(f"{helper}.argv").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not Path(f"{helper}.argv").exists():
            lost.append(i)
    assert lost == []


def test_entry_point_fails_open_without_helper(tmp_path):
    script = install_entry_point("prolog/slurm-snap-prolog", tmp_path, "/nonexistent/slurm-snap", "/x.toml")
    proc = subprocess.run([str(script)], env={"SPANK_SLURM_SNAP": "1"}, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0
    assert "slurm-snap: helper /nonexistent/slurm-snap missing" in proc.stderr


def test_cluster_hooks_are_installed_with_absolute_paths(cluster):
    conf = Path(cluster.slurm_conf).read_text()
    for rel, hook in ENTRY_POINTS.items():
        key = hooknames.SLURM_KEY[hook]
        installed = cluster.state / "libexec" / Path(rel).name
        assert re.search(rf"^{key}={re.escape(str(installed))}$", conf, re.M), key
        text = installed.read_text()
        assert f"HELPER={cluster.env['SLURM_SNAP_HELPER']}\n" in text
        assert f"CONFIG={cluster.env['SLURM_SNAP_CONFIG']}\n" in text
        if hook == "prolog-slurmctld":  # the dev config: policy open, record_in_background on
            assert "\nRECORD=background\n" in text
    # The same config path on every host, each host's own file behind it.
    for host in cluster.hosts:
        assert cluster.on(host, Path(cluster.config).read_text) == cluster.config_path(host).read_text(), host
    texts = {h: cluster.config_path(h).read_text() for h in cluster.hosts}
    assert len(set(texts.values())) == 5
    # The nodes' settings are the same but for [node] name, each its own Slurm
    # node name (its agent's node tasks); only their comments name the host.
    settings = {n: [ln for ln in texts[n].splitlines() if not ln.startswith("#")] for n in cluster.nodes}
    for n in cluster.nodes:
        names = [i for i, ln in enumerate(settings[n]) if ln.startswith("name = ") and settings[n][i - 1] == "[node]"]
        assert len(names) == 1 and settings[n][names[0]] == f'name = "{n}"', (n, settings[n])
        del settings[n][names[0]]
    assert settings["n1"] == settings["n2"] == settings["n3"]
    assert all(f"host {h} of the dev cluster" in texts[h] for h in cluster.hosts)


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

def _recorded_volumes(repo, job_id: int):
    run = repo.find_job_run(job_id)
    return None if run is None else sorted((v.volume_class, v.node) for v in repo.volumes(run))


def _read_as_node(config: str, job_id: int):
    """The inventory as a node reaches it: its own config (the service on ctl,
    no database URL), over the cluster's network, MUNGE-authenticated as root."""
    from slurm_snap.config import load
    from slurm_snap.service.client import call, ping

    cfg = load(config)
    return cfg.inventory.url.split("://")[0], ping(cfg), call(cfg, "resume-point", job_id=job_id)


def assert_nothing_left(state: Path, tag: str, inodes: set[str], pids: dict[str, int], *,
                        kept: bool = False) -> None:
    assert [name for name, pid in pids.items() if pid_alive(pid)] == []
    assert processes_in(inodes) == []
    assert mounts_under(state) == []
    assert loops_backed_by(state) == []
    assert processes_using(state) == []
    assert netns_named(tag) == []
    assert root_links_named(tag) == []
    # `down` removes the state dir itself (its loop images above all: a next
    # `up` must not reuse full disks) unless asked to keep it (issue 21 item 8).
    assert state.exists() == kept


def test_second_cluster_side_by_side_on_mariadb_and_down_leaves_nothing(cluster):
    state = new_state_dir("slurm-snap-it2-")
    second = None
    try:
        second = start_cluster(state, "--inventory", "mariadb")
        tag = second.env["SLURM_SNAP_NETNS_TAG"]
        assert tag != cluster.env["SLURM_SNAP_NETNS_TAG"]
        assert second.addr("ctl") != cluster.addr("ctl")
        assert not set(namespace_inodes(second)) & set(namespace_inodes(cluster))
        # Both answer at the same time.
        assert node_names_from_srun(second) == ["n1", "n2", "n3"]
        assert node_names_from_srun(cluster) == ["n1", "n2", "n3"]
        # MariaDB on ctl: PrologSlurmctld records there, and a node reaches it
        # through the service with nothing but its own config.
        jid = second.sbatch("-N3", "--snapshot-volumes=scratch,pfs", "-o", "/dev/null", "--wrap", "srun /bin/true")
        second.wait_state(jid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
        want = [("pfs", ""), ("scratch", "n1"), ("scratch", "n2"), ("scratch", "n3")]
        deadline = time.monotonic() + 30
        while second.inventory(_recorded_volumes, jid) != want:
            assert time.monotonic() < deadline, f"job {jid} not recorded:\n{second.hook_log()[-3000:]}"
            time.sleep(0.3)
        assert second.on("n2", _read_as_node, second.config, jid) == ("slurm-snap", 0, None)
        assert "mysql" in second.config_path("ctl").read_text()
        # A user on login reads their job's sets (none) from MariaDB through the service.
        rep = second.cli("report", "-j", str(jid), "--json", host="login", user=second.user, timeout=60)
        assert rep.returncode == 0 and json.loads(rep.stdout)["sets"] == [], rep.stderr
        # A job left running must not keep `down` from cleaning up.
        second.sbatch("-N1", "-o", "/dev/null", "--wrap", "sleep 300")
        pids = second.pids()
        assert {"slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3", "sshd-n1", "sshd-n2", "sshd-n3"} <= set(pids)
        pids["mariadbd"] = int((second.host_dir("ctl") / "mariadb" / "mariadbd.pid").read_text())
        assert pid_alive(pids["mariadbd"])
        inodes = namespace_inodes(second)
        assert len(inodes) == 11 and processes_in(inodes)   # 6 net + 5 mount namespaces, all in use

        proc = second.down()
        assert proc.returncode == 0, proc.stderr
        second = None
        assert_nothing_left(state, tag, inodes, pids)
        # The first cluster (and the shared munged) keep working.
        assert node_names_from_srun(cluster) == ["n1", "n2", "n3"]
    finally:
        if second is not None:
            second.down()
        remove_state_dir(state)


def test_a_cluster_that_failed_half_way_up_comes_down_cleanly(cluster):
    """`up` dies after the namespaces, disks, sshd and the database are up (the
    SPANK plugin cannot be built: STATE/build is a file); `down` removes it all."""
    state = new_state_dir("slurm-snap-it3-")
    try:
        (state / "build").write_text("not a directory\n")
        proc = run_dev_cluster("up", state, "--inventory", "postgres", timeout=600)
        assert proc.returncode != 0 and "building the SPANK plugin failed" in proc.stderr, proc.stderr[-2000:]
        assert not (state / "env").exists()   # up never got that far: dev-cluster still names its layout
        half = Cluster(state=state, env=layout(state))
        tag = half.env["SLURM_SNAP_NETNS_TAG"]
        assert tag == "ss" + hashlib.sha256(str(state).encode()).hexdigest()[:6]
        inodes = namespace_inodes(half)
        pids = {str(p.relative_to(state / "hosts")): int(p.read_text().split()[0])
                for p in list(state.glob("hosts/*/run/*.pid")) + list(state.glob("hosts/ctl/pg/data/postmaster.pid"))}
        # It really was half up: namespaces with sshd and PostgreSQL in them, disks mounted.
        assert len(netns_named(tag)) == 6 and len(inodes) == 11
        assert {"n1/run/sshd.pid", "ctl/pg/data/postmaster.pid"} <= set(pids) and all(pid_alive(p) for p in pids.values())
        assert len(mounts_under(state)) >= 8 and loops_backed_by(state)

        down = run_dev_cluster("down", state, "--keep-state", timeout=300)
        assert down.returncode == 0, down.stderr
        assert_nothing_left(state, tag, inodes, pids, kept=True)
        # kept: its logs can be read, its images sit unattached
        assert (state / "log" / "spank-build.log").exists() and list((state / "img").glob("*.img"))
        assert node_names_from_srun(cluster) == ["n1", "n2", "n3"]
        # a later plain `down` of the kept, stopped cluster removes it
        down = run_dev_cluster("down", state, timeout=300)
        assert down.returncode == 0, down.stderr
        assert not state.exists()
    finally:
        if state.exists():
            run_dev_cluster("down", state, timeout=300)
        remove_state_dir(state)
