"""Issue 9, item 3: barrier detection latency.

From the moment the last acknowledgement lands in `<job>/ack/` (renamed into
place by a separate process, with fsync, the way the rank client writes it)
to the moment the coordinator's wait returns, through the coordinator's own
code: slurm_snap.protocol.barrier.AckCollector + wait_for_barrier (inotify
on the directory, parsing only the names that changed). Compared in the same
run, interleaved, with:
  - the same wait with inotify off (its fallback: rescans with a backoff capped
    at 50 ms, what a network filesystem without inotify gets);
  - a naive coordinator that rescans the directory once a second until the
    same deadline (the reference).
All but the last ack are in place before the wait starts; the last lands at
a random moment (0.05 to 1.05 s later) so the naive poll's phase is random.
Clocks: time.monotonic() is system-wide on Linux, so writer and waiter
(different processes) compare directly.

    $SLURM_SNAP_VENV/bin/python benchmarks/barrier.py [--quick] [--nodes 8] [--trials 30]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Row  # noqa: E402

JOB_ID = 4242
EPOCH = "s00bench"
TARGET_MS = 5.0  # "a few ms"
DEADLINE = 10.0


def _last_writer(ack_dir: str, plan, delay: float, conn) -> None:
    from testkit.doubles import write_ack

    conn.recv()  # the waiter is about to wait
    time.sleep(delay)
    write_ack(ack_dir, JOB_ID, EPOCH, plan, 7, fsync=True)
    conn.send(time.monotonic())


def naive_wait(collector, timeout: float, interval: float = 1.0) -> bool:
    """The reference: look at the whole directory every `interval` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        collector.rescan()
        if collector.state.all_complete or time.monotonic() >= deadline:
            return collector.state.all_complete
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def trial(method: str, nodes: int, delay: float) -> float:
    from slurm_snap.protocol.barrier import AckCollector, wait_for_barrier
    from testkit.doubles import plan_ranks, write_ack

    tmp = tempfile.mkdtemp(prefix="bench-barrier-", dir="/var/tmp")
    try:
        ack_dir = os.path.join(tmp, "ack")
        os.mkdir(ack_dir)
        names = [f"n{i:03d}" for i in range(nodes)]
        plans = plan_ranks(names, 1)
        for p in plans[:-1]:
            write_ack(ack_dir, JOB_ID, EPOCH, p, 7, fsync=True)
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_last_writer, args=(ack_dir, plans[-1], delay, child))
        proc.start()
        try:
            with AckCollector(ack_dir, job_id=JOB_ID, epoch=EPOCH, nodes=names, owner_uid=os.getuid()) as col:
                parent.send(True)
                if method == "naive 1 s poll":
                    ok = naive_wait(col, DEADLINE)
                else:
                    ok = wait_for_barrier(col, timeout=DEADLINE, use_inotify=(method == "inotify"))
                acted = time.monotonic()
            written = parent.recv()
        finally:
            proc.join(10)
        if not ok:
            raise RuntimeError(f"{method}: barrier of {nodes} nodes not complete within {DEADLINE} s")
        return acted - written
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench(nodes: int, trials: int) -> list[Row]:
    methods = ("inotify", "poll fallback (no inotify)", "naive 1 s poll")
    rnd = random.Random(9)
    samples: dict[str, list[float]] = {m: [] for m in methods}
    trial("inotify", nodes, 0.01)  # warm imports
    for _ in range(trials):
        delay = 0.05 + rnd.random()
        for m in methods:
            samples[m].append(trial(m, nodes, delay))
    s = {m: common.summarize(v) for m, v in samples.items()}
    ref = s["naive 1 s poll"]
    return [
        Row("barrier", f"last ack -> coordinator acts, inotify ({nodes} nodes)", s["inotify"]["median"],
            ref["median"], "ms", "naive 1 s poll", "ratio", f"a few ms (< {TARGET_MS:g})",
            s["inotify"]["median"] < TARGET_MS,
            f"median of {trials}; p90 {s['inotify']['p90']:.2f} ms, max {s['inotify']['max']:.2f} ms", s),
        Row("barrier", f"  same without inotify (capped 50 ms rescan)", s["poll fallback (no inotify)"]["median"],
            ref["median"], "ms", "naive 1 s poll", "ratio", "", None,
            f"p90 {s['poll fallback (no inotify)']['p90']:.1f} ms"),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.standard_args(ap)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--trials", type=int)
    args = ap.parse_args(argv)
    trials = args.trials or (4 if args.quick else 30)
    print("barrier detection latency (the coordinator's wait_for_barrier)", flush=True)
    rows = bench(args.nodes, trials)
    return common.finish(args.json, rows)


if __name__ == "__main__":
    sys.exit(main())
