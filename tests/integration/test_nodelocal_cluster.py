"""Issue 23 on the 4-node dev cluster: a 2-node job keeps each rank's
checkpoint on its own node's scratch (node-local btrfs); it is preempted, its
nodes are drained, and the requeued run lands on the two other nodes. The
head node's Prolog has the controller bring each rank's part over (btrfs send
-> ctl -> btrfs receive, over the nodes' sshd with host-key checks), and
every rank resumes at the step after its acknowledged one from its own part."""
from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest

from testkit.inventory_helpers import sets_of_job

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Independent ranks: each trains and checkpoints its own model, so each
# node's scratch holds state that exists nowhere else.
BATCH = """#!/bin/bash
srun {python} {train} --independent --steps 100000 --step-time 0.2 --release-timeout 60 \\
    --ckpt-dir {scratch}/jobs/$SLURM_JOB_ID/ckpt
"""


def _preempt_set(repo, jid: int):
    for st in sets_of_job(repo, jid):
        if st.trigger == "preempt" and st.state not in ("PENDING", "QUIESCING", "CUTTING", "CUT"):
            acks = {a.rank: (a.node, a.step) for a in repo.acks(st.id)}
            return st.id, st.state, st.consistency, st.reason, acks
    return None


def _copies(repo, set_id: int):
    return sorted((c.source_node, c.node, c.state, c.method, tuple(c.ranks), c.bytes, c.seconds, c.path, c.error)
                  for c in repo.copies(set_id))


def _scontrol(cluster, *args: str):
    proc = cluster.run(["scontrol", *args], timeout=30, host="ctl")
    assert proc.returncode == 0, proc.stderr
    return proc


def _start_training(cluster, name: str, *sbatch_args: str):
    """A 2-node job of independent ranks checkpointing to node-local scratch,
    running and 10 steps in: (job id, its log, its two nodes)."""
    train = cluster.write_user_file(f"train-{name}.py", (REPO / "examples" / "train.py").read_text(), mode=0o755)
    out = cluster.make_user_dir(f"{name}-{time.monotonic_ns()}")
    jid = cluster.sbatch("-p", "low", "--snapshot-independent-ranks", "-N2", "--ntasks-per-node=1", "-c1",
                         "--snapshot-volumes=scratch,pfs", *sbatch_args, "-o", f"{out}/slurm-%j.out",
                         script=BATCH.format(train=train, python=cluster.python, scratch=cluster.scratch))
    log = out / f"slurm-{jid}.out"
    try:
        first = cluster.wait_state(jid, "RUNNING", timeout=60)
        old = cluster.run(["scontrol", "show", "hostnames", first.nodes], timeout=30).stdout.split()
        assert len(old) == 2, first.nodes
        deadline = time.monotonic() + 90
        while len(re.findall(r"^step \d+", log.read_text() if log.exists() else "", re.M)) < 10:
            assert time.monotonic() < deadline, f"training did not start:\n{log.read_text() if log.exists() else ''}"
            time.sleep(0.2)
    except BaseException:
        cluster.cancel(jid)   # the session's cluster goes on to the next test
        raise
    return jid, log, old


def _preempt(cluster, jid: int, nodes: list[str]) -> None:
    """A preemptor that wants exactly the job's nodes; returns once the job is requeued."""
    cluster.sbatch("-p", "high", "-w", ",".join(nodes), "--exclusive", "-o", "/dev/null", "-J", "preemptor",
                   "--wrap", "/bin/true")
    cluster.wait_for(jid, lambda j: j is not None and j.restart_count >= 1, timeout=90, what="requeue",
                     interval=0.2)


def _wait_preempt_set(cluster, jid: int):
    deadline = time.monotonic() + 120
    while (found := cluster.inventory(_preempt_set, jid)) is None:
        assert time.monotonic() < deadline, f"no finished preemption set; hook log:\n{cluster.hook_log()[-4000:]}"
        time.sleep(0.5)
    return found


_RESUMED = re.compile(r"^resumed from step (\d+) \((.*)\)$", re.M)


def _wait_resumed(cluster, log: Path, ranks: int = 2) -> list[tuple[str, str]]:
    """(step, checkpoint path) of each rank's 'resumed from' line."""
    deadline = time.monotonic() + 120
    while len(_RESUMED.findall(log.read_text())) < ranks:
        assert time.monotonic() < deadline, \
            f"requeued run did not resume:\n{log.read_text()[-3000:]}\n{cluster.hook_log()[-3000:]}"
        time.sleep(0.5)
    return _RESUMED.findall(log.read_text())


def _snapshot_and_cancel(cluster, jid: int) -> int:
    """An on-demand set of the running job, then the job cancelled: the set's id."""
    snap = cluster.cli("snapshot", str(jid), "--json", "--deadline", "30", host="login", user=cluster.user)
    assert snap.returncode == 0, snap.stderr
    cluster.cancel(jid)
    cluster.wait_state(jid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=90)
    return json.loads(snap.stdout)["set_id"]


def test_requeued_onto_other_nodes_resumes_with_every_ranks_node_local_state(cluster4):
    cluster = cluster4
    drained: list[str] = []
    jid, log, old = _start_training(cluster, "nodelocal", "--requeue", "--open-mode=append", "--snapshot-on-preempt")
    try:
        # Once the job is off its nodes they are drained, so the requeued run can only go elsewhere.
        _preempt(cluster, jid, old)
        _scontrol(cluster, "update", f"nodename={','.join(old)}", "state=drain", "reason=issue23 test")
        drained = old
        set_id, state, consistency, reason, acks = _wait_preempt_set(cluster, jid)
        assert (state, consistency) == ("COMPLETE", "app-consistent"), reason
        assert sorted(n for n, _s in acks.values()) == sorted(old)

        second = cluster.wait_state(jid, "RUNNING", timeout=120)
        new = cluster.run(["scontrol", "show", "hostnames", second.nodes], timeout=30).stdout.split()
        assert len(new) == 2 and not set(new) & set(old), (old, new)

        resumed = _wait_resumed(cluster, log)
        # Each rank resumed from its own acknowledged step, from its own part
        # (a snapshot under the node-local scratch), now on its new node.
        assert sorted(int(s) for s, _ in resumed) == sorted(s for _n, s in acks.values()), (resumed, acks)
        assert all(src.startswith(f"{cluster.scratch}/jobs/.snapshots/") for _, src in resumed), resumed
        assert sorted(Path(src).name for _, src in resumed) == ["rank-0.pt", "rank-1.pt"]

        from slurm_snap.config import load

        resume = json.loads((Path(load(cluster.config_path("ctl")).paths.barrier_dir) / str(jid)
                             / "resume.json").read_text())
        assert resume["set_id"] == set_id and resume["missing"] == [], resume
        assert {r: (e["from"], e["node"]) for r, e in resume["ranks"].items()} == \
            {str(r): (n, new[old.index(n)]) for r, (n, _s) in acks.items()}, resume
        copies = cluster.inventory(_copies, set_id)
        assert [(c[0], c[1], c[2], c[3]) for c in copies] == \
            sorted((old[i], new[i], "OK", "send") for i in range(2)), copies
        for src_node, dst_node, _st, _m, ranks, nbytes, secs, path, _e in copies:
            # The part is on the new node's own disk, and its rank's checkpoint in it.
            on_disk = cluster.root_path(path, dst_node)
            assert on_disk.is_dir() and nbytes > 0 and secs > 0, (on_disk, nbytes, secs)
            (rank,) = ranks
            assert (on_disk / "ckpt" / f"latest.rank-{rank}").is_file()
        print(f"\nmoved: {[(c[0], c[1], c[5], round(c[6], 3)) for c in copies]}")

        # The first step after each resume is the next one.
        wanted = Counter(int(n) + 1 for n, _ in resumed)
        deadline = time.monotonic() + 60
        while True:
            firsts = Counter(int(n) for n in re.findall(r"^SLURM_SNAP_FIRST_STEP (\d+)$", log.read_text(), re.M))
            if not (wanted - firsts) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not (wanted - firsts), (wanted, firsts)
        assert "without" not in "".join(line for line in log.read_text().splitlines() if "slurm-snap:" in line)

        shown = cluster.cli("show", f"set:{set_id}", "--json", host="ctl", timeout=60)
        assert shown.returncode == 0, shown.stderr
        doc = json.loads(shown.stdout)
        assert sorted((c["from"], c["node"], c["state"]) for c in doc["copies"]) == \
            sorted((old[i], new[i], "OK") for i in range(2))
    finally:
        cluster.cancel(jid)
        if drained:
            cluster.run(["scontrol", "update", f"nodename={','.join(drained)}", "state=resume"], timeout=30,
                        host="ctl")


def _restorable_with_a_part_lost_for_good(repo):
    """Restorable sets that have a LOST node-local part with no surviving copy: must be none."""
    from slurm_snap import states as S

    bad = []
    for st in repo.sets_in_states(S.RESTORABLE):
        ok = {c.snapshot_id for c in repo.copies(st.id, states=("OK",))}
        bad += [(st.id, st.state, p.node) for p in repo.snapshots(st.id) if p.state == "LOST" and p.id not in ok]
    return bad


def _parts(repo, set_id: int):
    return sorted((p.node, p.state, p.error) for p in repo.snapshots(set_id) if p.node), repo.get_set(set_id).state


def test_with_partner_copies_a_destroyed_disk_loses_no_set_and_the_run_resumes(cluster4):
    cluster = cluster4
    drained: list[str] = []
    jid, log, old = _start_training(cluster, "partner", "--requeue", "--open-mode=append", "--snapshot-on-preempt")
    try:
        _preempt(cluster, jid, old)
        # Keep the requeued run waiting while the partner copies are made and a disk is destroyed.
        deadline = time.monotonic() + 30
        while cluster.run(["scontrol", "hold", str(jid)], timeout=30, host="ctl").returncode != 0:
            assert time.monotonic() < deadline, "could not hold the requeued job"
            time.sleep(0.2)
        set_id, state, consistency, reason, acks = _wait_preempt_set(cluster, jid)
        assert (state, consistency) == ("COMPLETE", "app-consistent"), reason

        # The schedule runner with partner copies on: each part to the job's other node.
        conf = cluster.host_dir("ctl") / "etc" / "slurm-snap-partner.toml"
        text = (cluster.host_dir("ctl") / "etc" / "slurm-snap.toml").read_text()
        assert "\n[restore]\n" in text
        conf.write_text(text.replace("\n[restore]\n", "\n[restore]\npartner_copies = true\n", 1))
        ran = cluster.run([cluster.helper, "--config", f"{cluster.state}/local/etc/slurm-snap-partner.toml",
                           "schedule"], host="ctl", timeout=300)
        assert ran.returncode == 0, ran.stderr
        # The two nodes' agents stream each part to the other (no SSH, not through ctl).
        agent_log: list = []
        copies = cluster.node_agents(old, lambda: (c := cluster.inventory(_copies, set_id)) and
                                     all(r[2] != "FAILED" for r in c) and len(c) == 2 and c, log=agent_log)
        partner_rows = sorted((c[0], c[1], c[2]) for c in copies)
        assert partner_rows == sorted([(old[0], old[1], "OK"), (old[1], old[0], "OK")]), (copies, ran.stdout)
        shown = json.loads(cluster.cli("show", f"set:{set_id}", "--json", timeout=60).stdout)
        assert shown["set"]["survives_node_loss"] is True

        # old[1]'s disk dies: every snapshot on it is gone, and Slurm has the node drained for it.
        snapdir = cluster.disk(old[1]) / "jobs" / ".snapshots"
        for snap in sorted(snapdir.iterdir()):
            cluster.run(["/usr/bin/btrfs", "subvolume", "delete", str(cluster.scratch / "jobs" / ".snapshots" /
                                                                      snap.name)],
                        host=old[1], timeout=60, check=True)
        _scontrol(cluster, "update", f"nodename={old[1]}", "state=drain", "reason=disk failure")
        _scontrol(cluster, "update", f"nodename={old[0]}", "state=drain", "reason=maintenance")
        drained = old
        rep = cluster.cli("repair", "--json", timeout=300)
        actions = json.loads(rep.stdout)
        mine = [a for a in actions if a["set_id"] == set_id]
        assert len(mine) == 1 and mine[0]["new_state"] == "COMPLETE" and f"a copy survives on {old[0]}" in \
            mine[0]["reason"], actions
        parts, st = cluster.inventory(_parts, set_id)
        assert st == "COMPLETE" and [(n, s) for n, s, _e in parts] == sorted([(old[0], "CUT"), (old[1], "LOST")])
        assert cluster.inventory(_restorable_with_a_part_lost_for_good) == []

        _scontrol(cluster, "release", str(jid))
        second = cluster.wait_state(jid, "RUNNING", timeout=120)
        new = cluster.run(["scontrol", "show", "hostnames", second.nodes], timeout=30).stdout.split()
        assert not set(new) & set(old), (old, new)
        resumed = _wait_resumed(cluster, log)
        assert sorted(int(s) for s, _ in resumed) == sorted(s for _n, s in acks.values()), (resumed, acks)
        # The lost node's part came from its partner copy.
        moved = [c for c in cluster.inventory(_copies, set_id) if c[1] in new]
        assert sorted((c[0], c[2]) for c in moved) == [(old[0], "OK"), (old[0], "OK")], moved
    finally:
        cluster.cancel(jid)
        if drained:
            cluster.run(["scontrol", "update", f"nodename={','.join(drained)}", "state=resume"], timeout=30,
                        host="ctl")


# The drilled command of a placed drill, one task per drill node under srun:
# each rank finds its own part at the one restore path every drill node has,
# reads its checkpoint pointer and says where it ran and from which step;
# rank 0 reports the first step once every rank has.
DRILL = '''
import json, os, sys, time
rank, node = int(os.environ["SLURM_PROCID"]), os.environ.get("SLURMD_NODENAME", "")
scratch = os.environ["SLURM_SNAP_RESTORE_SCRATCH"]
ckpt = os.path.join(scratch, "ckpt")
pointer = os.path.join(ckpt, f"latest.rank-{rank}")
if not os.path.isfile(pointer):
    sys.exit(f"rank {rank} on {node}: no checkpoint pointer {pointer}")
rel = open(pointer).read().strip()
if not os.path.isfile(os.path.join(ckpt, rel)):
    sys.exit(f"rank {rank} on {node}: {rel} missing")
step = int(rel.split("/")[0].split("-", 1)[1])
out = sys.argv[1]
with open(os.path.join(out, f".seen-{rank}"), "w") as f:
    json.dump({"rank": rank, "node": node, "step": step, "scratch": scratch,
               "nodes": json.loads(os.environ["SLURM_SNAP_RESTORE_NODES"])}, f)
os.rename(os.path.join(out, f".seen-{rank}"), os.path.join(out, f"seen-{rank}.json"))
if rank == 0:
    deadline = time.time() + 60
    while len([n for n in os.listdir(out) if n.startswith("seen-")]) < int(os.environ["SLURM_NTASKS"]):
        if time.time() > deadline:
            sys.exit("rank 0: not every rank found its state")
        time.sleep(0.2)
    print(f"SLURM_SNAP_FIRST_STEP {step + 1}", flush=True)
time.sleep(300)   # training goes on; the drill stops it after the first step
'''


def _set_parts(repo, set_id: int):
    acks = {a.rank: (a.node, a.step) for a in repo.acks(set_id)}
    parts = sorted((p.node, p.ref) for p in repo.snapshots(set_id) if p.node)
    return acks, parts, repo.get_set(set_id).state


def test_drill_on_other_nodes_brings_each_ranks_part_and_leaves_nothing(cluster4):
    """Issue 23 part 4: `restore-test JOB --other-nodes`, as the job's user on
    login (through the service), runs the ranks on the two nodes that cut
    nothing of the set, each from its own node-local part brought there, and
    leaves no clone or copy on any node."""
    cluster = cluster4
    prog = cluster.write_user_file("drill-ranks.py", DRILL, mode=0o644)
    seen = cluster.make_user_dir(f"drill-seen-{time.monotonic_ns()}")
    jid, _log, old = _start_training(cluster, "drill")
    try:
        set_id = _snapshot_and_cancel(cluster, jid)
        acks, parts, state = cluster.inventory(_set_parts, set_id)
        assert state == "COMPLETE" and sorted(n for n, _r in parts) == sorted(old), (state, parts)

        t0 = time.monotonic()
        drill = cluster.cli("restore-test", str(jid), "--other-nodes", "--json", "--deadline", "120",
                            "--queue-timeout", "120", "--command", f"srun {cluster.python} {prog} {seen}",
                            host="login", user=cluster.user, timeout=400)
        took = time.monotonic() - t0
        assert drill.returncode == 0, (drill.stdout, drill.stderr, cluster.hook_log("ctl")[-3000:])
        doc = json.loads(drill.stdout)
        others = [n for n in cluster.nodes if n not in old]
        assert doc["result"] == "PASSED" and doc["nodes"] == others, doc
        assert len(doc["moved"]) == 2 and doc["cleanup_errors"] == [], doc
        # Each rank ran on the drill node at its old node's position, from its own acknowledged step.
        for rank, (node, step) in acks.items():
            got = json.loads((seen / f"seen-{rank}.json").read_text())
            assert got["node"] == others[old.index(node)] and got["node"] not in old, got
            assert got["step"] == step and got["nodes"] == dict(zip(old, others)), (got, acks)
        print(f"\nplaced drill on {others}: {took:.1f} s, first step after {doc['time_to_first_step']:.2f} s; "
              f"{doc['moved']}")

        assert cluster.inventory(_set_parts, set_id)[2] == "VERIFIED"
        copies = cluster.inventory(_copies, set_id)
        assert sorted((c[0], c[1], c[2]) for c in copies) == sorted((old[i], others[i], "DELETED") for i in range(2))
        # Nothing left anywhere: on the drill nodes neither the copies nor the
        # clones' directory; on the set's own nodes only their own snapshot.
        own = {n: {Path(r).name for nn, r in parts if nn == n} for n in cluster.nodes}
        for node in cluster.nodes:
            snapdir = cluster.disk(node) / "jobs" / ".snapshots"
            names = {p.name for p in snapdir.iterdir()} if snapdir.exists() else set()
            names_of_set = {Path(r).name for _n, r in parts}
            assert names & names_of_set == own[node], (node, names)
            assert not [n for n in names if n.startswith(".slurm-snap-restore-")], (node, names)
        from slurm_snap.config import load

        assert not list(Path(load(cluster.config_path("ctl")).paths.restore_root).glob(f"{set_id}-*"))
    finally:
        cluster.cancel(jid)
