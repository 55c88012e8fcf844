"""Issue 33 items 3 and 4 on the multi-host dev cluster: the frameworks users
already train with, each job on 3 nodes x 1 rank (CPU, gloo), preempted once:

- Hugging Face Trainer (a tiny GPT-2 built from a config, nothing
  downloaded) with slurm_snap.client.huggingface.SnapshotCallback; its batch
  script asks `slurm-snap resume-path` what to resume from, as a program not
  in Python would;
- Lightning's own BoringModel, Trainer(strategy="ddp", num_nodes=3), with
  only the lines docs/client.md documents;
- the same with resumable data loading (torchdata's StatefulDataLoader) on a
  site that preempts with SIGTERM only (the job's own --signal=TERM, which
  Slurm sends at preemption as a site without preempt_send_user_signal sends
  its SIGTERM).

Each time: one set, app-consistent, every rank at one step; the job is
requeued once; every rank of the requeued run resumes at step + 1 with
identical parameters (and, with the resumable loader, on the samples that
would have followed)."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from test_lockstep_cluster import PARAMS, RESUMED, _preempted_one_point, _restart_count, _text, _wait

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BATCH = re.compile(r"^batch step (\d+) rank (\d+) (\d+)$", re.M)


def _submit(cluster, name: str, script: str, *sbatch: str) -> tuple[int, Path]:
    out = cluster.make_user_dir(f"{name}-{time.monotonic_ns()}")
    jid = cluster.sbatch("-N3", "--ntasks-per-node=1", "-c1", "-p", "low", "--requeue", "--open-mode=append",
                         "--snapshot-volumes=scratch,pfs", "-o", f"{out}/slurm-%j.out", *sbatch, script=script)
    return jid, out / f"slurm-{jid}.out"


def _started(cluster, jid: int, log: Path, steps: int = 3) -> None:
    cluster.wait_state(jid, "RUNNING", timeout=90)
    _wait(lambda: len({r for s, r, _f in BATCH.findall(_text(log)) if int(s) >= steps}) == 3, 240,
          lambda: f"training did not start on every rank:\n{_text(log)[-4000:]}")


def _resumed(cluster, jid: int, log: Path, step: int) -> str:
    """Every rank of the requeued run resumes from the set at step + 1, as one model."""
    def done():
        text = _text(log)
        after = text[text.find("resumed from step"):] if "resumed from step" in text else ""
        return len(RESUMED.findall(text)) >= 3 and len({r for s, r, _h in PARAMS.findall(after)
                                                         if int(s) == step + 1}) == 3
    _wait(done, 300, lambda: f"the requeued run did not resume every rank:\n{_text(log)[-5000:]}")
    text = _text(log)
    resumed = RESUMED.findall(text)
    assert {int(s) for s, _p in resumed} == {step} and all("/.snapshots/" in p for _s, p in resumed), resumed
    after = text[text.find("resumed from step"):]
    at_resume = {h for s, _r, h in PARAMS.findall(after) if int(s) == step + 1}
    assert len(at_resume) == 1, PARAMS.findall(after)
    assert _restart_count(cluster, jid) == 1, cluster.job(jid)
    return text


def test_hugging_face_trainer_is_preempted_as_one_point_and_resumes_through_resume_path(cluster):
    train = cluster.write_user_file("train_hf.py", (REPO / "examples" / "train_hf.py").read_text(), mode=0o755)
    script = f"""#!/bin/bash
export HF_HUB_OFFLINE=1
RESUME=$({cluster.helper} resume-path) || exit 1
echo "resume-path: [$RESUME] step [$({cluster.helper} resume-path --step)]"
srun {cluster.python} {train} --steps 100000 --step-time 0.25 ${{RESUME:+--resume-from "$RESUME"}}
"""
    jid, log = _submit(cluster, "hf", script, "--snapshot-on-preempt")
    try:
        _started(cluster, jid, log)
        assert "resume-path: [] step []" in _text(log)          # a fresh start: nothing to resume from
        _set_id, step = _preempted_one_point(cluster, jid, world=3)
        text = _resumed(cluster, jid, log, step)
        # The batch script was told the snapshot's copy of rank 0's checkpoint, and the step.
        told = re.findall(r"^resume-path: \[(.*)\] step \[(\d*)\]$", text, re.M)
        assert told[-1][1] == str(step) and told[-1][0].endswith(f"/checkpoint-{step}") \
            and "/.snapshots/" in told[-1][0], told
    finally:
        cluster.cancel(jid)


def test_lightning_boring_model_with_only_the_documented_lines(cluster):
    prog = cluster.write_user_file("boring_lightning.py", (HERE / "boring_lightning.py").read_text())
    jid, log = _submit(cluster, "boring", f"#!/bin/bash\nsrun {cluster.python} {prog}\n", "--snapshot-on-preempt")
    try:
        _started(cluster, jid, log)
        _set_id, step = _preempted_one_point(cluster, jid, world=3)
        text = _resumed(cluster, jid, log, step)
        # One checkpoint (ours, on the declared pfs volume), one requeue (rank 0's early release).
        assert not list(cluster.user_dir().rglob("hpc_ckpt_*.ckpt"))
        assert "requeing job" not in text and "Requeued SLURM job" not in text
        # The loader BoringModel uses is not resumable: said once, at the start.
        assert "the training DataLoader is not resumable" in text
        # What Lightning prints that docs/client.md explains: its handlers at the
        # start, then every rank's SIGTERM when the early release requeues the job.
        assert "SLURM auto-requeueing enabled" in text
        assert len(re.findall(r"Received SIGTERM", text)) >= 3, text[-3000:]
    finally:
        cluster.cancel(jid)


def test_lightning_on_a_sigterm_only_site_resumes_at_the_samples_that_would_have_followed(cluster):
    """Lightning's SIGTERM handler would stop every rank at the batch's end,
    before the agreed checkpoint: the callback holds that first SIGTERM back
    from Lightning. The resumable loader's position is in the checkpoint."""
    prog = cluster.write_user_file("boring_lightning.py", (HERE / "boring_lightning.py").read_text())
    jid, log = _submit(cluster, "sigterm", f"#!/bin/bash\nsrun {cluster.python} {prog} --stateful\n",
                       "--snapshot-on-preempt", "--signal=TERM@10")
    try:
        _started(cluster, jid, log)
        _set_id, step = _preempted_one_point(cluster, jid, world=3)
        text = _resumed(cluster, jid, log, step)
        assert "the training DataLoader is not resumable" not in text
        # Sample i starts with i. Lightning gives each rank a DistributedSampler
        # (shuffled, seed 0, in epoch 0 here), so rank r's k-th batch of 2 starts
        # with its sampler's element 2(k-1). The first run followed that order,
        # and the requeued run goes on with the batch after the set's step
        # (without the loader's state it would start the epoch again).
        from torch.utils.data import DistributedSampler

        order = {r: list(DistributedSampler(range(300000), num_replicas=3, rank=r, shuffle=True, seed=0))
                 for r in range(3)}
        before, after = text[:text.find("resumed from step")], text[text.find("resumed from step"):]
        seen = {(int(s), int(r)): int(f) for s, r, f in BATCH.findall(before)}
        assert seen and all(f == order[r][2 * (s - 1)] for (s, r), f in seen.items()), seen
        resumed = {int(r): int(f) for s, r, f in BATCH.findall(after) if int(s) == step + 1}
        assert resumed == {r: order[r][2 * step] for r in range(3)}, (step, resumed)
    finally:
        cluster.cancel(jid)
