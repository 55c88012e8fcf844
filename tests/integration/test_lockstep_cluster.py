"""Issue 14 on the multi-host dev cluster: lockstep (DDP) training jobs as
GPU sites run them, on CPU with gloo, through srun, torchrun and Lightning.

Each job runs on 3 nodes x 2 ranks. What is asserted, every time: one set,
app-consistent, every rank acknowledged the same step; the requeued run
resumes every rank at that step + 1 holding identical parameters (a checksum
printed by every rank); nobody stalls (training goes on after an on-demand
release). The coordinator runs on ctl as root; jobs are the test user's."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from testkit.inventory_helpers import sets_of_job

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RANK_LINE = re.compile(r"^rank (\d+) pid (\d+) node (\S+) world (\d+)$", re.M)
PARAMS = re.compile(r"^params step (\d+) rank (\d+) ([0-9a-f]+)$", re.M)
RESUMED = re.compile(r"^resumed from step (\d+) \((.*)\)$", re.M)

SRUN = """#!/bin/bash
srun {python} {train} --steps 100000 --step-time 0.25 --release-timeout 60 {extra}
"""
TORCHRUN = """#!/bin/bash
MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun /bin/bash -c "exec {python} -m slurm_snap.client.launch {python} -m torch.distributed.run \\
    --nnodes=\\$SLURM_NNODES --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=$MASTER:29400 \\
    --rdzv-id=\\$SLURM_JOB_ID-\\${{SLURM_RESTART_COUNT:-0}} --local-addr=\\$SLURMD_NODENAME \\
    {train} --steps 100000 --step-time 0.25 --release-timeout 60 {extra}"
"""


def _cli(cluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return cluster.cli(*args, host="ctl", timeout=timeout)


def _text(log: Path) -> str:
    return log.read_text(errors="replace") if log.exists() else ""


def _wait(what, timeout: float, why: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, why() if callable(why) else why
        time.sleep(every)
    return value


def _start(cluster, name: str, template: str, *sbatch: str, program: str = "train.py", extra: str = "",
           per_node: int = 2) -> tuple[int, Path, Path]:
    train = cluster.write_user_file(f"{name}-{program}", (REPO / "examples" / program).read_text(), mode=0o755)
    out = cluster.make_user_dir(f"lockstep-{name}-{time.monotonic_ns()}")
    layout = ["--ntasks-per-node=2", "-c1"] if per_node == 2 else ["--ntasks-per-node=1", "-c2"]
    jid = cluster.sbatch(*sbatch, "-N3", *layout, "--snapshot-volumes=scratch,pfs", "-o", f"{out}/slurm-%j.out",
                         script=template.format(train=train, python=cluster.python, extra=extra))
    log = out / f"slurm-{jid}.out"
    try:
        cluster.wait_state(jid, "RUNNING", timeout=90)
        _wait(lambda: len(re.findall(r"^step \d+", _text(log), re.M)) >= 6 * 4, 180,
              lambda: f"training did not start:\n{_text(log)[-3000:]}")
    except BaseException:
        cluster.cancel(jid)
        raise
    return jid, log, train


def _acks(repo, set_id: int):
    return [(a.node, a.rank, a.local_rank, a.local_size, a.step, a.world_size, a.agreement, a.independent)
            for a in repo.acks(set_id)]


def _set(repo, set_id: int):
    st = repo.get_set(set_id)
    return st.state, st.consistency, st.reason, st.checkpoint_step, st.epoch


def _preempt_sets(repo, jid: int):
    return [(s.id, s.state, s.consistency, s.reason, s.checkpoint_step, s.epoch)
            for s in sets_of_job(repo, jid) if s.trigger == "preempt"]


def _one_point(cluster, set_id: int, world: int = 6) -> int:
    """The set's acknowledgements: every rank once, one step, agreed collectively."""
    acks = cluster.inventory(_acks, set_id)
    assert sorted(a[1] for a in acks) == list(range(world)), acks
    assert Counter(a[0] for a in acks) == {"n1": world // 3, "n2": world // 3, "n3": world // 3}, acks
    assert {a[3] for a in acks} == {world // 3} and {a[5] for a in acks} == {world}, acks
    assert {a[6] for a in acks} == {"collective"} and not any(a[7] for a in acks), acks
    steps = {a[4] for a in acks}
    assert len(steps) == 1, acks
    return steps.pop()


def _snapshot(cluster, jid: int) -> dict:
    proc = _cli(cluster, "snapshot", str(jid), "--json", "--deadline", "60")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(proc.stdout)
    assert (res["state"], res["consistency"]) == ("COMPLETE", "app-consistent"), res
    return res


LOSS = re.compile(r"^step \d+ loss [\d.]+$")


def _steps_after(log: Path, step: int) -> int:
    return sum(int(n) > step for n in re.findall(r"^step (\d+) loss", _text(log), re.M))


def _preempted_one_point(cluster, jid: int, world: int = 6) -> tuple[int, int]:
    """Preempt; the one preemption set is COMPLETE app-consistent at one step."""
    cluster.preempt()
    return _one_preemption_point(cluster, jid, world)


def _one_preemption_point(cluster, jid: int, world: int = 6) -> tuple[int, int]:
    """The job's one preemption set is COMPLETE app-consistent at one step."""
    found = _wait(lambda: [s for s in cluster.inventory(_preempt_sets, jid)
                           if s[1] not in ("PENDING", "QUIESCING", "CUTTING", "CUT")], 180,
                  lambda: f"no finished preemption set; hook log:\n{cluster.hook_log()[-4000:]}")
    assert len(found) == 1, found
    set_id, state, consistency, reason, step, epoch = found[0]
    assert (state, consistency, epoch) == ("COMPLETE", "app-consistent", "preempt-0"), reason
    assert _one_point(cluster, set_id, world) == step
    return set_id, step


def _preempt_and_resume(cluster, jid: int, log: Path, world: int = 6) -> tuple[int, int]:
    """Preempt (one set, one point); wait for every rank of the requeued run to
    resume at its step + 1 with identical parameters."""
    set_id, step = _preempted_one_point(cluster, jid, world)
    before = len(RESUMED.findall(_text(log)))

    def resumed():
        text = _text(log)
        after = text[text.find("resumed from step"):] if "resumed from step" in text else ""
        firsts = {r for s, r, _h in PARAMS.findall(after) if int(s) == step + 1}
        return len(RESUMED.findall(text)) >= world and len(firsts) >= world
    _wait(resumed, 240, lambda: "requeued run did not resume every rank; the log without its loss lines:\n"
          + "\n".join(ln for ln in _text(log).splitlines() if not LOSS.match(ln))[-6000:])
    text = _text(log)
    got = RESUMED.findall(text)
    assert len(got) >= world and before == 0
    assert {int(s) for s, _src in got} == {step}, got
    assert all("/.snapshots/" in src for _s, src in got), got           # from the snapshot's copy
    first_steps = PARAMS.findall(text[text.find("resumed from step"):])
    at_resume = {h for s, r, h in first_steps if int(s) == step + 1}
    ranks = {int(r) for s, r, h in first_steps if int(s) == step + 1}
    assert ranks == set(range(world)) and len(at_resume) == 1, first_steps
    markers = Counter(int(n) for n in re.findall(r"^SLURM_SNAP_FIRST_STEP (\d+)$", text, re.M))
    assert markers[step + 1] >= world, markers
    return set_id, step


def _snapshot_signalling(config: str, jid: int, first: list[int], later: list[int]) -> dict:
    """The real coordinator on ctl, whose one signal reaches `first` at once,
    `later` only once every rank has acknowledged (their copy is late: it
    comes while the checkpoint is being served, before the release) and every
    other rank never (pids are global: the hosts share one PID namespace)."""
    from slurm_snap.config import load
    from slurm_snap.inventory.repository import Inventory
    from slurm_snap.protocol.coordinator import Coordinator

    def signaller(_job_id: int) -> None:
        for pid in first:
            os.kill(pid, signal.SIGUSR1)

    def hook(phase: str) -> None:
        if phase == "barrier":
            for pid in later:
                os.kill(pid, signal.SIGUSR1)
    cfg = load(config)
    inv = Inventory.from_config(cfg)
    try:
        out = Coordinator(cfg, inv, signaller=signaller, hook=hook).snapshot(jid, consistency="app", deadline=60)
        return out.as_dict()
    finally:
        inv.dispose()


def _ranks(log: Path) -> dict[int, tuple[int, str]]:
    """rank -> (pid, node) of the run in progress (the newest line per rank)."""
    return {int(r): (int(p), n) for r, p, n, _w in RANK_LINE.findall(_text(log))}


def test_ddp_job_with_dataloader_workers_on_demand_late_ranks_subset_then_preemption(cluster):
    """One DDP job through everything that used to break lockstep training:
    DataLoader workers started with spawn (Slurm's signal reaches them too),
    an on-demand snapshot, a signal that reaches n1 a step before the others,
    one that reaches a subset only, then preemption and the resume."""
    jid, log, _train = _start(cluster, "ddp", SRUN, "-p", "low", "--requeue", "--open-mode=append",
                              "--snapshot-on-preempt", extra="--workers 1 --worker-start spawn")
    try:
        # 1. On demand: one `scancel --signal` to every process of every rank.
        res = _snapshot(cluster, jid)
        step1 = _one_point(cluster, res["set_id"])
        assert res["checkpoint_step"] == step1
        _wait(lambda: _steps_after(log, step1) >= 6 * 5, 60, "training did not go on after the release")
        assert "exited unexpectedly" not in _text(log)      # no DataLoader worker died of SIGUSR1

        # 2. A late rank and a subset, signalled by hand as a slow network would:
        # the coordinator's request first, then the ranks on n1 at once, those on
        # n2 a second later, n3 never. Still one step; nobody waits forever.
        ranks = _ranks(log)
        assert sorted(ranks) == list(range(6)), ranks
        res2 = cluster.on("ctl", _snapshot_signalling, cluster.config, jid,
                          [pid for pid, node in ranks.values() if node == "n1"],
                          [pid for pid, node in ranks.values() if node == "n2"], timeout=180)
        assert (res2["state"], res2["consistency"]) == ("COMPLETE", "app-consistent"), res2
        step2 = _one_point(cluster, res2["set_id"])
        assert step2 > step1
        _wait(lambda: _steps_after(log, step2) >= 6 * 5, 60, "training did not go on after the second release")

        # 3. Preemption, requeue, resume.
        _set_id, step3 = _preempt_and_resume(cluster, jid, log)
        assert step3 > step2
    finally:
        cluster.cancel(jid)


def test_torchrun_job_is_preempted_as_one_point_and_resumes(cluster):
    """srun starts one torchrun agent per node (through client.launch), each
    with 2 workers that take their identity from torchrun: a node's barrier
    waits for both workers, and the agent survives Slurm's SIGUSR1."""
    jid, log, _train = _start(cluster, "torchrun", TORCHRUN, "-p", "low", "--requeue", "--open-mode=append",
                              "--snapshot-on-preempt", per_node=1)
    try:
        ranks = _ranks(log)
        assert sorted(ranks) == list(range(6)) and Counter(n for _p, n in ranks.values()) == \
            {"n1": 2, "n2": 2, "n3": 2}, ranks
        _preempt_and_resume(cluster, jid, log)
    finally:
        cluster.cancel(jid)


def test_dcp_async_save_job_every_rank_acknowledges_its_own_shards(cluster):
    jid, log, _train = _start(cluster, "dcp", SRUN, extra="--dcp")
    try:
        res = _snapshot(cluster, jid)
        step = _one_point(cluster, res["set_id"])
        acks = cluster.inventory(lambda repo, sid: [(a.rank, [e["path"] for e in a.manifest])
                                                    for a in repo.acks(sid)], res["set_id"])
        names = {rank: [os.path.basename(p) for p in paths] for rank, paths in acks}
        assert ".metadata" in names[0], names
        for rank, listed in names.items():
            assert all(n.startswith(f"__{rank}_") for n in listed if n.endswith(".distcp")), names
            assert all(f"/step-{step}/dcp/" in p or p.endswith("/latest") for p in dict(acks)[rank]), acks
        _wait(lambda: _steps_after(log, step) >= 6 * 3, 60, "training did not go on after the release")
    finally:
        cluster.cancel(jid)


def _restart_count(cluster, jid: int) -> int:
    job = cluster.job(jid)
    return job.restart_count if job is not None else -1


def test_lightning_job_with_its_auto_requeue_gives_one_checkpoint_one_requeue_one_set(cluster):
    """Lightning's SLURM auto-requeue (on by default) also wants SIGUSR1: with
    slurm-snap's callback the preemption still gives exactly one checkpoint,
    one requeue (Slurm's) and one set, and the requeued run resumes from it."""
    jid, log, _train = _start(cluster, "lightning", SRUN.replace("--release-timeout 60 ", ""), "-p", "low",
                              "--requeue", "--open-mode=append", "--snapshot-on-preempt", program="train_lightning.py")
    try:
        _set_id, step = _preempted_one_point(cluster, jid)
        _wait(lambda: len(RESUMED.findall(_text(log))) >= 6 and _steps_after(log, step) >= 6, 240,
              lambda: f"the requeued run did not resume:\n{_text(log)[-4000:]}")
        resumed = RESUMED.findall(_text(log))
        # Every rank of the requeued run resumes from the one checkpoint, in the snapshot.
        assert len(resumed) == 6 and len(set(resumed)) == 1, resumed
        resumed_step, source = resumed[0]
        assert int(resumed_step) == step and "/.snapshots/" in source
        assert min(int(n) for n in re.findall(r"^step (\d+) loss", _text(log)[RESUMED.search(_text(log)).start():],
                                                re.M)) == step + 1
        # One checkpoint: ours; Lightning's auto-requeue saved no hpc_ckpt and requeued nothing.
        assert not list(cluster.user_dir().rglob("hpc_ckpt_*.ckpt"))
        assert "requeing job" not in _text(log) and "Requeued SLURM job" not in _text(log)
        assert _restart_count(cluster, jid) == 1, cluster.job(jid)
    finally:
        cluster.cancel(jid)
