"""A drill of a set spanning classes, nodes, filesystems and transports on the dev cluster:
shared pfs (btrfs, local on ctl) plus node-local scratch on n1 and n2 (btrfs, each node's
own disk at the same path). The restore root is on pfs: the drill on ctl clones the pfs
part there; the scratch parts are cloned on their own nodes by the drill job's Prolog,
next to their snapshots, and removed by its Epilog.

The drill runs where the coordinator runs (ctl); its program runs as a Slurm job of the
owner on n1 and n2 and sees both clones. The scratch clones live on the nodes' disks:
the machine room checks them while the program holds the drill open."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from slurm_snap import config as config_mod
from slurm_snap.access import Caller
from slurm_snap.backends import factory
from slurm_snap.inventory.repository import Inventory, SnapshotRecord
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap import states as S
from slurm_snap.restore.drill import Drill

pytestmark = pytest.mark.integration

# Not in the second Slurm version's CI tier (tests/integration/conftest.py):
ABOVE_SLURM = "a drill's restore map across classes and transports; its job's sbatch is test_drill_jobs_cluster's"


PROGRAM = textwrap.dedent('''
    import json, os, sys, time
    restored = json.loads(os.environ["SLURM_SNAP_RESTORE_MAP"])
    pfs = os.environ["SLURM_SNAP_RESTORE_PFS"]
    step = int(open(os.path.join(pfs, "ckpt")).read())
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump({"map": restored, "pfs": pfs, "step": step, "uid": os.getuid()}, f)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    deadline = time.time() + 60   # the machine room looks at the node clones meanwhile
    while not os.path.exists(sys.argv[2]) and time.time() < deadline:
        time.sleep(0.1)
    print(f"SLURM_SNAP_FIRST_STEP {step + 1}", flush=True)
''')


def subvolume(path, owner, step: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run(["/usr/bin/btrfs", "subvolume", "create", str(path)], check=True, capture_output=True, timeout=60)
    with open(os.path.join(path, "ckpt"), "w") as f:
        f.write(str(step))
    os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chown(os.path.join(path, "ckpt"), owner.pw_uid, owner.pw_gid)


def _record_and_cut(config: str, job_id: int, owner_name: str, resume_cmd: str, parts_spec):
    """On ctl: record the job and a COMPLETE set whose parts are cut through the
    factory (pfs locally, scratch over SSH on each node)."""
    cfg = config_mod.load(config)
    owner = pwd.getpwnam(owner_name)
    parts = [(cfg.volume_class(name), node) for name, node in parts_spec]
    lives = [vc.job_path(node, job_id) for vc, node in parts]
    inv = Inventory.from_config(cfg)
    refs = []
    try:
        with inv.session() as repo:
            run = repo.record_job_run(job_id=job_id, restart_count=0, user_name=owner.pw_name, uid=owner.pw_uid,
                                      nodes=["n1", "n2"], options={"resume_cmd": resume_cmd})
            vols = repo.add_volumes(run, [VolumeRecord(path=live, scope=vc.scope, volume_class=vc.name,
                                                     backend=vc.backend, node=node or "")
                                          for (vc, node), live in zip(parts, lives)])
            st, _ = repo.create_set(run, epoch="e1", trigger="manual")
            set_id = st.id
            repo.transition(set_id, S.CUTTING)
            records = []
            for (vc, node), live, vol in zip(parts, lives, vols):
                ref = factory.backend_for_class(cfg, vc, node).create(live, f"multi-{job_id}")
                refs.append((vc.name, node, ref))
                records.append(SnapshotRecord(volume_id=vol.id, backend=vc.backend, name=ref.name, ref=ref.ref,
                                              path=ref.path or "", node=node or "", cut_started_at=st.requested_at,
                                              cut_at=st.requested_at))
            repo.record_parts(set_id, records)
            repo.transition(set_id, S.CUT)
            repo.transition(set_id, S.COMPLETE, consistency=S.CRASH, checkpoint_step=500)
        return set_id, refs
    except BaseException:
        _delete(config, refs)
        raise
    finally:
        inv.dispose()
        factory.reset_cache()


def _drill(config: str, job_id: int, slurm_conf: str):
    from slurm_snap.restore.submit import SlurmSubmitter

    os.environ["SLURM_CONF"] = slurm_conf
    cfg = config_mod.load(config)
    inv = Inventory.from_config(cfg)
    try:
        out = Drill(cfg, inv, caller=Caller(uid=0, name="root"), submitter=SlurmSubmitter(cfg)).run(
            str(job_id), deadline=90)
        return out.passed, out.reason, out.ran_on, out.nodes
    finally:
        inv.dispose()
        factory.reset_cache()


def _set_state(repo, set_id: int) -> str:
    return repo.get_set(set_id).state


def _delete(config: str, refs) -> None:
    cfg = config_mod.load(config)
    try:
        for name, node, ref in refs:
            factory.backend_for_class(cfg, cfg.volume_class(name), node).delete(ref)
    finally:
        factory.reset_cache()


def test_multi_class_multi_node_drill(cluster):
    cfg = config_mod.load(cluster.config_path("ctl"))
    pfs, scratch = cfg.volume_class("pfs"), cfg.volume_class("scratch")
    assert pfs and scratch and scratch.scope == "node-local" and scratch.transport == "ssh"
    owner = pwd.getpwnam(cluster.user)
    job_id = 8_100_000 + os.getpid() % 100_000
    spec = [("pfs", None), ("scratch", "n1"), ("scratch", "n2")]
    # Each live volume, as the machine room sees it: the scratch ones on their node's own disk.
    lives = {(name, node): cluster.root_path(cfg.volume_class(name).job_path(node, job_id), node)
             for name, node in spec}
    refs = []
    try:
        for path in lives.values():
            subvolume(path, owner, 500)
        program = cluster.write_user_file(f"multi-{job_id}.py", PROGRAM, mode=0o644)
        seen = cluster.user_dir() / f"multi-seen-{job_id}.json"
        go = cluster.user_dir() / f"multi-go-{job_id}"
        set_id, refs = cluster.on("ctl", _record_and_cut, cluster.config, job_id, owner.pw_name,
                                  f"{cluster.python} {program} {seen} {go}", spec)

        result = {}
        drill = threading.Thread(target=lambda: result.update(out=cluster.on("ctl", _drill, cluster.config, job_id,
                                                                              cluster.slurm_conf, timeout=300)))
        drill.start()
        try:
            deadline = time.monotonic() + 150
            while not seen.exists():
                assert time.monotonic() < deadline and drill.is_alive(), f"drill program never ran: {result}"
                time.sleep(0.1)
            info = json.loads(seen.read_text())
            assert info["uid"] == owner.pw_uid and info["step"] == 500
            by_live = info["map"]
            # One entry per live path: scratch has the same path on every node, so has its clone.
            assert set(by_live) == {cfg.volume_class(name).job_path(node, job_id) for name, node in spec}
            pfs_clone = by_live[pfs.job_path(None, job_id)]
            assert pfs_clone == info["pfs"] and pfs_clone.startswith(cfg.paths.restore_root + "/")   # pfs: restore root
            scratch_clone = by_live[scratch.job_path("n1", job_id)]
            # scratch: next to its snapshot, on each node's own disk, made by that node's Prolog.
            assert ".slurm-snap-restore-" in scratch_clone and scratch_clone.startswith(scratch.prefix + "/")
            for node in ("n1", "n2"):
                assert (cluster.root_path(scratch_clone, node) / "ckpt").read_text() == "500"
            assert not cluster.root_path(scratch_clone, "n3").exists()
        finally:
            go.touch()
            drill.join(300)
        passed, reason, ran_on, nodes = result["out"]
        assert passed, reason
        assert ran_on == "n1" and nodes == ["n1", "n2"]      # the program ran on a compute node, not on ctl
        assert not Path(pfs_clone).exists() and not Path(pfs_clone).parent.exists()
        for n in cluster.nodes:
            p = cluster.root_path(scratch_clone, n)
            assert not p.exists() and not p.parent.exists(), p
        assert cluster.inventory(_set_state, set_id) == S.VERIFIED
    finally:
        if refs:
            cluster.on("ctl", _delete, cluster.config, refs)
        for path in lives.values():
            subprocess.run(["/usr/bin/btrfs", "subvolume", "delete", str(path)], capture_output=True, timeout=60)

