"""Issue 6 acceptance on the dev cluster: `slurm-snap snapshot JOBID` on a
running 3-node training job -- one real `scancel --signal`, the real client in
the ranks, real btrfs subvolumes -- gives an app-consistent set, and training
goes on after the release. The coordinator runs on ctl (where the inventory
is), as root, and reaches each node's scratch through that node's sshd."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from testkit.inventory_helpers import restore_tests, sets_of_job

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BATCH = """#!/bin/bash
srun {python} {train} --steps 100000 --step-time 0.2 --release-timeout 60
"""


def _cfg(cluster):
    from slurm_snap.config import load

    return load(cluster.config_path("ctl"))


def _steps(out: Path) -> int:
    text = out.read_text() if out.exists() else ""
    return len(re.findall(r"^step \d+", text, re.M))


def _cli(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """slurm-snap as root on ctl, with the environment an admin's shell would give it."""
    return cluster.cli(*args, host="ctl", timeout=timeout)


def _snapshot(cluster, jid: int, *extra: str) -> tuple[int, dict, str]:
    proc = _cli(cluster, "snapshot", str(jid), "--json", *extra)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else {}), proc.stderr


def _start_training(cluster, name: str, script: str, *sbatch: str) -> tuple[str, int, Path]:
    """examples/train.py as the test user on 3 nodes; returns (train.py path, job id, log)
    once every rank is past its first steps."""
    train = cluster.write_user_file(f"train-{name}.py", (REPO / "examples" / "train.py").read_text(), mode=0o755)
    out = cluster.make_user_dir(f"protocol-{name}-{time.monotonic_ns()}")
    jid = cluster.sbatch(*sbatch, "-N3", "--ntasks-per-node=1", "-c1", "--snapshot-volumes=scratch,pfs",
                         "-o", f"{out}/slurm-%j.out", script=script.format(train=train, python=cluster.python))
    log = out / f"slurm-{jid}.out"
    try:
        cluster.wait_state(jid, "RUNNING", timeout=60)
        deadline = time.monotonic() + 90
        while _steps(log) < 9:
            assert time.monotonic() < deadline, f"training did not start:\n{log.read_text() if log.exists() else ''}"
            time.sleep(0.2)
    except BaseException:
        cluster.cancel(jid)
        raise
    return train, jid, log


def _set_parts(repo, set_id: int):
    """Acks (node, rank, step, manifest), parts (class, node, volume path, snapshot path), the set's manifest_ok."""
    acks = [(a.node, a.rank, a.step, list(a.manifest)) for a in repo.acks(set_id)]
    parts = [(p.volume.volume_class, p.node, p.volume.path, p.path, p.manifest_ok) for p in repo.snapshots(set_id)]
    return acks, parts, repo.get_set(set_id).manifest_ok


def test_on_demand_snapshot_of_a_running_training_job(cluster):
    cfg = _cfg(cluster)
    _train, jid, log = _start_training(cluster, "protocol", BATCH)
    try:
        rc, res, err = _snapshot(cluster, jid, "--deadline", "30")
        assert rc == 0, err
        assert (res["state"], res["consistency"]) == ("COMPLETE", "app-consistent"), res
        assert res["checkpoint_step"] is not None and res["failed_nodes"] == []
        acks, parts, manifest_ok = cluster.inventory(_set_parts, res["set_id"])
        assert sorted(a[0] for a in acks) == ["n1", "n2", "n3"]
        assert sorted((p[0], p[1]) for p in parts) == \
            [("pfs", ""), ("scratch", "n1"), ("scratch", "n2"), ("scratch", "n3")]
        assert manifest_ok is True and all(p[4] for p in parts)
        for vclass, node, live, snap, _ok in parts:
            if node:   # each node's scratch snapshot is on that node's own disk, and only there
                assert live == f"{cluster.scratch}/jobs/{jid}"
                assert cluster.root_path(snap, node).is_dir(), (node, snap)
                assert [n for n in cluster.nodes if cluster.root_path(snap, n).exists()] == [node], snap
        _c, _n, pfs_live, pfs_snap, _ok = next(p for p in parts if not p[1])
        for _node, _rank, _step, manifest in acks:  # every acknowledged checkpoint file is in the pfs snapshot
            for e in manifest:
                rel = os.path.relpath(e["path"], pfs_live)
                assert os.path.getsize(os.path.join(pfs_snap, rel)) == e["size"]
        assert (Path(cfg.paths.barrier_dir) / str(jid) / "release" / res["epoch"]).exists()

        before = _steps(log)  # released: training goes on
        deadline = time.monotonic() + 30
        while _steps(log) < before + 6:
            assert time.monotonic() < deadline, "training did not continue after the release"
            time.sleep(0.2)

        rc, res2, err = _snapshot(cluster, jid, "--consistency", "crash")
        assert rc == 0, err
        assert (res2["state"], res2["consistency"]) == ("COMPLETE", "crash-consistent")
        # the other test user may not snapshot this job
        other = cluster.cli("snapshot", str(jid), host="login", user=cluster.other_user, timeout=60)
        assert other.returncode in (4, 9), other.stderr  # 9: the inventory is not readable by users at all
    finally:
        cluster.cancel(jid)


def _preempt_set(repo, jid: int):
    for st in sets_of_job(repo, jid):
        if st.trigger == "preempt" and st.state not in ("PENDING", "QUIESCING", "CUTTING", "CUT"):
            return st.id, st.state, st.consistency, st.reason, st.checkpoint_step, st.epoch
    return None


def _drill_record(repo, set_id: int):
    last = max(restore_tests(repo, set_id), key=lambda t: t.id)
    return repo.get_set(set_id).state, (last.id, last.result, last.first_step, last.time_to_first_step)


@pytest.mark.crossdb
def test_preemption_gives_an_app_consistent_set_and_the_requeued_run_resumes_from_it(cluster):
    cfg = _cfg(cluster)
    train, jid, log = _start_training(cluster, "preempt", BATCH, "-p", "low", "--requeue", "--open-mode=append",
                                      "--snapshot-on-preempt")
    try:
        cluster.preempt()

        deadline = time.monotonic() + 120
        while (found := cluster.inventory(_preempt_set, jid)) is None:
            assert time.monotonic() < deadline, f"no finished preemption set; hook log:\n{cluster.hook_log()[-4000:]}"
            time.sleep(0.5)
        set_id, state, consistency, reason, step, epoch = found
        assert (state, consistency) == ("COMPLETE", "app-consistent"), reason
        assert epoch == "preempt-0" and step is not None
        # The requeued run's Prolog wrote resume.json; the ranks resume from the snapshot.
        deadline = time.monotonic() + 120
        pattern = re.compile(r"^resumed from step (\d+) \((.*)\)$", re.M)
        while len(pattern.findall(log.read_text() if log.exists() else "")) < 3:
            assert time.monotonic() < deadline, f"requeued run did not resume:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        resumed = pattern.findall(log.read_text())
        acks, parts, _ok = cluster.inventory(_set_parts, set_id)
        acked = {a[2] for a in acks}
        # each rank resumes from its own acknowledged checkpoint, inside the snapshot
        assert len(resumed) == 3 and {int(s) for s, _ in resumed} <= acked and min(acked) == step
        assert all("/.snapshots/" in src for _, src in resumed), resumed
        resume = json.loads((Path(cfg.paths.barrier_dir) / str(jid) / "resume.json").read_text())
        assert resume["set_id"] == set_id and resume["step"] == step
        # Each rank's first step after its resume is the next one. Ranks share the
        # log, so match them as multisets: every "resumed from step N" has a
        # first-step marker N+1 (the marker the client prints after that step).
        from collections import Counter

        wanted = Counter(int(n) + 1 for n, _ in resumed)
        deadline = time.monotonic() + 60   # a rank prints its marker after its first step, a moment later
        while True:
            text = log.read_text()
            firsts = Counter(int(n) for n in re.findall(r"^SLURM_SNAP_FIRST_STEP (\d+)$", text, re.M))
            if not (wanted - firsts) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not (wanted - firsts), (wanted, firsts, text[-3000:])
        # `show` on this set names every node and every volume.
        shown = _cli(cluster, "show", f"set:{set_id}", timeout=60)
        assert shown.returncode == 0, shown.stderr
        # Each part is one (node, volume): scratch has the same path on every node.
        vols = sorted((p[1], p[2]) for p in parts)
        vol_paths = sorted({path for _node, path in vols})
        assert len(vols) == 4 and len(vol_paths) == 2
        for name in ("n1", "n2", "n3", *vol_paths):
            assert name in shown.stdout, (name, shown.stdout)

        # Issue 8 acceptance: this preemption set passes a restore drill with
        # the same PyTorch program. Stop the requeued run first so the live
        # volumes hold still while we checksum them around the drill.
        cluster.cancel(jid)
        cluster.wait_state(jid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=90)
        rank0_step = next(a[2] for a in acks if a[1] == 0)
        # Every live volume as the machine room sees it: each node's scratch on its own disk.
        live = {(node, path): cluster.root_path(path, node or None) for node, path in vols}
        before = {k: _digest(p) for k, p in live.items()}
        # The checkpoints are on pfs (the scratch volumes are empty but exist:
        # anything a drill wrote into them would show up as a new file).
        pfs_path = next(path for node, path in vols if not node)
        assert any(k.endswith(".pt") for k in before[("", pfs_path)]), before
        assert all(p.is_dir() for p in live.values())
        drill = _cli(cluster, "restore-test", f"set:{set_id}", "--json", "--deadline", "120", "--command",
                     f"{cluster.python} {train} --steps {rank0_step + 3}", timeout=300)
        assert drill.returncode == 0, (drill.stdout, drill.stderr)
        result = json.loads(drill.stdout)
        # rank 0 of the drill resumes from rank 0's acknowledged checkpoint in
        # the clone, so its first step is the next one
        assert result["result"] == "PASSED" and result["first_step"] == rank0_step + 1, result
        assert result["time_to_first_step"] > 0 and not result["kept"] and not result["cleanup_errors"]
        # One clone per live path: scratch has one path on the three nodes, and
        # so has its clone, which each node's Prolog made on its own disk.
        rmap = result["restore_map"]
        assert len(rmap) == 2 and set(rmap) == set(vol_paths), rmap
        assert [v.rsplit("/", 2)[-2:] for k, v in rmap.items() if str(cluster.scratch) in k] == \
            [[f".slurm-snap-restore-{set_id}-{result['test_id']}", "scratch"]], rmap
        # The program ran as a Slurm job on the set's nodes, never on ctl.
        job_nodes = sorted({n for n, _p in vols if n})
        assert result["nodes"] == job_nodes and result["ran_on"] == job_nodes[0], result
        state, recorded = cluster.inventory(_drill_record, set_id)
        assert state == "VERIFIED"
        assert recorded[:3] == (result["test_id"], "PASSED", rank0_step + 1)
        assert recorded[3] == pytest.approx(result["time_to_first_step"])
        assert {k: _digest(p) for k, p in live.items()} == before   # live volumes untouched
        for restored in rmap.values():                                # the clones are gone, on every disk
            where = [cluster.root_path(restored, n) for n in cluster.nodes] if restored.startswith(
                str(cluster.scratch) + "/") else [Path(restored)]
            assert not any(p.exists() for p in where), restored
        assert not os.path.exists(result["namespace"])
        leftovers = [str(p) for p in Path(cfg.paths.restore_root).glob(f"{set_id}-*")]
        for (node, vp), root in live.items():
            leftovers += [str(p) for p in root.parent.glob(f".snapshots/.slurm-snap-restore-{set_id}-*")]
        assert not leftovers, leftovers
    finally:
        cluster.cancel(jid)


def _digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every regular file (and symlink target) under root;
    snapshot directories are not part of the live tree."""
    import hashlib

    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".snapshots")
        for name in filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            else:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


IGNORE_ON_N3 = """#!/bin/bash
# The ranks on one node swallow the checkpoint signal (as code that does not
# forward SIGUSR1 would): that node never acknowledges. Independent ranks: in
# a process group the step agreement would carry the request to n3 anyway.
srun /bin/bash -c 'if [ "$SLURMD_NODENAME" = n3 ]; then extra=--ignore-signal; fi; \
exec {python} {train} --independent --steps 100000 --step-time 0.2 --release-timeout 60 $extra'
"""


def test_node_that_never_acknowledges_is_named_and_the_set_is_not_app_consistent(cluster):
    _train, jid, _log = _start_training(cluster, "ignore", IGNORE_ON_N3)
    try:
        rc, res, err = _snapshot(cluster, jid, "--deadline", "6")
        assert res, err
        assert res["consistency"] != "app-consistent", res
        # The deadline passed before n3 acknowledged: exit 8 whatever the label
        # (README, `snapshot --help`), and the set is recorded all the same.
        assert (rc, res["barrier"]) == (8, "incomplete"), (rc, res, err)
        assert "n3" in res["failed_nodes"] and "n1" not in res["failed_nodes"], res
        rep = _cli(cluster, "report", "-j", str(jid), "-P", "-n", "-o", "JobID,Consistency,FailedNodes", timeout=60)
        assert rep.returncode == 0, rep.stderr
        assert rep.stdout.strip().splitlines()[-1] == f"{jid}|{res['consistency']}|n3", rep.stdout
    finally:
        cluster.cancel(jid)
