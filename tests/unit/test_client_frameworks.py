"""The framework callbacks' pieces without a cluster (issue 33 items 3 and 4):
where checkpoints go (the job's declared volumes, refused with the reason
when none can hold them, no class name assumed), which files of a Hugging
Face checkpoint each rank acknowledges, what `slurm-snap resume-path`
prints, and the SIGTERM a Lightning run must not see before its checkpoint.
tests/integration/test_training_jobs_cluster.py runs each framework for real."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from realcomponents import require_module
from slurm_snap import errors
from slurm_snap.cli import main
from slurm_snap.client import Checkpointer
from slurm_snap.jobdir import JobDir
from slurm_snap.jobrecords import JobRecord, ResumeRank, ResumeRecord, VolumeRecord

JOB = "55"


pytestmark = pytest.mark.slow(25)   # seconds idle: the unit run starts this file early (tests/conftest.py)


def job_env(tmp_path, volumes) -> dict:
    jd = JobDir(str(tmp_path / "barrier"), JOB)
    jd.ensure(os.getuid())
    jd.write_job(JobRecord(job_id=int(JOB), restart_count=0, user="u", nodes=("n1", "n2"), signal="USR1",
                           volumes=tuple(volumes)))
    return {"SLURM_JOB_ID": JOB, "SLURM_SNAP_BARRIER_DIR": str(tmp_path / "barrier"), "SLURMD_NODENAME": "n1"}


SCRATCH = [VolumeRecord(path=f"/scratch/{n}/jobs/55", scope="node-local", volume_class="scratch", node=n)
           for n in ("n1", "n2")]


def test_checkpoints_go_to_the_first_shared_volume_the_job_declared_whatever_its_class(tmp_path):
    env = job_env(tmp_path, SCRATCH + [VolumeRecord(path="/lustre/u/run7", scope="shared", volume_class="lustre"),
                                       VolumeRecord(path="/pfs/jobs/55", scope="shared", volume_class="pfs")])
    k = Checkpointer(env=env)
    assert k.checkpoint_dir() == "/lustre/u/run7/ckpt" and k.checkpoint_dir("hf") == "/lustre/u/run7/hf"
    assert k.covers("/lustre/u/run7/ckpt/step-3/model.ckpt") and k.covers("/scratch/n1/jobs/55/x")
    assert not k.covers("/scratch/n2/jobs/55/x")        # another node's volume is not on this node
    assert not k.covers(str(tmp_path / "lightning_logs"))


@pytest.mark.parametrize("volumes, why", [
    ([], "declared no volume"),
    (SCRATCH, "only node-local volumes (scratch)"),
])
def test_no_volume_that_can_hold_them_is_refused_with_the_reason(tmp_path, volumes, why):
    k = Checkpointer(env=job_env(tmp_path, volumes))
    with pytest.raises(errors.CheckpointDirError, match=r"job 55: .*" + why.replace("(", r"\(").replace(")", r"\)")):
        k.checkpoint_dir()


def test_outside_slurm_snap_the_working_directory_and_in_a_drill_the_restored_volume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Checkpointer(env={}).checkpoint_dir() == str(tmp_path / "ckpt")
    restored = tmp_path / "clone"
    (restored / "ckpt").mkdir(parents=True)
    drill = {"SLURM_SNAP_RESTORE": "1", "SLURM_SNAP_RESTORE_MAP": json.dumps({"/pfs/jobs/55": str(restored),
                                                                              "/scratch/n1/x": str(tmp_path)})}
    assert Checkpointer(env=drill).checkpoint_dir() == str(restored / "ckpt")
    with pytest.raises(errors.CheckpointDirError, match="holds hf/"):
        Checkpointer(env=drill).checkpoint_dir("hf")


def test_each_rank_acknowledges_the_files_of_a_trainer_checkpoint_it_wrote(tmp_path):
    require_module("transformers", "hf")
    from slurm_snap.client.huggingface import own_files

    d = tmp_path / "checkpoint-12"
    (d / "sub").mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth",
                 "rng_state_2.pth", "sub/extra.bin"):
        (d / name).write_bytes(b"x")
    names = lambda rank: [os.path.relpath(p, d) for p in own_files(str(d), rank)]  # noqa: E731
    assert names(0) == ["model.safetensors", "optimizer.pt", "rng_state_0.pth", "sub/extra.bin",
                        "trainer_state.json"]
    assert names(2) == ["rng_state_2.pth"] and names(5) == []


def test_resume_path_prints_what_this_run_resumes_from(tmp_path, monkeypatch, capsys):
    env = job_env(tmp_path, SCRATCH)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert main(["resume-path"]) == 0 and capsys.readouterr().out == ""      # a fresh start: nothing
    JobDir(env["SLURM_SNAP_BARRIER_DIR"], JOB).write_resume(ResumeRecord(
        set_id=4, step=120, live="/pfs/ckpt/step-120", snapshot="/pfs/.snapshots/s4/ckpt/step-120",
        ranks=(ResumeRank(rank=1, node="n2", from_node="n2", live="/scratch/n2/c", checkpoint="/scratch/n2/.s/c"),),
        missing=()))
    assert main(["resume-path"]) == 0 and capsys.readouterr().out == "/pfs/.snapshots/s4/ckpt/step-120\n"
    assert main(["resume-path", "--rank", "1"]) == 0 and capsys.readouterr().out == "/scratch/n2/.s/c\n"
    assert main(["resume-path", "--step"]) == 0 and capsys.readouterr().out == "120\n"
    assert main(["resume-path", "--json"]) == 0 and json.loads(capsys.readouterr().out)["set_id"] == 4
    # The client alone (a container with only its wheel) answers the same.
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-m", "slurm_snap.client.resume_path", "--step"], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": repo}, timeout=60)
    assert (out.returncode, out.stdout) == (0, "120\n"), out.stderr
    with open(os.path.join(env["SLURM_SNAP_BARRIER_DIR"], JOB, "resume.json"), "w") as f:
        f.write('{"set_id": 4}')
    assert main(["resume-path"]) == 2 and "resume.json" in capsys.readouterr().err


class Compose:
    """Lightning's _HandlersCompose: a list of handlers called in turn."""

    def __init__(self, handlers):
        self.signal_handlers = handlers

    def __call__(self, signum, frame):
        for h in self.signal_handlers:
            h(signum, frame)


def test_a_framework_that_stops_at_sigterm_does_not_see_the_one_that_asks_for_the_checkpoint():
    """Lightning composes its SIGTERM handler around ours; the callback puts
    ours first again, holding back the first SIGTERM (a checkpoint request
    on SIGTERM-only sites) and passing on the one that ends the job."""
    require_module("lightning", "example")
    from slurm_snap.client.lightning import _without

    ckpt = Checkpointer(signals=["SIGUSR1", "SIGTERM"], shield_children=False, env={})
    flag = ckpt._flag                                       # the test reads what the handler recorded
    lightning_saw = []
    before = signal.getsignal(signal.SIGTERM)
    try:
        ckpt.install()
        lightning = Compose([lambda s, f: lightning_saw.append(s), flag.handler])
        signal.signal(signal.SIGTERM, lightning)            # what Lightning does after setup()
        signal.signal(signal.SIGUSR1, lambda s, f: lightning_saw.append(s))   # an auto-requeue's
        ckpt.take_signals_back(chain_sigterm_to=_without)   # what on_train_start does
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.pending and lightning_saw == []         # SIGUSR1 is ours alone
        flag.clear(flag.requests, after_preempt=False)
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.pending and not flag.terminating and lightning_saw == []
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.terminating and lightning_saw == [signal.SIGTERM]
        assert flag.sigterm_count == 2                      # ours ran once per signal, not twice
    finally:
        ckpt.uninstall()
        after = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, before)
    # uninstall() puts back what install() found, not Lightning's stand-in
    # (which would swallow pytest's SIGTERM), and no SIGTERM is held back.
    assert after == before and not flag.hold_request_sigterm


LIGHTNING_RUN = """
import os, signal, sys
import lightning.pytorch as L
from lightning.pytorch.demos.boring_classes import BoringModel
from slurm_snap.client.lightning import SnapshotCallback

snap = SnapshotCallback()
class Ask(L.Callback):
    def on_train_batch_end(self, trainer, *a):
        if trainer.global_step == 3 and sys.argv[1] == "first":
            os.kill(os.getpid(), signal.SIGUSR1)
trainer = L.Trainer(accelerator="cpu", max_steps=8, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, enable_checkpointing=False, callbacks=[snap, Ask()])
resume = snap.resume_path()
trainer.fit(BoringModel(), ckpt_path=resume)
print("saved", [s for s, _p in snap.saved], "resumed", snap.resumed_step, "at", trainer.global_step)
"""


def test_outside_slurm_snap_a_signal_is_one_checkpoint_and_the_next_run_resumes_from_it(tmp_path):
    """No job directory: the callback still checkpoints on the signal, once
    (nobody releases it), in ./ckpt, and resume_path() finds it."""
    require_module("lightning", "example")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SBATCH"))}, "PYTHONPATH": repo}

    def run(which):
        out = subprocess.run([sys.executable, "-c", LIGHTNING_RUN, which], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout.strip().splitlines()[-1]
    first = run("first")
    saved = first.split("[")[1].split("]")[0]
    assert saved.isdigit() and "resumed None at 8" in first, first
    assert run("second") == f"saved [] resumed {saved} at 8"


def test_lightnings_own_checkpoints_outside_the_declared_volumes_are_said_once(tmp_path):
    """ModelCheckpoint (on by default) writes under default_root_dir: where no
    volume is, no snapshot holds it. Said at fit()'s start, with the fix."""
    require_module("lightning", "example")
    from types import SimpleNamespace

    from slurm_snap.client.lightning import SnapshotCallback

    shared = tmp_path / "pfs"
    env = job_env(tmp_path, [VolumeRecord(path=str(shared), scope="shared", volume_class="pfs")])
    snap = SnapshotCallback(env=env)

    def trainer(root, dirpath=None):
        return SimpleNamespace(checkpoint_callbacks=[SimpleNamespace(dirpath=dirpath)], default_root_dir=root)
    with pytest.warns(UserWarning, match=r"writes under .*lightning_logs, outside the job's declared volumes.*"
                                         r"default_root_dir=snap.checkpoint_dir\(\)"):
        snap._warn_outside_volumes(trainer(str(tmp_path / "lightning_logs")))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        snap._warn_outside_volumes(trainer(str(shared / "ckpt")))
        snap._warn_outside_volumes(trainer(str(tmp_path), dirpath=str(shared / "mc")))
