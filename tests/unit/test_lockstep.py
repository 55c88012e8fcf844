"""Lockstep training (issue 14) with real PyTorch processes on this host:
examples/train.py as 2-3 DDP ranks over gloo on loopback, with the
environment srun gives its tasks, a temporary barrier directory and the real
client. No Slurm here (tests/integration/test_lockstep_cluster.py runs the
same on the dev cluster): the signals are sent the way slurmstepd sends them,
to every process of the rank (DataLoader workers included), or to a subset.

Needs torch (the `example` extra): a failure in CI, a skip elsewhere."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import forkserver
from slurm_snap.jobrecords import Ack

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "train.py")
JOB = "5151"
STEP = re.compile(r"^step (\d+) loss ")
PARAMS = re.compile(r"^params step (\d+) rank (\d+) ([0-9a-f]+)$")

pytestmark = pytest.mark.slow(30)   # seconds idle: the unit run starts this file early (tests/conftest.py)


@pytest.fixture(scope="module", autouse=True)
def torch_available():
    from realcomponents import require_torch

    require_torch()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    """One rank of train.py, in a session of its own (so it and its
    DataLoader workers form one process group, as a Slurm task does),
    forked from the session's fork server: torch is imported once, not by
    each of the ~25 ranks these tests start (tests/forkserver.py)."""

    def __init__(self, argv, env):
        self.proc = forkserver.get().popen(argv, env=env, cwd=REPO)
        self.lines: list[str] = []
        self.err: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def pump(self):
        while True:
            try:
                line = self._q.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.lines.append(line)

    def steps(self) -> list[int]:
        self.pump()
        return [int(m.group(1)) for line in self.lines if (m := STEP.match(line))]

    def params(self) -> dict[int, str]:
        self.pump()
        return {int(m.group(1)): m.group(3) for line in self.lines if (m := PARAMS.match(line))}

    def signal_all(self, sig=signal.SIGUSR1):
        """What slurmstepd does: every process of the task, children included."""
        os.killpg(self.proc.pid, sig)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Job:
    def __init__(self, tmp_path, world: int):
        self.tmp = tmp_path
        self.world = world
        self.barrier = tmp_path / "barrier"
        self.dir = self.barrier / JOB
        self.dir.mkdir(parents=True, mode=0o700)
        self.pfs = tmp_path / "pfs"
        self.pfs.mkdir()
        (self.dir / "job.json").write_text(json.dumps({
            "job_id": JOB, "restart_count": 0, "user": "u", "nodes": ["n1"],
            "volumes": [{"class": "pfs", "scope": "shared", "node": None, "path": str(self.pfs)}]}))
        self.ranks: list[Rank] = []

    def env(self, rank: int, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "CI", "MASTER_"))}
        if getattr(self, "slurm_bin", None):
            env["SLURM_SNAP_SLURM_BIN"] = self.slurm_bin
        # One node, `world` tasks: what srun sets for each task.
        env.update({"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "n1", "SLURM_PROCID": str(rank),
                    "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
                    "SLURM_STEP_TASKS_PER_NODE": str(self.world), "SLURM_STEP_NUM_TASKS": str(self.world),
                    "SLURM_SNAP_BARRIER_DIR": str(self.barrier), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), "PYTHONPATH": REPO,
                    "SLURM_SNAP_RESTORE_MARKER": str(self.tmp / f"marker-{rank}")})
        return env

    def start(self, *args: str) -> list[Rank]:
        port = free_port()
        self.ranks = [Rank([TRAIN, *args], self.env(r, port)) for r in range(self.world)]
        return self.ranks

    def wait(self, what, timeout: float = 90, every: float = 0.05):
        deadline = time.monotonic() + timeout
        while not (value := what()):
            for r in self.ranks:
                if r.proc.poll() not in (None, 0):
                    raise AssertionError(f"a rank died ({r.proc.returncode}): {''.join(r.err)[-3000:]}")
            assert time.monotonic() < deadline, f"timed out; last lines: {[r.lines[-3:] for r in self.ranks]}; " \
                                                f"stderr: {[''.join(r.err)[-800:] for r in self.ranks]}"
            time.sleep(every)
        return value

    def acks(self, epoch: str) -> dict[int, object]:
        out = {}
        for path in sorted((self.dir / "ack").glob("n1.*.json")) if (self.dir / "ack").is_dir() else []:
            raw = path.read_bytes()
            if json.loads(raw)["epoch"] == epoch:
                ack = Ack.from_bytes(raw, JOB, epoch)
                out[ack.rank] = ack
        return out

    def release(self, epoch: str):
        (self.dir / "release").mkdir(exist_ok=True)
        (self.dir / "release" / epoch).touch()

    def request(self, epoch: str):
        (self.dir / "request.json").write_text(json.dumps(
            {"job_id": JOB, "epoch": epoch, "requested_at": time.time(), "deadline": time.time() + 600}))

    def stop(self):
        for r in self.ranks:
            r.kill()


@pytest.fixture
def job(tmp_path):
    jobs = []

    def make(world: int) -> Job:
        jobs.append(Job(tmp_path / f"job{len(jobs)}", world))
        return jobs[-1]
    yield make
    for j in jobs:
        j.stop()


def all_acked(job: Job, epoch: str):
    acks = job.acks(epoch)
    return acks if len(acks) == job.world else None


def test_signal_to_one_rank_gives_one_step_for_all_and_training_goes_on(job):
    """The rank that sees the signal first must not enter a collective its
    peers never join: every rank checkpoints at the same step, nobody stalls,
    training resumes after the release with identical weights everywhere."""
    j = job(3)
    ranks = j.start("--steps", "100000", "--step-time", "0.05")
    j.wait(lambda: all(len(r.steps()) >= 5 for r in ranks))
    j.request("od-1")
    ranks[1].signal_all()                      # only rank 1 is asked
    acks = j.wait(lambda: all_acked(j, "od-1"))
    steps = {a.step for a in acks.values()}
    assert len(steps) == 1, {r: a.step for r, a in acks.items()}
    (step,) = steps
    assert all(a.agreement == "collective" and a.world_size == 3 and not a.independent for a in acks.values())
    # Rank 0 saved the job's model; the others had nothing of their own.
    assert [e.path for e in acks[0].manifest] == [str(j.pfs / "ckpt" / f"step-{step}" / "model.pt"),
                                                   str(j.pfs / "ckpt" / "latest")]
    assert acks[1].manifest == () and acks[2].manifest == ()
    # Held: nobody trains past the step until the release.
    time.sleep(0.5)
    assert all(max(r.steps()) == step for r in ranks), [max(r.steps()) for r in ranks]
    j.release("od-1")
    j.wait(lambda: all(max(r.steps()) >= step + 5 for r in ranks))
    digests = {r.params().get(step) for r in ranks}
    assert len(digests) == 1 and None not in digests, digests
    # One checkpoint for the one request: no second acknowledgement appeared.
    assert {a.step for a in j.acks("od-1").values()} == {step}


def test_a_stray_signal_to_every_rank_costs_nothing(job, tmp_path):
    """Issue 30 item 4: a SIGUSR1 with no request.json while Slurm shows no
    PreemptTime (here an scontrol standing in for Slurm's answer): rank 0's
    verdict rides in the step agreement, every rank ignores it at one step,
    nothing is acknowledged and training goes on at its pace."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho 'JobId={JOB} JobState=RUNNING PreemptTime=None Requeue=1'\n")
    (bin_dir / "scontrol").chmod(0o755)
    j = job(3)
    j.slurm_bin = str(bin_dir)
    ranks = j.start("--steps", "100000", "--step-time", "0.05")
    j.wait(lambda: all(len(r.steps()) >= 10 for r in ranks))
    for r in ranks:
        r.signal_all()
    j.wait(lambda: all(any("no slurm-snap request and no preemption: ignored" in e for e in r.err) for r in ranks))
    at = [max(r.steps()) for r in ranks]
    j.wait(lambda: all(max(r.steps()) >= a + 20 for r, a in zip(ranks, at)), timeout=30)
    assert j.acks("preempt-0") == {}
    ignored = [[e for e in r.err if "ignored" in e] for r in ranks]
    # One step for all: the same boundary on every rank.
    assert len({line[0].split(":")[1] for line in ignored}) == 1, ignored


def test_late_copy_of_the_signal_is_the_same_request_not_a_second_checkpoint(job):
    """Ranks 0 and 1 see the signal, rank 2 a step or more later (its copy
    arrives while the checkpoint is being served): still one step, one
    checkpoint, and nobody waits for a release that will never come."""
    j = job(3)
    ranks = j.start("--steps", "100000", "--step-time", "0.1")
    j.wait(lambda: all(len(r.steps()) >= 5 for r in ranks))
    j.request("od-2")
    ranks[0].signal_all()
    ranks[1].signal_all()
    acks = j.wait(lambda: all_acked(j, "od-2"))
    ranks[2].signal_all()                      # the late copy
    time.sleep(0.3)
    (step,) = {a.step for a in acks.values()}
    j.release("od-2")
    j.wait(lambda: all(max(r.steps()) >= step + 8 for r in ranks), timeout=60)
    # Still the one acknowledgement per rank of that step, and no new epoch
    # was acknowledged (a second checkpoint would have rewritten the acks
    # with preempt-0 and waited for a release nobody writes).
    assert {a.step for a in j.acks("od-2").values()} == {step}
    assert j.acks("preempt-0") == {}


def test_preemption_of_a_lockstep_job_then_resume_with_identical_weights(job, tmp_path):
    """Slurm's SIGUSR1 to every rank at slightly different times, then the
    end-of-grace SIGTERM: one step, clean exits; the requeued run resumes
    every rank at step + 1 from the snapshot's copy, weights identical."""
    j = job(2)
    ranks = j.start("--steps", "100000", "--step-time", "0.05")
    j.wait(lambda: all(len(r.steps()) >= 4 for r in ranks))
    ranks[0].signal_all()
    time.sleep(0.12)                            # about two steps later
    ranks[1].signal_all()
    acks = j.wait(lambda: all_acked(j, "preempt-0"))
    (step,) = {a.step for a in acks.values()}
    for r in ranks:
        r.signal_all(signal.SIGTERM)
    for r in ranks:
        assert r.proc.wait(timeout=60) == 0, "".join(r.err)[-2000:]
    # The snapshot: a copy of the checkpoint as acknowledged, then the live tree moves on.
    import shutil

    snapshot = tmp_path / "snap" / "ckpt"
    shutil.copytree(j.pfs / "ckpt", snapshot)
    (j.pfs / "ckpt" / "latest").write_text("step-999999/model.pt\n")   # live pointer goes elsewhere
    (j.dir / "resume.json").write_text(json.dumps(
        {"set_id": 1, "step": step, "checkpoint": {"live": str(j.pfs / "ckpt"), "snapshot": str(snapshot)}}))
    saved = {r.params()[step] for r in ranks}
    second = j.start("--steps", str(step + 4))
    for r in second:
        assert r.proc.wait(timeout=120) == 0, "".join(r.err)[-2000:]
        r.pump()
        assert f"resumed from step {step} ({snapshot / f'step-{step}' / 'model.pt'})" in r.lines, r.lines[:5]
        assert r.steps()[0] == step + 1
        assert f"SLURM_SNAP_FIRST_STEP {step + 1}" in r.lines
    after = {r.params()[step + 1] for r in second}
    assert len(saved) == 1 and len(after) == 1, (saved, after)


def test_independent_ranks_say_so_and_may_stop_at_their_own_steps(job):
    j = job(2)
    ranks = j.start("--steps", "100000", "--step-time", "0.05", "--independent")
    j.wait(lambda: all(len(r.steps()) >= 4 for r in ranks))
    ranks[0].signal_all()
    j.wait(lambda: j.acks("preempt-0").get(0))
    # Rank 1 trains on through rank 0's checkpoint (no agreement holds it),
    # then checkpoints a step of its own. Independent ranks start at their
    # own pace, so compare rank 1 with itself, not with rank 0.
    at_rank0_ack = ranks[1].steps()[-1]
    j.wait(lambda: ranks[1].steps()[-1] >= at_rank0_ack + 3)
    ranks[1].signal_all()
    acks = j.wait(lambda: all_acked(j, "preempt-0"))
    assert all(a.independent and a.agreement == "" for a in acks.values())
    assert acks[1].step >= at_rank0_ack + 3
    assert [os.path.basename(e.path) for e in acks[1].manifest] == ["rank-1.pt", "latest.rank-1"]


def test_dataloader_workers_started_with_spawn_survive_the_signal(job):
    """slurmstepd signals every process of the task: spawned DataLoader
    workers start with SIGUSR1's default action (death) unless the rank
    shields them; training must go on through the checkpoint."""
    j = job(2)
    ranks = j.start("--steps", "100000", "--step-time", "0.05", "--workers", "2", "--worker-start", "spawn")
    j.wait(lambda: all(len(r.steps()) >= 4 for r in ranks), timeout=120)
    j.request("od-3")
    for r in ranks:
        workers = subprocess.run(["pgrep", "-P", str(r.proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) >= 2, workers       # the workers exist and are the rank's children
        r.signal_all()
    acks = j.wait(lambda: all_acked(j, "od-3"))
    (step,) = {a.step for a in acks.values()}
    j.release("od-3")
    j.wait(lambda: all(max(r.steps()) >= step + 5 for r in ranks))
    assert all(r.proc.poll() is None for r in ranks)
    assert not any("exited unexpectedly" in "".join(r.err) for r in ranks)


def test_dcp_async_save_every_rank_acknowledges_its_own_shards_then_resumes(job):
    j = job(2)
    ranks = j.start("--steps", "100000", "--step-time", "0.05", "--dcp")
    j.wait(lambda: all(len(r.steps()) >= 4 for r in ranks))
    for r in ranks:
        r.signal_all()
    acks = j.wait(lambda: all_acked(j, "preempt-0"))
    (step,) = {a.step for a in acks.values()}
    target = j.pfs / "ckpt" / f"step-{step}" / "dcp"
    names = {r: sorted(os.path.basename(e.path) for e in a.manifest) for r, a in acks.items()}
    assert ".metadata" in names[0] and "latest" in names[0]
    for r, listed in names.items():
        # A rank names only its own shard files, each complete on disk.
        assert all(n.startswith(f"__{r}_") for n in listed if n.endswith(".distcp")), names
        for e in acks[r].manifest:
            assert os.path.getsize(e.path) == e.size
    assert sum(n.endswith(".distcp") for listed in names.values() for n in listed) >= 1
    assert {os.path.basename(p) for p in os.listdir(target)} >= {".metadata"}
    for r in ranks:
        r.signal_all(signal.SIGTERM)
        assert r.proc.wait(timeout=60) == 0, "".join(r.err)[-2000:]
    second = j.start("--steps", str(step + 3), "--dcp")
    for r in second:
        assert r.proc.wait(timeout=120) == 0, "".join(r.err)[-2000:]
        assert r.steps()[0] == step + 1, r.lines[:5]
    assert len({r.params()[step + 1] for r in second}) == 1


AGREE_SCRIPT = r"""
import datetime, os, signal, sys, time
import torch.distributed as dist
from slurm_snap.client import Checkpointer
rank, port, barrier = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
env = {"SLURM_JOB_ID": "61", "SLURMD_NODENAME": "n1", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
       "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NUM_TASKS": "2",
       "SLURM_SNAP_BARRIER_DIR": barrier}
ckpt = Checkpointer(env=env, agreement_timeout=3).install()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=20))
for step in range(1, 4):
    ckpt.decide(step)
if rank == 1:
    os._exit(0)            # gone without a word: the peer's next agreement cannot complete
t0 = time.monotonic()
step = 3
# The agreement paces its exchanges: the next one comes within max_pace boundaries.
while not ckpt.agreement_state.startswith("failed") and step < 40:
    step += 1
    ckpt.decide(step)
print("failure", round(time.monotonic() - t0, 1), ckpt.agreement_state, flush=True)
os.kill(os.getpid(), signal.SIGUSR1)
for step in range(step + 1, step + 100):
    time.sleep(0.01)
    if ckpt.decide(step).checkpoint:
        print("ack", ckpt.commit(step, []), flush=True)
        break
os._exit(0)
"""


def test_a_failed_agreement_does_not_hang_the_rank_and_its_ack_says_so(tmp_path):
    """A peer vanishes: the next agreement fails within its timeout, the rank
    goes on deciding alone, and its acknowledgement says the agreement failed,
    which the verdict refuses to call one point."""
    from slurm_snap.protocol.verdict import lockstep_problems

    barrier = tmp_path / "b"
    (barrier / "61").mkdir(parents=True)
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, "PYTHONPATH": REPO}
    script = tmp_path / "agree.py"
    script.write_text(AGREE_SCRIPT)
    procs = [forkserver.get().popen([script, str(r), str(port), str(barrier)], env=env, cwd=REPO) for r in (0, 1)]
    out, err = procs[0].communicate(timeout=120)
    procs[1].wait(timeout=30)
    assert procs[0].returncode == 0, err[-3000:]
    failure = next(line for line in out.splitlines() if line.startswith("failure"))
    seconds, state = float(failure.split()[1]), failure.split(" ", 2)[2]
    assert state.startswith("failed: ") and seconds < 20, failure
    ack_path = next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("ack "))
    ack = Ack.from_bytes(open(ack_path, "rb").read(), "61", "preempt-0")
    assert ack.agreement.startswith("failed: ") and ack.world_size == 2
    problems = lockstep_problems([ack])
    assert any("step agreement failed on ranks 0" in p for p in problems), problems


LAUNCHED = r"""
import os, signal, sys, time
blocked = signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
os.kill(os.getpid(), signal.SIGUSR1)     # what slurmstepd does to every process of the step
time.sleep(0.2)
print("alive", blocked, flush=True)
"""


def test_launch_shim_keeps_a_launcher_alive_through_the_signal():
    """`python -m slurm_snap.client.launch CMD`: CMD (torchrun's agent in a real
    job) holds the checkpoint signal blocked and lives; without the shim the
    same program dies of SIGUSR1."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, "PYTHONPATH": REPO}
    shim = subprocess.run([sys.executable, "-m", "slurm_snap.client.launch", sys.executable, "-c", LAUNCHED],
                          capture_output=True, text=True, timeout=60, env=env)
    assert (shim.returncode, shim.stdout.strip()) == (0, "alive True"), shim.stderr
    bare = subprocess.run([sys.executable, "-c", LAUNCHED], capture_output=True, text=True, timeout=60, env=env)
    assert bare.returncode == -signal.SIGUSR1
    missing = subprocess.run([sys.executable, "-m", "slurm_snap.client.launch", "/nonexistent/torchrun"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert missing.returncode == 127 and "/nonexistent/torchrun" in missing.stderr


PACE_SCRIPT = r"""
import datetime, json, sys, time
import torch.distributed as dist
from slurm_snap.client import Checkpointer
rank, port = int(sys.argv[1]), int(sys.argv[2])
env = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_STEP_TASKS_PER_NODE": "2",
       "SLURM_STEP_NUM_TASKS": "2"}
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
ckpt = Checkpointer(env=env, shield_children=False)
seen = []
for step in range(1, 81):
    time.sleep(0.02 if rank == 0 else 0.02 + 0.01 * (step % 3))   # unequal step times: each proposes its own
    ckpt.decide(step)
    seen.append(ckpt.agreement.exchanges)
ckpt.close()
print(json.dumps({"seen": seen, "pace": ckpt.agreement.pace, "state": ckpt.agreement_state}))
"""


def test_ranks_agree_on_the_pace_and_exchange_at_the_same_boundaries(tmp_path):
    """The agreement spaces its exchanges to stay within its budget of the
    step; the pace each rank uses is the MAX of what they proposed, so all
    exchange at the same boundaries (the collectives stay matched)."""
    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, "PYTHONPATH": REPO}
    script = tmp_path / "pace.py"
    script.write_text(PACE_SCRIPT)
    procs = [forkserver.get().popen([script, str(r), str(port)], env=env, cwd=REPO) for r in (0, 1)]
    out = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in out]
    a, b = (json.loads(o[0]) for o in out)
    assert a["state"] == b["state"] == "collective"
    assert a["seen"] == b["seen"] and a["pace"] == b["pace"]
    # More than one boundary apart once the cost was measured, never more than 16.
    assert 1 < a["pace"] <= 16 and a["seen"][-1] < 80
