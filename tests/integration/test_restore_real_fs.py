"""Restore drills and prune on real filesystems: btrfs and xfs-reflink on loop devices.

The drilled program runs as `nobody` in a writable clone (a btrfs subvolume
snapshot, a reflink copy) made by the real backend; the clone is removed the
same way. The snapshots themselves are real and read-only.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import os
import pwd
import subprocess
import textwrap

import pytest

import fs as realfs
from realcomponents import venv_python
from slurm_snap import config as config_mod
from slurm_snap.access import Caller
from slurm_snap.backends import factory
from slurm_snap.inventory.repository import Inventory, SnapshotRecord
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap import states as S
from slurm_snap.restore.drill import Drill
from slurm_snap.restore.parts import backend_resolver
from slurm_snap.retention.prune import Pruner
from slurm_snap.retention.policy import Policy

pytestmark = pytest.mark.integration

btrfs_fs, xfs_fs = realfs.btrfs_fs, realfs.xfs_fs  # session fixtures
PYTHON = venv_python()
_seq = itertools.count()

PROGRAM = textwrap.dedent('''
    import os, sys, time
    root = os.environ["SLURM_SNAP_RESTORE_SCRATCH"]
    ckpt = os.path.join(root, "ckpt", "latest")
    if not os.path.exists(ckpt):
        print(f"cannot resume: {ckpt} missing", file=sys.stderr)
        sys.exit(3)
    open(os.path.join(root, "ckpt", "resumed-by-uid"), "w").write(str(os.getuid()))
    print(f"SLURM_SNAP_FIRST_STEP {int(open(ckpt).read()) + 1}", flush=True)
    time.sleep(3600)
''')


def digest(root: str) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = f"{st.st_mode:o}:{st.st_uid}:{st.st_size}:" + (
                hashlib.sha256(open(p, "rb").read()).hexdigest() if os.path.isfile(p) else "")
    return out


# "cross": the restore root is on the *other* loop filesystem, so the clone
# must go to the snapshot's own filesystem (next to the snapshot).
@pytest.fixture(params=["btrfs", "xfs-reflink", "btrfs cross", "xfs-reflink cross"])
def env(request, tmp_path):
    kind, _, cross = request.param.partition(" ")
    fsys = request.getfixturevalue("btrfs_fs" if kind == "btrfs" else "xfs_fs")
    other = request.getfixturevalue("xfs_fs" if kind == "btrfs" else "btrfs_fs")
    # The loop mounts sit in 0700 temp dirs; the drilled program runs as nobody.
    for f in (fsys, other):
        os.chmod(os.path.dirname(f.mountpoint), 0o755)
    tag = f"restore-it-{os.getpid()}-{next(_seq)}"
    prefix = os.path.join(fsys.mountpoint, tag)
    os.makedirs(os.path.join(prefix, "jobs"))
    os.chmod(prefix, 0o755)
    restore_root = os.path.join(other.mountpoint if cross else prefix, f".restore-{tag}")
    cfg = config_mod.from_dict({
        "inventory": {"url": f"sqlite:///{tmp_path}/inventory.db"},
        "paths": {"restore_root": restore_root},
        # In this process: the clones on real filesystems are the point here,
        # not where Slurm runs the program (test_drill_jobs_cluster.py).
        "restore": {"mode": "local"},
        "volume_class": [{"name": "scratch", "prefix": prefix, "scope": "shared", "backend": kind,
                          "options": {"snapdir": os.path.join(prefix, ".snapshots")}}],
    }, str(tmp_path / f"cfg-{kind}.toml"))
    factory.reset_cache()
    inv = Inventory(cfg.inventory.url)
    inv.upgrade()
    nobody = pwd.getpwnam("nobody")
    live = os.path.join(prefix, "jobs", "42")
    if kind == "btrfs":
        subprocess.run(["/usr/bin/btrfs", "subvolume", "create", live], check=True, capture_output=True, timeout=60)
    else:
        os.mkdir(live)
    os.makedirs(os.path.join(live, "ckpt"))
    with open(os.path.join(live, "ckpt", "latest"), "w") as f:
        f.write("100")
    for p in (live, os.path.join(live, "ckpt"), os.path.join(live, "ckpt", "latest")):
        os.chown(p, nobody.pw_uid, nobody.pw_gid)
    program = os.path.join(prefix, "resume.py")
    with open(program, "w") as f:
        f.write(PROGRAM)
    os.chmod(program, 0o644)
    backend = factory.backend_for_class(cfg, cfg.volume_class("scratch"), None)
    with inv.session() as repo:
        run = repo.record_job_run(job_id=42, restart_count=0, user_name="nobody", uid=nobody.pw_uid,
                                  options={"resume_cmd": f"{PYTHON} {program}"})
        (vol,) = repo.add_volumes(run, [VolumeRecord(path=live, scope="shared", volume_class="scratch",
                                                   backend=kind)])
    yield cfg, inv, backend, live, vol.id, (fsys.mountpoint if cross else None)
    inv.dispose()
    factory.reset_cache()


def cut(inv, backend, live, vol_id, epoch, at):
    ref = backend.create(live, f"j42-{epoch}")
    with inv.session() as repo:
        st, _ = repo.create_set(repo.job_run(42), epoch=epoch, trigger="manual", requested_at=at)
        repo.transition(st.id, S.CUTTING, at=at)
        repo.record_parts(st.id, [SnapshotRecord(volume_id=vol_id, backend=backend.name, name=ref.name,
                                                     ref=ref.ref, path=ref.path or "", node="", cut_started_at=at,
                                                     cut_at=at)])
        repo.transition(st.id, S.CUT, at=at)
        repo.transition(st.id, S.COMPLETE, consistency=S.APP, checkpoint_step=100)
        return st.id, ref.ref


def test_drill_and_prune_on_a_real_filesystem(env):
    cfg, inv, backend, live, vol_id, clone_mount = env
    t0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
    good, good_ref = cut(inv, backend, live, vol_id, "good", t0)
    before = digest(live)

    out = Drill(cfg, inv, caller=Caller(uid=0, name="root")).run("42", deadline=60)
    assert out.passed, out.reason
    assert out.first_step == 101
    assert digest(live) == before                      # the live tree was never written
    assert "resumed-by-uid" not in os.listdir(os.path.join(good_ref, "ckpt"))  # nor the snapshot
    assert os.listdir(cfg.paths.restore_root) == []     # the writable clone is gone
    if clone_mount:
        # Cloned next to the snapshot (its filesystem), then removed with its directory.
        (restored,) = out.restore_map.values()
        assert restored.startswith(os.path.join(os.path.dirname(good_ref), ".slurm-snap-restore-"))
    assert [n for n in os.listdir(os.path.dirname(good_ref)) if n.startswith(".slurm-snap-restore")] == []
    with inv.session() as repo:
        assert repo.get_set(good).state == S.VERIFIED
        assert 42 in repo.newest_verified_by_job([42])

    # A set cut after the checkpoint was lost: the drill fails, RPO keeps the good one.
    os.unlink(os.path.join(live, "ckpt", "latest"))
    bad, _ = cut(inv, backend, live, vol_id, "bad", t0 + dt.timedelta(hours=1))
    out = Drill(cfg, inv, caller=Caller(uid=0, name="root")).run(f"set:{bad}", deadline=60)
    assert not out.passed and "exit status 3" in out.reason
    assert os.listdir(cfg.paths.restore_root) == []
    with inv.session() as repo:
        assert repo.get_set(bad).state == S.FAILED_RESTORE
        newest = repo.newest_verified_by_job([42])[42]
        assert newest == repo.get_set(good).cut_done_at

    # Prune: keep the newest set; the only verified one survives too, until forced.
    pruner = Pruner(inv, backend_resolver(cfg))
    decisions, _ = pruner.plan(Policy(keep_last=1), lambda: t0 + dt.timedelta(days=1))
    assert [(d.set_id, d.action) for d in decisions] == [(good, "keep"), (bad, "keep")]
    decisions, _ = pruner.plan(Policy(keep_last=1, keep_verified=False, force=True),
                               lambda: t0 + dt.timedelta(days=1))
    assert pruner.apply(decisions).deleted == [good]
    assert not os.path.exists(good_ref)
    with inv.session() as repo:
        assert repo.get_set(good).state == S.DELETED
        assert repo.newest_verified_by_job([42]) == {}
