"""`restore-test --submit` on the dev cluster: the drilled command runs as a Slurm job
of the job's owner, in a btrfs clone on the shared pfs, and the CLI records the result."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import textwrap

import pytest

from slurm_snap import config as config_mod
from slurm_snap.backends import factory
from slurm_snap.cli import main
from slurm_snap.inventory.repository import Inventory, SnapshotRecord, VolumeSpec
from slurm_snap.protocol import states as S

pytestmark = pytest.mark.integration

PYTHON = "/opt/slurm-snap/venv/bin/python"
PROGRAM = textwrap.dedent('''
    import json, os, sys, time
    root = os.environ["SLURM_SNAP_RESTORE_PFS"]
    ckpt = os.path.join(root, "ckpt", "latest")
    if not os.path.exists(ckpt):
        print(f"cannot resume: {ckpt} missing", file=sys.stderr)
        sys.exit(3)
    with open(sys.argv[1], "w") as f:
        json.dump({"uid": os.getuid(), "slurm_job": os.environ.get("SLURM_JOB_ID")}, f)
    step = int(open(ckpt).read()) + 1
    with open(os.environ["SLURM_SNAP_RESTORE_MARKER"], "w") as f:
        f.write(f"SLURM_SNAP_FIRST_STEP {step}\\n")
    time.sleep(3600)
''')


def test_submit_drill_runs_as_the_owner_under_slurm(cluster, monkeypatch, capsys):
    cfg_path = cluster.env["SLURM_SNAP_CONFIG"]
    cfg = config_mod.load(cfg_path)
    vc = cfg.volume_class("pfs")
    assert vc is not None and vc.backend == "btrfs", "dev cluster config: pfs must be a btrfs class"
    owner = pwd.getpwnam(cluster.user)
    job_id = 8_000_000 + os.getpid() % 100_000
    live = vc.job_path(None, job_id)
    os.makedirs(os.path.dirname(live), exist_ok=True)
    subprocess.run(["/usr/bin/btrfs", "subvolume", "create", live], check=True, capture_output=True, timeout=60)
    backend = factory.backend_for_class(cfg, vc, None)
    ref = None
    inv = Inventory.from_config(cfg)
    try:
        os.makedirs(os.path.join(live, "ckpt"))
        with open(os.path.join(live, "ckpt", "latest"), "w") as f:
            f.write("41")
        for p in (live, os.path.join(live, "ckpt"), os.path.join(live, "ckpt", "latest")):
            os.chown(p, owner.pw_uid, owner.pw_gid)
        program = cluster.write_user_file(f"resume-{job_id}.py", PROGRAM, mode=0o644)
        seen = cluster.user_dir() / f"seen-{job_id}.json"
        inv.upgrade()
        ref = backend.create(live, f"drill-{job_id}")
        with inv.session() as repo:
            run = repo.record_job_run(job_id=job_id, restart_count=0, user_name=owner.pw_name, uid=owner.pw_uid)
            (vol,) = repo.add_volumes(run, [VolumeSpec(path=live, scope="shared", volume_class="pfs",
                                                       backend="btrfs")])
            st, _ = repo.create_set(run, epoch="e1", trigger="manual")
            set_id = st.id
            repo.transition(set_id, S.CUTTING)
            repo.record_snapshots(set_id, [SnapshotRecord(
                volume_id=vol.id, backend="btrfs", name=ref.name, ref=ref.ref, path=ref.path or "", node="",
                cut_started_at=st.requested_at, cut_at=st.requested_at)])
            repo.transition(set_id, S.CUT)
            repo.transition(set_id, S.COMPLETE, consistency=S.APP, checkpoint_step=41)

        monkeypatch.setenv("SLURM_CONF", cluster.slurm_conf)
        code = main(["--config", cfg_path, "restore-test", f"set:{set_id}", "--submit", "--deadline", "120",
                     "--queue-timeout", "120", "--command", f"{PYTHON} {program} {seen}", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0, out
        assert out["result"] == "PASSED" and out["first_step"] == 42
        assert out["slurm_job_id"] and out["cleanup_errors"] == []
        assert not os.path.exists(out["namespace"])
        with inv.session() as repo:
            assert repo.get_set(set_id).state == S.VERIFIED
            (rt,) = repo.restore_tests(set_id)
            assert rt.result == "PASSED" and rt.slurm_job_id == out["slurm_job_id"]
        # Slurm ran it, as the owner, inside the drill's Slurm job.
        info = json.loads(seen.read_text())
        assert info == {"uid": owner.pw_uid, "slurm_job": str(out["slurm_job_id"])}
    finally:
        if ref is not None:
            backend.delete(ref)
        subprocess.run(["/usr/bin/btrfs", "subvolume", "delete", live], capture_output=True, timeout=60)
        inv.dispose()
        factory.reset_cache()
