"""The snapshot protocol on real filesystems: btrfs and xfs-reflink on loop
devices, the real rank-side client writing acknowledgements, the real
backends cutting, repair removing real orphan snapshots."""
from __future__ import annotations

import datetime as dt
import itertools
import os
import subprocess
import threading

import pytest

import fs as realfs
from slurm_snap import access, config as config_mod
from slurm_snap.backends import factory
from slurm_snap.client import Checkpointer
from slurm_snap.inventory.repository import Inventory
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap import states as S
from slurm_snap.protocol.coordinator import Coordinator
from slurm_snap.protocol.cutter import snapshot_name
from slurm_snap.protocol.repair import repair

pytestmark = pytest.mark.integration

btrfs_fs, xfs_fs = realfs.btrfs_fs, realfs.xfs_fs  # session fixtures
_seq = itertools.count()
JOB = 5151
NODES = ("n1", "n2")


def make_volume(kind: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if kind == "btrfs":
        subprocess.run([realfs.which("btrfs"), "subvolume", "create", path], check=True, capture_output=True,
                       timeout=30)
    else:
        os.mkdir(path)


@pytest.fixture(params=["btrfs", "xfs-reflink"])
def env(request, tmp_path):
    kind = request.param
    fsys = request.getfixturevalue("btrfs_fs" if kind == "btrfs" else "xfs_fs")
    root = os.path.join(fsys.mountpoint, f"protocol-it-{os.getpid()}-{next(_seq)}")
    data = {
        "inventory": {"url": f"sqlite:///{tmp_path}/inventory.db"},
        "paths": {"barrier_dir": f"{tmp_path}/barriers", "restore_root": f"{tmp_path}/restore",
                  "log_dir": f"{tmp_path}/log"},
        "timeouts": {"barrier": 10.0, "backend_call": 30.0},
    }
    data["volume_class"] = [
        {"name": "scratch", "prefix": f"{root}/scratch/{{node}}", "scope": "node-local", "backend": kind},
        {"name": "pfs", "prefix": f"{root}/pfs", "scope": "shared", "backend": kind},
    ]
    cfg = config_mod.from_dict(data, path=f"{tmp_path}/slurm-snap-{kind}.toml")
    classes = cfg.volume_classes
    inv = Inventory(cfg.inventory.url)
    inv.upgrade()
    specs, paths = [], {}
    for n in NODES:
        p = classes[0].job_path(n, JOB)
        make_volume(kind, p)
        paths[n] = p
        specs.append(VolumeRecord(path=p, scope="node-local", volume_class="scratch", backend=kind, node=n))
    shared = classes[1].job_path(None, JOB)
    make_volume(kind, shared)
    specs.append(VolumeRecord(path=shared, scope="shared", volume_class="pfs", backend=kind))
    with inv.session() as repo:
        run = repo.record_job_run(job_id=JOB, restart_count=0, user_name="root", uid=0, nodes=list(NODES))
        repo.add_volumes(run, specs, prepared=True)
    yield kind, cfg, inv, paths, shared
    factory.reset_cache()
    inv.dispose()


def real_ranks(cfg, paths, shared):
    """Ranks using the real client: checkpoint (fsync) and acknowledge."""
    def rank(i, node):
        ck = Checkpointer(barrier_dir=cfg.paths.barrier_dir, job_id=str(JOB), node=node, rank=i, local_rank=0,
                          local_size=1, restart_count=0, env={})
        files = []
        for base in (paths[node], shared):
            p = os.path.join(base, f"step-3-rank{i}.bin")
            with open(p, "wb") as f:
                f.write(os.urandom(4096 * (i + 1)))
            files.append(p)
        ck.commit(3, files, hash=True)

    def signal(job_id):
        for i, n in enumerate(NODES):
            threading.Thread(target=rank, args=(i, n)).start()

    return signal


def test_app_consistent_set_on_a_real_filesystem(env):
    kind, cfg, inv, paths, shared = env
    out = Coordinator(cfg, inv, signaller=real_ranks(cfg, paths, shared),
                      caller=access.Caller(uid=0, name="root")).snapshot(JOB, deadline=20)
    assert (out.state, out.consistency) == (S.COMPLETE, S.APP), out.reason
    assert out.checkpoint_step == 3
    with inv.session() as repo:
        parts = repo.snapshots(out.set_id)
        st = repo.get_set(out.set_id)
    assert st.manifest_ok is True and len(parts) == 3
    for p in parts:
        assert p.state == "CUT" and p.manifest_ok and os.path.isdir(p.path)
        assert p.name == snapshot_name(JOB, out.set_id, p.volume_id)
    n1 = next(p for p in parts if p.node == "n1")
    assert os.path.getsize(os.path.join(n1.path, "step-3-rank0.bin")) == 4096
    if kind == "btrfs":  # a real read-only snapshot
        with pytest.raises(OSError):
            open(os.path.join(n1.path, "new-file"), "w")


def test_repair_removes_real_orphans(env):
    kind, cfg, inv, paths, shared = env
    with inv.session() as repo:
        run = repo.job_run(JOB)
        st, _ = repo.create_set(run, epoch="sdead", trigger="manual", owner="gone-host:1:1",
                                deadline=dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1))
        repo.transition(st.id, S.CUTTING)
        vols = repo.volumes(run)
    made = []
    for v in vols[:2]:  # a coordinator that died mid-cut left these
        b = factory.backend_for_volume(cfg, v)
        made.append(b.create(v.path, snapshot_name(JOB, st.id, v.id)))
    assert all(os.path.isdir(r.path) for r in made)
    (a,) = repair(cfg, inv)
    assert a.new_state == S.ROLLED_BACK and sorted(a.orphans) == sorted(r.ref for r in made) and a.errors == []
    assert not any(os.path.exists(r.path) for r in made)
