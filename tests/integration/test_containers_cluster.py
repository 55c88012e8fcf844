"""Issue 33 item 2 on the multi-host dev cluster: DDP ranks inside Slurm's
OCI containers (`srun --container=BUNDLE`, oci.conf with Debian's runc,
rootless) take part in a preemption set and resume from it.

The bundle (testkit/oci.py) has no Slurm in it: no scontrol, no slurm.conf,
no munge socket. Mounted into it: the training environment (a venv with
torch and the slurm-snap client, read-only), the per-job barrier directory
and the job's volumes (read-write). Rank 0 cannot requeue the job itself:
it writes `asked`, and the node's slurm-snap hook outside the container
(started by the SPANK plugin on the step's first node) requeues it.
Asserted: the container really has no scontrol; one set, app-consistent,
every rank at one step; rank 0's request answered outside the container
(the set's release is early); the requeued run's ranks, again in
containers, resume at step + 1 with identical parameters."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_frameworks_cluster import _resumed
from test_lockstep_cluster import _preempted_one_point, _text, _wait

from testkit.cluster import user_ids
from testkit.oci import make_bundle

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _barrier_dir(cluster) -> str:
    proc = cluster.run([cluster.helper, "--config", cluster.config, "config", "get", "paths.barrier_dir"], host="n1")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def _early(cluster, jid: int, epoch: str):
    from slurm_snap.jobdir import JobDir

    return JobDir(_barrier_dir(cluster), jid).read_early(epoch)


def test_ddp_ranks_in_containers_are_preempted_as_one_point_released_early_and_resume(cluster):
    if not os.access("/usr/bin/runc", os.X_OK):
        from cluster import unavailable
        unavailable("runc is not installed (scripts/test installs it: TEST_PACKAGES)")
    uid, gid = user_ids(cluster.user)
    venv = os.path.dirname(os.path.dirname(cluster.python))
    started = time.perf_counter()
    bundle = make_bundle(cluster.user_dir() / f"bundle-{time.monotonic_ns()}", uid=uid, gid=gid, user=cluster.user,
                         venv=venv, rw=[_barrier_dir(cluster), str(cluster.pfs), str(cluster.scratch)])
    cold = time.perf_counter() - started
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(bundle)], check=True)
    sys.stderr.write(f"container bundle made in {cold * 1000:.0f} ms, "
                     f"{sum(f.stat().st_size for f in bundle.rglob('*') if f.is_file())} bytes\n")
    train = cluster.write_user_file("container-train.py", (REPO / "examples" / "train.py").read_text(), mode=0o755)
    out = cluster.make_user_dir(f"containers-{time.monotonic_ns()}")
    check = ("import os, shutil; print('container: scontrol', shutil.which('scontrol'), 'slurm.conf', "
             "os.path.exists('/etc/slurm'), 'munge', os.path.exists('/run/munge'), 'task', "
             "os.environ.get('SLURM_PROCID'), os.environ.get('SLURMD_NODENAME'))")
    script = f"""#!/bin/bash
srun --container={bundle} {cluster.python} -c "{check}"
srun --container={bundle} {cluster.python} {train} --steps 100000 --step-time 0.25 --release-timeout 60
"""
    jid = cluster.sbatch("-N3", "--ntasks-per-node=1", "-c1", "-p", "low", "--requeue", "--open-mode=append",
                         "--snapshot-on-preempt", "--snapshot-volumes=scratch,pfs", "-o", f"{out}/slurm-%j.out",
                         script=script)
    log = out / f"slurm-{jid}.out"
    try:
        cluster.wait_state(jid, "RUNNING", timeout=90)
        _wait(lambda: len(re.findall(r"^container: ", _text(log), re.M)) >= 3, 120,
              lambda: f"the container step did not run:\n{_text(log)[-4000:]}")
        seen = re.findall(r"^container: scontrol None slurm.conf False munge False task (\d+) (\S+)$", _text(log), re.M)
        assert len(seen) == 3, _text(log)[-3000:]       # nothing of Slurm's inside
        if cluster.slurm_version.startswith("22.05"):
            # Slurm 22.05 writes one config.json per step, before the tasks'
            # own variables exist (setup_container(), not per task as from
            # 23.02 on): every task's container gets the environment srun
            # inherited from the batch script, SLURM_PROCID=0 on the batch
            # host, so no rank can know its identity. Measured here; the DDP
            # part of this test runs on the newer Slurm (CI's second tier).
            assert set(seen) == {("0", "n1")}, seen
            return
        assert sorted(seen) == [("0", "n1"), ("1", "n2"), ("2", "n3")], seen
        _wait(lambda: sum(ln.startswith("step ") for ln in _text(log).splitlines()) >= 3 * 4, 240,
              lambda: f"training did not start in the containers:\n{_text(log)[-4000:]}\n"
                      f"{cluster.daemon_log('slurmd', host='n1')[-3000:]}")
        set_id, step = _preempted_one_point(cluster, jid, world=3)

        decision = _early(cluster, jid, "preempt-0")
        assert decision is not None and decision.decision in ("requeued", "requeueing"), decision
        release = cluster.inventory(lambda repo, sid: repo.get_set(sid).release, set_id)
        assert release == "early", (release, decision)

        _resumed(cluster, jid, log, step)
    finally:
        cluster.cancel(jid)
