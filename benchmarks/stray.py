"""Issue 30, item 4: what a stray checkpoint signal costs a training job.

A SIGUSR1 that no slurm-snap request and no preemption goes with (a user's
`scancel -s USR1`, a `--signal` warning before the time limit) used to make
every rank of a lockstep job agree on a checkpoint and then wait for a
release nobody sends: the issue saw 15 step lines in 15 s where about 300
were expected. Now rank 0 asks whether a request or a preemption goes with
it (request.json; Slurm's PreemptTime) and its verdict rides in the step
agreement: every rank ignores it at one step.

On the multi-host dev cluster, as the test user on login: the PyTorch example
(examples/train.sbatch: DDP over gloo, 3 nodes x 2 ranks, --snapshot-on-preempt),
with 50 ms steps. Once it trains, for each of --signals rounds: the steps of
the 10 s before (the reference) and of the 10 s after `scancel -s USR1 JOB`
(every task of the job's steps gets it, as from a user). Steps lost per stray
signal = before - after; each rank must say it ignored the signal.

    $SLURM_SNAP_VENV/bin/python benchmarks/stray.py --cluster STATE [--signals 3] [--json OUT]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402

SBATCH = os.path.join(common.REPO, "examples", "train.sbatch")
TRAIN_PY = os.path.join(common.REPO, "examples", "train.py")
STEP = re.compile(r"^step (\d+) loss ", re.M)
IGNORED = "a checkpoint signal with no slurm-snap request and no preemption: ignored"
RANKS = 6
WINDOW = 10.0
STEP_TIME = 0.05


def _text(path: str) -> str:
    try:
        return open(path, errors="replace").read()
    except OSError:
        return ""


def _step(path: str) -> int:
    steps = [int(s) for s in STEP.findall(_text(path))]
    return max(steps) if steps else 0


def measure(state: str, signals: int, window: float) -> dict:
    cl = common.attach_cluster(state)
    out_dir = cl.make_user_dir(f"bench-stray-{time.monotonic_ns()}")
    out = os.path.join(out_dir, "train-%j.out")
    jid = cl.sbatch("-p", "low", "-o", out,
                    f"--export=ALL,TRAIN_PY={TRAIN_PY},SLURM_SNAP_PYTHON={cl.python},"
                    f"TRAIN_ARGS=--step-time {STEP_TIME}", SBATCH, cwd=str(out_dir))
    log = out.replace("%j", str(jid))
    rounds = []
    try:
        cl.wait_state(jid, "RUNNING", timeout=90)
        deadline = time.monotonic() + 180
        while _step(log) < 40:
            if time.monotonic() > deadline:
                raise Unavailable(f"training did not start in 180 s: {_text(log)[-500:] or 'no output'}")
            time.sleep(0.5)
        for i in range(signals):
            s0 = _step(log)
            time.sleep(window)
            before = _step(log) - s0
            r = cl.run(["scancel", "-s", "USR1", str(jid)], user=cl.user, timeout=30)
            if r.returncode != 0:
                raise Unavailable(f"scancel -s USR1 {jid} failed: {r.stderr.strip()}")
            s1 = _step(log)
            time.sleep(window)
            after = _step(log) - s1
            rounds.append((before, after))
            print(f"  signal {i + 1}: {before} steps in the {window:g} s before, {after} in the {window:g} s after",
                  flush=True)
        time.sleep(1.0)
        text = _text(log)
        acks = cl.run(["ls", f"{cl.env['SLURM_SNAP_PFS']}/.slurm-snap/barriers/{jid}/ack"], timeout=30).stdout.split()
        return {"rounds": rounds, "ignored": text.count(IGNORED), "acks": [a for a in acks if a.endswith(".json")],
                "job": jid}
    finally:
        cl.cancel(jid)


def rows_from(result: dict, window: float) -> list[Row]:
    rounds = result["rounds"]
    before = statistics.median(b for b, _a in rounds)
    after = statistics.median(a for _b, a in rounds)
    lost = statistics.median(b - a for b, a in rounds)
    expected_ignored = RANKS * len(rounds)
    note = (f"{len(rounds)} stray signals; per signal the steps lost were {[b - a for b, a in rounds]}; "
            f"'ignored' logged {result['ignored']} times (every rank, every signal: {expected_ignored}); "
            f"acknowledgements written: {len(result['acks'])}. Before this change the issue measured "
            "15 steps in 15 s where about 300 were expected")
    return [
        Row("stray", f"steps in {window:g} s after a stray USR1 (DDP, 3 nodes x 2 ranks, {STEP_TIME * 1000:g} ms steps)",
            after, before, "steps", f"steps in the {window:g} s before", "ratio", ">= 0.9 of before",
            after >= 0.9 * before, note),
        Row("stray", "  steps lost per stray signal", lost, 0.0, "steps", "none lost", "added", "<= 1 s of steps",
            lost <= 1.0 / STEP_TIME and result["ignored"] == expected_ignored and not result["acks"]),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.standard_args(ap)
    ap.add_argument("--cluster", metavar="STATE", help="a dev cluster that is up (scripts/dev-cluster up STATE)")
    ap.add_argument("--signals", type=int, help="stray signals to send (default 3; --quick 1)")
    args = ap.parse_args(argv)
    rows, unavailable = [], []
    print("a stray checkpoint signal: steps lost (dev cluster)", flush=True)
    if not args.cluster:
        unavailable.append(("stray signal", "no dev cluster (--cluster STATE)"))
    else:
        try:
            rows = rows_from(measure(args.cluster, args.signals or (1 if args.quick else 3), WINDOW), WINDOW)
        except Unavailable as exc:
            unavailable.append(("stray signal", str(exc)))
        except Exception as exc:  # the cluster misbehaving is a finding, not a crash
            unavailable.append(("stray signal", f"{type(exc).__name__}: {exc}"))
    return common.finish(args.json, rows, unavailable)


if __name__ == "__main__":
    sys.exit(main())
