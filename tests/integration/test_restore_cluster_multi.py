"""A drill of a set spanning classes, nodes, filesystems and transports on the dev cluster:
shared pfs (btrfs, local) plus node-local scratch on n1 and n2 (btrfs, each its own
filesystem, reached over SSH). The restore root is on pfs, so the scratch clones
must fall back to their snapshot's filesystem, through SSH, and be removed again."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import textwrap

import pytest

from slurm_snap import config as config_mod
from slurm_snap.access import Caller
from slurm_snap.backends import factory
from slurm_snap.inventory.repository import Inventory, SnapshotRecord, VolumeSpec
from slurm_snap.protocol import states as S
from slurm_snap.restore.drill import Drill

pytestmark = pytest.mark.integration

PROGRAM = textwrap.dedent('''
    import json, os, sys
    restored = json.loads(os.environ["SLURM_SNAP_RESTORE_MAP"])
    steps = []
    for live, path in sorted(restored.items()):
        steps.append(int(open(os.path.join(path, "ckpt")).read()))
    json.dump({"map": restored, "steps": steps, "uid": os.getuid()}, open(sys.argv[1], "w"))
    print(f"SLURM_SNAP_FIRST_STEP {min(steps) + 1}", flush=True)
''')


def subvolume(path: str, owner, step: int) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run(["/usr/bin/btrfs", "subvolume", "create", path], check=True, capture_output=True, timeout=60)
    with open(os.path.join(path, "ckpt"), "w") as f:
        f.write(str(step))
    os.chown(path, owner.pw_uid, owner.pw_gid)
    os.chown(os.path.join(path, "ckpt"), owner.pw_uid, owner.pw_gid)


def test_multi_class_multi_node_drill(cluster):
    cfg = config_mod.load(cluster.env["SLURM_SNAP_CONFIG"])
    pfs, scratch = cfg.volume_class("pfs"), cfg.volume_class("scratch")
    assert pfs and scratch and scratch.scope == "node-local" and scratch.transport == "ssh"
    owner = pwd.getpwnam(cluster.user)
    job_id = 8_100_000 + os.getpid() % 100_000
    parts = [(pfs, None), (scratch, "n1"), (scratch, "n2")]
    lives = [vc.job_path(node, job_id) for vc, node in parts]
    refs = []
    inv = Inventory.from_config(cfg)
    try:
        for live in lives:
            subvolume(live, owner, 500)
        program = cluster.write_user_file(f"multi-{job_id}.py", PROGRAM, mode=0o644)
        seen = cluster.user_dir() / f"multi-seen-{job_id}.json"
        inv.upgrade()
        with inv.session() as repo:
            run = repo.record_job_run(job_id=job_id, restart_count=0, user_name=owner.pw_name, uid=owner.pw_uid,
                                      nodes=["n1", "n2"], options={"resume_cmd": f"{cluster.python} {program} {seen}"})
            vols = repo.add_volumes(run, [VolumeSpec(path=live, scope=vc.scope, volume_class=vc.name,
                                                     backend=vc.backend, node=node or "")
                                          for (vc, node), live in zip(parts, lives)])
            st, _ = repo.create_set(run, epoch="e1", trigger="manual")
            set_id = st.id
            repo.transition(set_id, S.CUTTING)
            records = []
            for (vc, node), live, vol in zip(parts, lives, vols):
                backend = factory.backend_for_class(cfg, vc, node)
                ref = backend.create(live, f"multi-{job_id}")
                refs.append((backend, ref))
                records.append(SnapshotRecord(volume_id=vol.id, backend=vc.backend, name=ref.name, ref=ref.ref,
                                              path=ref.path or "", node=node or "", cut_started_at=st.requested_at,
                                              cut_at=st.requested_at))
            repo.record_snapshots(set_id, records)
            repo.transition(set_id, S.CUT)
            repo.transition(set_id, S.COMPLETE, consistency=S.CRASH, checkpoint_step=500)

        out = Drill(cfg, inv, caller=Caller(uid=0, name="root")).run(str(job_id), deadline=60)
        assert out.passed, out.reason
        info = json.loads(seen.read_text())
        assert info["uid"] == owner.pw_uid and info["steps"] == [500, 500, 500]
        assert set(info["map"]) == set(lives)
        by_live = info["map"]
        assert by_live[lives[0]].startswith(cfg.paths.restore_root + "/")        # pfs: in the restore root
        for live, node in zip(lives[1:], ["n1", "n2"]):                            # scratch: next to its snapshot
            assert by_live[live].endswith(f"/scratch@{node}") and ".slurm-snap-restore-" in by_live[live]
        for path in by_live.values():
            assert not os.path.exists(path)
            assert not os.path.exists(os.path.dirname(path))
        with inv.session() as repo:
            assert repo.get_set(set_id).state == S.VERIFIED
    finally:
        for backend, ref in refs:
            backend.delete(ref)
        for live in lives:
            subprocess.run(["/usr/bin/btrfs", "subvolume", "delete", live], capture_output=True, timeout=60)
        inv.dispose()
        factory.reset_cache()
