"""Coordinator overhead versus the number of nodes, on simulated nodes.

The same Coordinator code as `slurm-snap snapshot`, with:
  - N simulated nodes x R ranks in a separate process (no shared GIL) that
    answer the "signal" by reading request.json and writing their acks into a
    real temp barrier directory at configurable delays;
  - a simulated backend ("test-sim", registered through the backend
    registry) with a fixed cut latency, one node-local volume per node plus
    one shared volume;
  - a real SQLite inventory in the temp directory.

overhead = (request -> set finalized and released)
           - (signal -> slowest rank's ack)      the application's own time
           - backend cut latency                  the filesystem's own time

Beside it, in the same run, the thread floor: the cut pool's shape (the same
number of worker threads pulling N+1 tasks from one queue) where each task
only sleeps the backend latency. What that costs beyond one latency is what
waking N+1 threads' worth of work costs in CPython on this machine, before
the coordinator does anything.
Targets (docs/PRIOR-ART.md): N=1 10 ms, 8 15 ms, 64 25 ms, 512 50 ms; issue 36: 1000 25 ms
(was 75) and 10000 100 ms (`--nodes 10000`: not in the default list, a run takes minutes).

    PYTHONPATH=. $SLURM_SNAP_VENV/bin/python benchmarks/coordinator.py [--nodes 1,8,64] [--repeat 5]
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import gc
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# slurm_snap and testkit/ (the simulated backends and ranks) from the work tree.
sys.path.insert(0, REPO)

from slurm_snap import access, config  # noqa: E402
from slurm_snap.inventory.repository import Inventory  # noqa: E402
from slurm_snap.jobrecords import VolumeRecord  # noqa: E402
from slurm_snap import states as S  # noqa: E402
from slurm_snap.protocol.coordinator import Coordinator  # noqa: E402
from slurm_snap.protocol.cutter import MAX_WORKERS  # noqa: E402
from testkit.doubles import SimRanks, plan_ranks, register_test_backends  # noqa: E402

TARGETS_MS = {1: 10, 8: 15, 64: 25, 512: 50, 1000: 25, 10000: 100}
JOB_ID = 1


def setup(tmp: str, n: int, latency: float):
    cfg = config.from_dict({
        "inventory": {"url": f"sqlite:///{tmp}/inventory.db"},
        "paths": {"barrier_dir": f"{tmp}/barriers", "restore_root": f"{tmp}/restore", "log_dir": f"{tmp}/log"},
        "timeouts": {"barrier": 60.0, "backend_call": 30.0},
        "volume_class": [
            {"name": "scratch", "prefix": "/sim/scratch/{node}", "scope": "node-local", "backend": "test-sim",
             "options": {"latency": latency}},
            {"name": "pfs", "prefix": "/sim/pfs", "scope": "shared", "backend": "test-sim",
             "options": {"latency": latency}},
        ],
    }, path=f"{tmp}/slurm-snap.toml")
    inv = Inventory(cfg.inventory.url)
    inv.upgrade()
    nodes = [f"n{i:04d}" for i in range(1, n + 1)]
    specs = [VolumeRecord(path=f"/sim/scratch/{x}/jobs/{JOB_ID}", scope="node-local", volume_class="scratch",
                        backend="test-sim", node=x) for x in nodes]
    specs.append(VolumeRecord(path=f"/sim/pfs/jobs/{JOB_ID}", scope="shared", volume_class="pfs", backend="test-sim"))
    with inv.session() as repo:
        run = repo.record_job_run(job_id=JOB_ID, restart_count=0, user_name="sim", uid=os.getuid(), nodes=nodes)
        repo.add_volumes(run, specs, prepared=True)
    return cfg, inv, nodes


def measure(n: int, *, ranks: int, repeat: int, latency: float, base: float, spread: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="slurm-snap-bench-") as tmp:
        cfg, inv, nodes = setup(tmp, n, latency)
        coord = Coordinator(cfg, inv, caller=access.Caller(uid=0, name="root"))
        job_dir = os.path.join(cfg.paths.barrier_dir, str(JOB_ID))
        os.makedirs(os.path.join(job_dir, "ack"), exist_ok=True)
        os.makedirs(os.path.join(job_dir, "release"), exist_ok=True)
        sim = SimRanks(job_dir, JOB_ID, plan_ranks(nodes, ranks, base=base, spread=spread))
        coord.signal = sim.signal
        samples, phases = [], []
        try:
            for i in range(repeat + 1):  # the first run warms imports and caches
                # Each `slurm-snap snapshot` is a fresh process: do not charge
                # this run with the previous run's garbage or exiting threads.
                time.sleep(0.2)
                gc.collect()
                t0 = time.time()
                out = coord.snapshot(JOB_ID, deadline=60)
                t1 = time.time()
                r = sim.result()
                if out.state != S.COMPLETE or out.consistency != S.APP:
                    raise SystemExit(f"N={n}: set {out.set_id} {out.state} {out.consistency}: {out.reason}")
                app = r["last"] - r["trigger"]
                if i:
                    samples.append((t1 - t0 - app - latency) * 1000)
                    phases.append(out.phases)
        finally:
            sim.close()
            inv.dispose()
    floor = [thread_floor(n + 1, latency) for _ in range(repeat)]
    med = statistics.median(samples)
    ph = {k: statistics.median(p[k] for p in phases) * 1000 for k in phases[0]}
    return {"n": n, "ranks": n * ranks, "overhead_ms": med, "min_ms": min(samples), "max_ms": max(samples),
            "phases_ms": ph, "floor_ms": statistics.median(floor)}


def thread_floor(tasks: int, latency: float) -> float:
    """ms beyond one latency for the cut pool's threads to run `tasks` sleeps of `latency`."""
    workers = max(1, min(MAX_WORKERS, tasks))
    with cf.ThreadPoolExecutor(max_workers=workers) as ex:
        # start every thread first, as CutPool does while the ranks checkpoint
        cf.wait([ex.submit(time.sleep, 0.01) for _ in range(workers)])
        time.sleep(0.05)
        queue = collections.deque(range(tasks))

        def worker() -> None:
            while True:
                try:
                    queue.popleft()
                except IndexError:
                    return
                time.sleep(latency)

        gc.collect()
        t0 = time.perf_counter()
        cf.wait([ex.submit(worker) for _ in range(workers)])
        return (time.perf_counter() - t0 - latency) * 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,8,64,512,1000")
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--latency", type=float, default=0.005, help="simulated backend cut latency, seconds")
    ap.add_argument("--ack-base", type=float, default=0.02, help="earliest rank ack after the signal, seconds")
    ap.add_argument("--ack-spread", type=float, default=0.1, help="ranks ack uniformly over this window, seconds")
    args = ap.parse_args(argv)
    register_test_backends()
    print(f"coordinator overhead, median of {args.repeat} runs; backend latency {args.latency * 1000:g} ms; "
          f"acks {args.ack_base * 1000:g}..{(args.ack_base + args.ack_spread) * 1000:g} ms after the signal; "
          f"{args.ranks_per_node} rank(s)/node; {os.cpu_count()} CPUs")
    head = (f"{'nodes':>6} {'ranks':>6} {'overhead':>9} {'min':>7} {'max':>7} {'target':>7} {'ratio':>6} "
            f"{'floor':>7} {'floor/ovh':>9}  "
            "phases ms: request signal barrier cut(+record acks) record_parts finalize release")
    print(head)
    worst = 0.0
    for n in [int(x) for x in args.nodes.split(",")]:
        r = measure(n, ranks=args.ranks_per_node, repeat=args.repeat, latency=args.latency,
                    base=args.ack_base, spread=args.ack_spread)
        target = TARGETS_MS.get(n)
        ratio = r["overhead_ms"] / target if target else float("nan")
        worst = max(worst, ratio if target else 0)
        ph = r["phases_ms"]
        print(f"{n:>6} {r['ranks']:>6} {r['overhead_ms']:>7.1f}ms {r['min_ms']:>5.1f}ms {r['max_ms']:>5.1f}ms "
              f"{(str(target) + 'ms') if target else '-':>7} {ratio:>6.2f} "
              f"{r['floor_ms']:>5.1f}ms {r['floor_ms'] / r['overhead_ms']:>9.2f}  "
              + " ".join(f"{ph.get(k, 0):.1f}" for k in ("request", "signal", "barrier", "cut",
                                                        "record_parts", "finalize", "release")))
    print(f"worst ratio to target: {worst:.2f} ({'within' if worst <= 1 else 'over'} target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
