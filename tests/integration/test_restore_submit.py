"""`restore-test --submit` on the dev cluster: the drilled command runs as a Slurm job
of the job's owner, in a btrfs clone on the shared pfs, and the CLI records the result
(waiting, or later with --collect). The CLI runs on ctl, where the inventory is."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pwd
import subprocess
import textwrap
import time

import pytest

from slurm_snap import config as config_mod
from slurm_snap.backends import factory
from slurm_snap.cli import main
from slurm_snap.inventory.repository import Inventory, SnapshotRecord
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap import states as S
from testkit.inventory_helpers import restore_tests

pytestmark = pytest.mark.integration

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


@contextlib.contextmanager
def drillable_set(cluster, offset: int):
    """A pfs (btrfs) job volume owned by the test user, a COMPLETE set of it, the program."""
    cfg_path = cluster.env["SLURM_SNAP_CONFIG"]
    cfg = config_mod.load(cfg_path)
    vc = cfg.volume_class("pfs")
    assert vc is not None and vc.backend == "btrfs", "dev cluster config: pfs must be a btrfs class"
    owner = pwd.getpwnam(cluster.user)
    job_id = 8_000_000 + offset + os.getpid() % 100_000
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
            run = repo.record_job_run(job_id=job_id, restart_count=0, user_name=owner.pw_name, uid=owner.pw_uid,
                                      options={"resume_cmd": f"{cluster.python} {program} {seen}"})
            (vol,) = repo.add_volumes(run, [VolumeRecord(path=live, scope="shared", volume_class="pfs",
                                                       backend="btrfs")])
            st, _ = repo.create_set(run, epoch="e1", trigger="manual")
            set_id = st.id
            repo.transition(set_id, S.CUTTING)
            repo.record_parts(set_id, [SnapshotRecord(
                volume_id=vol.id, backend="btrfs", name=ref.name, ref=ref.ref, path=ref.path or "", node="",
                cut_started_at=st.requested_at, cut_at=st.requested_at)])
            repo.transition(set_id, S.CUT)
            repo.transition(set_id, S.COMPLETE, consistency=S.APP, checkpoint_step=41)
        yield cfg_path, inv, set_id, seen, owner
    finally:
        if ref is not None:
            backend.delete(ref)
        subprocess.run(["/usr/bin/btrfs", "subvolume", "delete", live], capture_output=True, timeout=60)
        inv.dispose()
        factory.reset_cache()


def _main(argv: list[str]) -> tuple[int, str]:
    """The CLI in this process, its stdout captured (the caller runs on ctl, outside pytest's capture)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    return code, buf.getvalue()


def _submit_and_wait(cluster) -> None:
    os.environ["SLURM_CONF"] = cluster.slurm_conf
    with drillable_set(cluster, 0) as (cfg_path, inv, set_id, seen, owner):
        code, text = _main(["--config", cfg_path, "restore-test", f"set:{set_id}", "--submit", "--deadline", "120",
                            "--queue-timeout", "120", "--json"])
        out = json.loads(text)
        assert code == 0, out
        assert out["result"] == "PASSED" and out["first_step"] == 42
        assert out["slurm_job_id"] and out["cleanup_errors"] == []
        assert not os.path.exists(out["namespace"])
        with inv.session() as repo:
            assert repo.get_set(set_id).state == S.VERIFIED
            (rt,) = restore_tests(repo, set_id)
            assert rt.result == "PASSED" and rt.slurm_job_id == out["slurm_job_id"]
        # Slurm ran it, as the owner, inside the drill's Slurm job.
        info = json.loads(seen.read_text())
        assert info == {"uid": owner.pw_uid, "slurm_job": str(out["slurm_job_id"])}


def test_submit_drill_runs_as_the_owner_under_slurm(cluster):
    cluster.on("ctl", _submit_and_wait, cluster)


def _submit_then_collect(cluster) -> None:
    os.environ["SLURM_CONF"] = cluster.slurm_conf
    with drillable_set(cluster, 50_000) as (cfg_path, inv, set_id, seen, owner):
        code, text = _main(["--config", cfg_path, "restore-test", f"set:{set_id}", "--submit", "--no-wait",
                            "--deadline", "120", "--json"])
        out = json.loads(text)
        assert code == 0 and out["result"] == "SUBMITTED" and out["slurm_job_id"]
        with inv.session() as repo:
            (rt,) = restore_tests(repo, set_id)
            assert rt.result == "RUNNING" and rt.slurm_job_id == out["slurm_job_id"]
            assert repo.get_set(set_id).state == S.COMPLETE
        end = time.monotonic() + 120
        while time.monotonic() < end:
            code, text = _main(["--config", cfg_path, "restore-test", "--collect"])
            assert code == 0
            if f"restore test {rt.id} of set {set_id}: PASSED" in text:
                break
            time.sleep(2)
        else:
            pytest.fail(f"--collect never recorded restore test {rt.id}: {text}")
        with inv.session() as repo:
            (rt,) = restore_tests(repo, set_id)
            assert (rt.result, rt.first_step) == ("PASSED", 42)
            assert repo.get_set(set_id).state == S.VERIFIED
            assert not os.path.exists(rt.target)
        assert json.loads(seen.read_text())["uid"] == owner.pw_uid


def test_submit_no_wait_then_collect(cluster):
    cluster.on("ctl", _submit_then_collect, cluster)
