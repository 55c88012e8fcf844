"""Issue 31 on the multi-host dev cluster: users' programs never run on the
controller, and node-local work happens on the node, started by Slurm or by
the node's agent, never by SSH from the controller.

One full cycle of a 2-node job whose state is on each node's own scratch:
preemption (each node's Epilog cuts its part), partner copies (the nodes'
agents stream each part to the job's next node, MUNGE-authenticated), a
scheduled drill (the schedule runner submits it, on the nodes that hold the
copies, and collects it), an on-request drill on ctl, a drill through the
service from login, prune (the nodes' agents delete the parts and copies).
Meanwhile the machine room samples ctl's process table (every process in
ctl's network namespace) and the nodes' sshd logs. Shown: no process of the
job's user on ctl but sbatch (MUNGE must vouch for the uid that submits),
every drilled rank on a compute node reading its own rank's state, the
first step measured there, no SSH connection from ctl to any node.

The node agents' passes are run by the test (`slurm-snap node-tasks` on each
node) as the shipped timer would run them."""
from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

from testkit.inventory_helpers import restore_tests, sets_of_job

pytestmark = pytest.mark.integration

# Each rank writes which job node it is on and a step, into its node's own scratch.
WORKER = """import os, sys, time
d = os.path.join({scratch!r}, "jobs", os.environ["SLURM_JOB_ID"])
node = os.environ["SLURMD_NODENAME"]
step = 0
while True:
    step += 1
    with open(os.path.join(d, ".ckpt.tmp"), "w") as f:
        f.write(f"{{node}} {{step}}")
    os.replace(os.path.join(d, ".ckpt.tmp"), os.path.join(d, "ckpt"))
    print(f"step {{step}} on {{node}}", flush=True)
    time.sleep(0.2)
"""
# The drilled command: srun'd, one rank per drill node; each reads its rank's
# part from SLURM_SNAP_RESTORE_SCRATCH and says where it runs; rank 0 reports the first step.
RESUME = """import json, os, sys
clone = os.environ["SLURM_SNAP_RESTORE_SCRATCH"]
cut_on, step = open(os.path.join(clone, "ckpt")).read().split()
rank = int(os.environ.get("SLURM_PROCID", "0"))
info = {{"rank": rank, "node": os.environ.get("SLURMD_NODENAME"), "cut_on": cut_on, "step": int(step),
        "netns": os.readlink("/proc/self/ns/net"), "uid": os.getuid(), "clone": clone}}
mine = lambda r: os.path.join(sys.argv[1], f"{{os.environ['SLURM_SNAP_RESTORE_SET']}}-{{os.environ['SLURM_JOB_ID']}}-{{r}}.json")
with open(mine(rank) + ".tmp", "w") as f:
    json.dump(info, f)
os.rename(mine(rank) + ".tmp", mine(rank))
if rank == 0:
    # The drill ends at the first step rank 0 reports: wait for every rank's
    # record first, so the drill's end cannot cut a slower rank short.
    import time
    ranks = int(os.environ.get("SLURM_NTASKS", "1"))
    deadline = time.monotonic() + 60
    while not all(os.path.exists(mine(r)) for r in range(ranks)) and time.monotonic() < deadline:
        time.sleep(0.05)
    print(f"SLURM_SNAP_FIRST_STEP {{int(step) + 1}}", flush=True)
"""


class CtlSampler:
    """Every process in ctl's network namespace, sampled from /proc every 50 ms:
    the ones of `uid` seen (pid -> (executable, command line), the last seen:
    a child forked by root's slurm-snap is the user's from its setuid to its
    exec, so the exec'd program is the one that counts)."""

    def __init__(self, netns_path: str, uid: int):
        self.ns = f"net:[{os.stat(netns_path).st_ino}]"
        self.uid = str(uid)
        self.seen: dict[int, tuple[str, str]] = {}
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    if os.readlink(f"/proc/{pid}/ns/net") != self.ns:
                        continue
                    status = Path(f"/proc/{pid}/status").read_text()
                    uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
                    if uid == self.uid:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                        self.seen[int(pid)] = (os.readlink(f"/proc/{pid}/exe"), cmd.strip() or status.splitlines()[0])
                except (OSError, AttributeError):
                    continue
            self.samples += 1
            self.stop.wait(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def _set_of(repo, job_id):
    for st in sets_of_job(repo, job_id):
        if st.trigger == "preempt" and st.state not in ("PENDING", "QUIESCING", "CUTTING", "CUT"):
            return st.id, st.state, st.consistency, st.reason, sorted(p.node for p in repo.snapshots(st.id) if p.node)
    return None


def _state(repo, set_id):
    st = repo.get_set(set_id)
    tests = [(t.id, t.result, t.ran_on, t.queued_seconds, t.time_to_first_step, t.reason, t.slurm_job_id,
              [(n.node, n.state, n.cleanup) for n in t.nodes]) for t in restore_tests(repo, set_id)]
    copies = sorted((c.source_node, c.node, c.state, c.method, c.error) for c in repo.copies(set_id))
    tasks = [(t.node, t.kind, t.state, t.error) for t in repo.open_node_tasks(set_id=set_id)]
    parts = sorted((p.node, p.state, p.ref) for p in repo.snapshots(set_id, include_deleted=True) if p.node)
    return {"state": st.state, "tests": tests, "copies": copies, "open_tasks": tasks, "parts": parts}


def _sshd_log(cluster, node) -> str:
    path = cluster.host_dir(node) / "log" / "sshd.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _until(what, fn, timeout, interval=1.0):
    end = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < end, f"{what}: not within {timeout} s"
        time.sleep(interval)


def test_a_full_cycle_runs_no_user_program_on_ctl_and_no_ssh_from_ctl(cluster):
    import pwd

    uid = pwd.getpwnam(cluster.user).pw_uid
    out = cluster.make_user_dir(f"drilljobs-{time.monotonic_ns()}")
    os.chmod(out, 0o777)
    worker = cluster.write_user_file("drilljobs-worker.py", WORKER.format(scratch=str(cluster.scratch)))
    resume = cluster.write_user_file("drilljobs-resume.py", RESUME.format())
    resume_cmd = f"{cluster.slurm_bin}/srun {cluster.python} {resume} {out}"
    # The schedule runner of a site with partner copies: ctl's own config, and partner_copies on.
    ctl_cfg = cluster.host_dir("ctl") / "etc" / "slurm-snap.toml"
    partner_cfg = ctl_cfg.with_name("slurm-snap-partner.toml")
    partner_cfg.write_text(ctl_cfg.read_text().replace("[restore]\n", "[restore]\npartner_copies = true\n", 1))
    partner_cfg.chmod(0o600)
    # The sampler sees a user's program on ctl when there is one: a 0.5 s
    # process, as short as a drill's first step could be.
    with CtlSampler(cluster.netns("ctl"), uid) as control:
        cluster.run(["/bin/sleep", "0.5"], user=cluster.user, host="ctl", check=True)
    assert [exe for exe, _cmd in control.seen.values() if exe.endswith("/sleep")], control.seen
    sbatch_exe = os.path.realpath(f"{cluster.slurm_bin}/sbatch")
    ssh_before = {n: len(_sshd_log(cluster, n)) for n in cluster.nodes}
    # The nodes' sshd logs do show a connection from ctl: bring-up proved each
    # with one, logged from its TCP connection on (LogLevel VERBOSE), not only once authenticated.
    assert all(f"Connection from {cluster.addr('ctl')} " in _sshd_log(cluster, n)
               and "Accepted publickey" in _sshd_log(cluster, n) for n in cluster.nodes), \
        {n: _sshd_log(cluster, n)[-300:] for n in cluster.nodes}
    agent_log: list = []
    jid = None
    t0 = time.monotonic()
    with CtlSampler(cluster.netns("ctl"), uid) as sampler:
        stop_agents = cluster.start_node_agents(cluster.nodes, agent_log)
        try:
            jid = cluster.sbatch("-p", "low", "-N2", "--ntasks-per-node=1", "-c1", "--requeue",
                                 "--snapshot-on-preempt", "--snapshot-consistency=crash",
                                 "--snapshot-volumes=scratch", f"--snapshot-resume-cmd={resume_cmd}",
                                 "-o", f"{out}/slurm-%j.out",
                                 script=f"#!/bin/bash\nsrun {cluster.python} {worker}\n")
            job = cluster.wait_state(jid, "RUNNING", timeout=90)
            nodes = cluster.run(["scontrol", "show", "hostnames", job.nodes], timeout=30).stdout.split()
            _until("steps on both nodes", lambda: len(set(re.findall(r"^step \d+ on (\S+)$",
                   (out / f"slurm-{jid}.out").read_text() if (out / f"slurm-{jid}.out").exists() else "",
                   re.M))) == 2, 90, 0.3)
            # 1. Preemption: each node's Epilog cuts its own part.
            cluster.sbatch("-p", "high", "-w", ",".join(nodes), "--exclusive", "-o", "/dev/null", "-J", "preemptor",
                           "--wrap", "/bin/true")
            found = _until("the preemption set", lambda: cluster.inventory(_set_of, jid), 150)
            set_id, state, consistency, reason, part_nodes = found
            assert (state, consistency, part_nodes) == ("COMPLETE", "crash-consistent", sorted(nodes)), found
            cluster.cancel(jid)
            cluster.wait_state(jid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=90)
            t_cut = time.monotonic()

            # 2+3. The schedule runner: partner copies by the nodes' agents, then
            # the drill, on the nodes holding the copies, collected by a later pass.
            def scheduled():
                p = cluster.run([cluster.helper, "--config", str(Path(cluster.config).with_name(partner_cfg.name)),
                                 "schedule", "--json"], host="ctl", timeout=300)
                assert p.returncode == 0, p.stderr
                doc = cluster.inventory(_state, set_id)
                return doc if doc["tests"] and doc["tests"][0][1] != "RUNNING" else None
            doc = _until("the scheduled drill", scheduled, 300, 2.0)
            t_sched = time.monotonic()
            # A failed copy's error and the agents' lines in the message: the
            # cluster is gone once the test ends.
            assert sorted(c[:3] for c in doc["copies"]) == sorted([(nodes[0], nodes[1], "OK"),
                                                                   (nodes[1], nodes[0], "OK")]), \
                (doc["copies"], agent_log[-20:])
            (test,) = doc["tests"]
            assert test[1] == "PASSED" and doc["state"] == "VERIFIED", (doc, agent_log)
            # On the nodes holding the partner copies: position k on the job's node k's partner.
            assert [(n, s, c) for n, s, c in test[7]] == [(nodes[1], "READY", "CLEANED"),
                                                          (nodes[0], "READY", "CLEANED")], test
            assert test[2] in nodes and test[3] is not None and test[4] is not None

            # 4. On request, on ctl (an operator), and 5. through the service from login (the owner).
            ran = cluster.cli("restore-test", f"set:{set_id}", "--json", "--deadline", "120", host="ctl", timeout=400)
            assert ran.returncode == 0, ran.stdout + ran.stderr
            here = json.loads(ran.stdout)
            assert here["result"] == "PASSED" and here["ran_on"] in nodes and here["nodes"] == nodes, here
            via = cluster.cli("restore-test", f"set:{set_id}", "--json", "--deadline", "120", host="login",
                              user=cluster.user, timeout=400)
            assert via.returncode == 0, via.stdout + via.stderr
            there = json.loads(via.stdout)
            assert there["result"] == "PASSED" and there["ran_on"] in nodes, there
            t_drills = time.monotonic()

            # 6. Prune: the nodes' agents delete the parts and the copies on their disks.
            pr = cluster.cli("prune", "--job", str(jid), "--keep-within", "1s", "--no-keep-verified", "--force",
                             "--apply", "--json", host="ctl", timeout=120)
            assert pr.returncode == 0, pr.stderr
            assert json.loads(pr.stdout)["waiting"] == {str(set_id): sorted(nodes)}
            doc = _until("the set deleted by the agents",
                         lambda: (d := cluster.inventory(_state, set_id))["state"] == "DELETED" and d, 180)
            t_prune = time.monotonic()
        finally:
            stop_agents()
            if jid is not None:
                cluster.cancel(jid)
    # Every part and copy gone from the nodes' own disks.
    for _node, st, ref in doc["parts"]:
        assert st == "DELETED"
        for n in nodes:
            assert not cluster.root_path(ref, n).exists(), (ref, n)
    assert not [line for line in agent_log if "refused" in line or "exit " in line], agent_log
    # Each drill: 2 ranks, each on a compute node, each reading its own rank's part.
    infos = [json.loads(p.read_text()) for p in sorted(out.glob(f"{set_id}-*.json"))]
    assert len(infos) == 6, infos
    node_ns = {f"net:[{os.stat(cluster.netns(n)).st_ino}]": n for n in cluster.nodes}
    for info in infos:
        assert node_ns.get(info["netns"]) == info["node"] and info["uid"] == uid, info
        assert info["cut_on"] == nodes[info["rank"]], info     # rank k resumed from the job's node k's part
    # No SSH connection reached any node.
    for n in cluster.nodes:
        assert _sshd_log(cluster, n)[ssh_before[n]:].strip() == "", (n, _sshd_log(cluster, n)[ssh_before[n]:])
    # Nobody of the user on ctl but Slurm's sbatch (the submission MUNGE
    # authenticates): by its executable, not by what its command line says.
    # The sampler need not catch sbatch itself (it lives a few ms: the control
    # above shows what it does catch).
    others = {pid: seen for pid, seen in sampler.seen.items() if seen[0] != sbatch_exe}
    assert sampler.samples > 100 and not others, (sbatch_exe, others)
    print(f"\ncycle: cut after {t_cut - t0:.1f} s, scheduled drill (copies + job) {t_sched - t_cut:.1f} s, "
          f"two more drills {t_drills - t_sched:.1f} s, prune by the agents {t_prune - t_drills:.1f} s; "
          f"scheduled drill queued {test[3]:.1f} s, first step {test[4]:.2f} s on {test[2]}; "
          f"on request {here['queued_seconds']:.1f} s + {here['time_to_first_step']:.2f} s, "
          f"through the service {there['queued_seconds']:.1f} s + {there['time_to_first_step']:.2f} s; "
          f"{sampler.samples} samples of ctl, user processes there: "
          f"{sorted(set(c for _e, c in sampler.seen.values()))}")
