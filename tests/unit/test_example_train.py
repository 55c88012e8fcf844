"""examples/train.py end to end against a temporary barrier directory:
signal -> checkpoint -> ack -> (held) -> release -> continue; then resume.
Needs torch (the `example` extra): a failure in CI, a skip elsewhere."""
from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

import forkserver
from slurm_snap.jobrecords import Ack

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "train.py")
JOB = "4242"
STEP = re.compile(r"^step (\d+) loss \d+\.\d+$")

pytestmark = pytest.mark.slow(14)   # seconds idle: the unit run starts this file early (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def torch_available():
    from realcomponents import require_torch

    require_torch()


class Run:
    """train.py as a child process, stdout lines collected by a thread: forked
    from the session's fork server (torch imported once: tests/forkserver.py),
    or with `fresh` a new interpreter, as the first start of the first test
    keeps it so the real start path stays covered."""

    def __init__(self, args, env, *, fresh: bool = False):
        if fresh:
            self.proc = subprocess.Popen([sys.executable, TRAIN, *args], env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, cwd=REPO)
        else:
            self.proc = forkserver.get().popen([TRAIN, *args], env=env, cwd=REPO)
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        """Next line matching `pattern`; fails on timeout or end of output."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout} s; got {self.lines[-5:]}")
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"output ended without {pattern!r}: {self.lines[-5:]}; "
                                     f"stderr: {self.proc.stderr.read()[-2000:]}")
            self.lines.append(line)
            match = re.match(pattern, line)
            if match:
                return match

    def drain(self) -> list[str]:
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return self.lines
            if line is not None:
                self.lines.append(line)

    def finish(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def job(tmp_path):
    barrier = tmp_path / "barrier"
    job_dir = barrier / JOB
    job_dir.mkdir(parents=True, mode=0o700)
    pfs = tmp_path / "pfs"
    pfs.mkdir()
    (job_dir / "job.json").write_text(json.dumps({
        "job_id": JOB, "restart_count": 0, "user": "u", "nodes": ["n1"],
        "volumes": [{"class": "pfs", "scope": "shared", "node": None, "path": str(pfs)}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CI"))}
    env.update({"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "n1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_SNAP_BARRIER_DIR": str(barrier),
                "SLURM_SNAP_RESTORE_MARKER": str(tmp_path / "marker"), "PYTHONPATH": REPO})
    runs = []

    def start(*args, fresh: bool = False):
        runs.append(Run(list(args), env, fresh=fresh))
        return runs[-1]

    yield start, job_dir, pfs / "ckpt", tmp_path
    for run in runs:
        run.kill()


def wait_for_file(path, timeout=30):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)


def test_preemption_ack_release_and_resume(job):
    start, job_dir, ckpt_dir, tmp = job
    run = start("--steps", "10000", "--step-time", "0.05", fresh=True)
    run.wait_for(r"^step 3 ")
    run.proc.send_signal(signal.SIGUSR1)
    ack_path = job_dir / "ack" / "n1.0.json"
    wait_for_file(ack_path)
    ack = Ack.from_bytes(ack_path.read_bytes(), JOB, "preempt-0")
    assert ack.step >= 3 and ack.local_size == 1
    weights = ckpt_dir / f"step-{ack.step}" / "model.pt"
    assert {e.path for e in ack.manifest} == {str(weights), str(ckpt_dir / "latest")}
    for entry in ack.manifest:
        assert os.path.getsize(entry.path) == entry.size > 0
    # Held at the barrier: no step after the acknowledged one until the release.
    time.sleep(0.5)
    steps = [int(m.group(1)) for line in run.drain() if (m := STEP.match(line))]
    assert steps[-1] == ack.step and run.proc.poll() is None
    (job_dir / "release").mkdir()
    (job_dir / "release" / "preempt-0").touch()
    run.wait_for(rf"^step {ack.step + 1} loss ", timeout=10)
    run.wait_for(rf"^step {ack.step + 3} loss ", timeout=10)
    # After a served preemption checkpoint, SIGTERM ends the rank cleanly.
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 0
    assert not list((job_dir / "ack").glob(".*"))  # no temporary files left

    # The requeued run resumes from the newest checkpoint in the checkpoint dir.
    second = start("--steps", str(ack.step + 3))
    second.wait_for(rf"^resumed from step {ack.step} \({re.escape(str(weights))}\)$", timeout=60)
    first = second.wait_for(r"^step (\d+) ")
    assert int(first.group(1)) == ack.step + 1
    second.wait_for(rf"^SLURM_SNAP_FIRST_STEP {ack.step + 1}$")
    assert second.finish() == 0
    assert (tmp / "marker").read_text() == f"SLURM_SNAP_FIRST_STEP {ack.step + 1}\n"


def test_on_demand_then_sigterm_only_preemption_then_resume_json(job):
    start, job_dir, ckpt_dir, tmp = job
    (job_dir / "request.json").write_text(json.dumps(
        {"job_id": JOB, "epoch": "od-1", "requested_at": time.time(), "deadline": time.time() + 600}))
    run = start("--steps", "10000", "--step-time", "0.05", "--checkpoint-every", "2")
    run.wait_for(r"^step 2 ")
    run.proc.send_signal(signal.SIGUSR1)
    ack_path = job_dir / "ack" / "n1.0.json"
    wait_for_file(ack_path)
    on_demand = Ack.from_bytes(ack_path.read_bytes(), JOB, "od-1")
    (job_dir / "release").mkdir()
    (job_dir / "release" / "od-1").touch()
    run.wait_for(rf"^step {on_demand.step + 2} ", timeout=10)  # continues after an on-demand snapshot

    # A cluster that sends only SIGTERM at preemption: the first one is a checkpoint request.
    os.remove(ack_path)
    run.proc.send_signal(signal.SIGTERM)
    wait_for_file(ack_path)
    preempt = Ack.from_bytes(ack_path.read_bytes(), JOB, "preempt-0")
    assert preempt.step > on_demand.step
    # The end-of-grace SIGTERM stops the wait and the rank exits cleanly.
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=10) == 0

    # resume.json (written by the Prolog of the requeued run) wins over the newer
    # periodic checkpoints in the live directory: resume from the snapshot copy.
    snapshot = tmp / "snap" / "ckpt"
    shutil.copytree(ckpt_dir / f"step-{on_demand.step}", snapshot / f"step-{on_demand.step}")
    (job_dir / "resume.json").write_text(json.dumps(
        {"set_id": 1, "step": on_demand.step, "checkpoint": {"live": str(ckpt_dir), "snapshot": str(snapshot)}}))
    second = start("--steps", str(on_demand.step + 2))
    second.wait_for(rf"^resumed from step {on_demand.step} \({re.escape(str(snapshot))}/", timeout=60)
    assert int(second.wait_for(r"^step (\d+) ").group(1)) == on_demand.step + 1
    assert second.finish() == 0


def test_ignore_signal_never_acknowledges(job):
    start, job_dir, _, _ = job
    run = start("--steps", "10000", "--step-time", "0.05", "--ignore-signal")
    first = int(run.wait_for(r"^step (\d+) ").group(1))
    run.proc.send_signal(signal.SIGUSR1)
    run.wait_for(rf"^step {first + 10} ", timeout=20)  # kept training through the request
    assert not (job_dir / "ack").exists()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == -signal.SIGTERM
