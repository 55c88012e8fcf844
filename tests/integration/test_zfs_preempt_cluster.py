"""ZFS in the preemption flow (issue 20): on a dev cluster brought up with
--zfs, one volume class ("zfs") is a zfs-fuse pool every host sees. A 3-node
training job that checkpoints there, preempted with --snapshot-on-preempt,
gives a COMPLETE app-consistent set whose zfs part is a real zfs-fuse
snapshot, and that set's restore drill passes through the clone path
(zfs-fuse snapshots have no .zfs directory: the drill reads a `zfs clone`
mounted inside the pool, since the restore root is on pfs, another
filesystem), and leaves no clone behind.

Why the pool is shared and mounted before `up`: scripts/lib-zfs.sh.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from cluster import default_inventory, new_state_dir, remove_state_dir, start_cluster
from testkit.cluster import Cluster
from testkit.inventory_helpers import sets_of_job
from testkit.loopfs import which
from realcomponents import require

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BATCH = """#!/bin/bash
srun {python} {train} --ckpt-volume zfs --steps 100000 --step-time 0.2 --release-timeout 60
"""


@pytest.fixture(scope="module")
def zfs_cluster():
    require(which("zfs-fuse") is not None and which("zpool") is not None,
            "zfs-fuse not installed (apt-get install zfs-fuse)")
    state = new_state_dir("slurm-snap-zfs-it-")
    try:
        yield start_cluster(state, "--inventory", default_inventory(), "--zfs")
    finally:
        proc = Cluster(state=state, env={}).down() if (state / "etc").exists() else None
        remove_state_dir(state)
        if proc is not None and proc.returncode != 0:
            pytest.fail(f"dev-cluster down {state} failed:\n{proc.stderr}")


def _steps(out: Path) -> int:
    text = out.read_text() if out.exists() else ""
    return len(re.findall(r"^step \d+", text, re.M))


def _preempt_set(repo, jid: int):
    for st in sets_of_job(repo, jid):
        if st.trigger == "preempt" and st.state not in ("PENDING", "QUIESCING", "CUTTING", "CUT"):
            parts = [(p.volume.volume_class, p.node, p.volume.path, p.ref, p.path, p.backend)
                     for p in repo.snapshots(st.id)]
            return st.id, st.state, st.consistency, st.reason, st.checkpoint_step, parts
    return None


def _acks(repo, set_id: int):
    return [(a.node, a.rank, a.step, [e["path"] for e in a.manifest]) for a in repo.acks(set_id)]


def _state(repo, set_id: int) -> str:
    return repo.get_set(set_id).state


def _zfs(*args: str) -> str:
    return subprocess.run([which("zfs"), *args], check=True, capture_output=True, text=True, timeout=60).stdout


def test_preempted_job_with_a_zfs_volume_gives_an_app_consistent_set_whose_drill_passes(zfs_cluster):
    cluster = zfs_cluster
    from slurm_snap.config import load

    zfs = load(cluster.config_path("ctl")).volume_class("zfs")
    assert zfs is not None and (zfs.backend, zfs.scope) == ("zfs", "shared")
    train = cluster.write_user_file("train-zfs.py", (REPO / "examples" / "train.py").read_text(), mode=0o755)
    out = cluster.make_user_dir(f"zfs-{time.monotonic_ns()}")
    jid = cluster.sbatch("-p", "low", "--requeue", "--open-mode=append", "--snapshot-on-preempt",
                         "-N3", "--ntasks-per-node=1", "-c1", "--snapshot-volumes=zfs,pfs",
                         "-o", f"{out}/slurm-%j.out", script=BATCH.format(train=train, python=cluster.python))
    log = out / f"slurm-{jid}.out"
    live = zfs.job_path(None, jid)
    try:
        cluster.wait_state(jid, "RUNNING", timeout=60)
        deadline = time.monotonic() + 90
        while _steps(log) < 9:
            assert time.monotonic() < deadline, f"training did not start:\n{log.read_text() if log.exists() else ''}"
            time.sleep(0.2)
        # The Prolog made the per-job volume a dataset of its own.
        datasets = [line.split("\t") for line in _zfs("list", "-H", "-o", "name,mountpoint").splitlines()]
        dataset = next((name for name, mp in datasets if mp == live), None)
        assert dataset is not None and dataset.endswith(f"/jobs/{jid}"), (datasets, cluster.hook_log()[-3000:])

        cluster.preempt()
        deadline = time.monotonic() + 120
        while (found := cluster.inventory(_preempt_set, jid)) is None:
            assert time.monotonic() < deadline, f"no finished preemption set; hook log:\n{cluster.hook_log()[-4000:]}"
            time.sleep(0.5)
        set_id, state, consistency, reason, step, parts = found
        print(f"zfs preemption set {set_id}: {state} {consistency} step {step} ({reason})")
        assert (state, consistency) == ("COMPLETE", "app-consistent"), reason
        assert step is not None
        by_class = {p[0]: p for p in parts}
        assert sorted(by_class) == ["pfs", "zfs"], parts
        _c, _node, vol, ref, path, backend = by_class["zfs"]
        # A real zfs-fuse snapshot of the job's dataset, with no path to browse.
        assert (vol, backend, path or None) == (live, "zfs", None), by_class["zfs"]
        assert ref.startswith(f"{dataset}@") and ref in _zfs("list", "-H", "-o", "name", "-t", "snapshot").split()
        # Every rank acknowledged a checkpoint inside the zfs volume.
        acks = cluster.inventory(_acks, set_id)
        assert sorted(a[0] for a in acks) == ["n1", "n2", "n3"]
        assert all(p.startswith(live + "/ckpt/") for a in acks for p in a[3]), acks
        rank0_step = next(a[2] for a in acks if a[1] == 0)

        # The drill: the requeued run is stopped first, so nothing writes meanwhile.
        cluster.cancel(jid)
        cluster.wait_state(jid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=90)
        drill = cluster.cli("restore-test", f"set:{set_id}", "--json", "--deadline", "120", "--command",
                            f"{cluster.python} {train} --ckpt-volume zfs --steps {rank0_step + 3}",
                            host="ctl", timeout=300)
        assert drill.returncode == 0, (drill.stdout, drill.stderr)
        result = json.loads(drill.stdout)
        # rank 0 of the drill resumed from its acknowledged checkpoint in the
        # zfs clone (the program trains from SLURM_SNAP_RESTORE_ZFS/ckpt).
        assert result["result"] == "PASSED" and result["first_step"] == rank0_step + 1, result
        assert not result["cleanup_errors"], result
        clone = result["restore_map"][live]
        # Made next to the volume, inside the pool: the restore root is on pfs (btrfs).
        assert clone.startswith(f"{zfs.prefix}/jobs/.slurm-snap-restore-"), clone
        assert not Path(clone).exists() and not Path(clone).parent.exists(), clone
        pool = dataset.split("/")[0]
        assert [ln for ln in _zfs("list", "-H", "-o", "name,origin", "-r", pool).splitlines()
                if ln.split("\t")[1] != "-"] == []  # no clone dataset left in this cluster's pool
        assert cluster.inventory(_state, set_id) == "VERIFIED"
    finally:
        cluster.cancel(jid)
