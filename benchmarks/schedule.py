"""Issue 17: what one pass of the schedule runner costs when nothing is due.

A site runs `slurm-snap schedule` every minute on the controller; with
thousands of running jobs and nothing due, a pass must cost about what the
one `squeue --json` it makes costs, not one query per job. Measured here, in
one run, side by side:
  - pass:   Runner.pass_once() over an SQLite inventory holding N running
            periodic jobs (each with a set 10 s old: nothing due), its squeue
            answer parsed from a JSON document of N jobs shaped like 22.05's
            (111 keys each), so the pass's own cost includes the parse;
  - squeue: one real `squeue --json` on the dev cluster's controller (with
            --cluster) while its queue holds N jobs (held jobs submitted for
            the measurement and cancelled after it: squeue's cost grows with
            the queue as the pass's parse does), less what entering the
            controller's namespaces costs (a `true` there, measured beside it).
Quoted: the pass's median over squeue's (target: under x1 at 1,000 and
10,000 jobs), and the number of inventory statements per pass.

    $SLURM_SNAP_VENV/bin/python benchmarks/schedule.py [--quick] [--cluster STATE] [--json OUT]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402


def squeue_document(n: int) -> str:
    """N RUNNING jobs, each with 111 keys as 22.05's squeue --json prints (SLURM-LAB.md)."""
    jobs = []
    for j in range(1, n + 1):
        job = {f"field_{k}": f"value-{k}" for k in range(108)}
        job.update(job_id=j, job_state="RUNNING", restart_cnt=0)
        jobs.append(job)
    return json.dumps({"meta": {}, "errors": [], "jobs": jobs})


def seed(url: str, n: int, now: dt.datetime) -> None:
    from slurm_snap.inventory.models import JobRun, SnapshotSet
    from slurm_snap.inventory.repository import Inventory
    from slurm_snap import states as S

    inv = Inventory(url)
    inv.upgrade()
    with inv.session() as repo:
        runs = [JobRun(job_id=j, restart_count=0, user_name=f"u{j % 50}", uid=1000 + j % 50, partition="gpu",
                       nodes=["n1"], options={"consistency": "app"}, created_at=now - dt.timedelta(hours=1),
                       snapshot_every=3600) for j in range(1, n + 1)]
        repo.s.add_all(runs)
        repo.s.flush()
        recent = now - dt.timedelta(seconds=10)
        repo.s.add_all([SnapshotSet(job_run_id=r.id, job_id=r.job_id, user_name=r.user_name, epoch=f"e{r.job_id}",
                                    trigger="periodic", wanted="app", consistency=S.APP, state=S.COMPLETE,
                                    requested_at=recent, cut_done_at=recent, finished_at=recent,
                                    expected_parts=1) for r in runs])
    inv.dispose()


def pass_cost(n: int, iterations: int) -> tuple[list[float], int]:
    from sqlalchemy import event

    from slurm_snap import config as config_mod
    from slurm_snap.clock import utcnow
    from slurm_snap.inventory.repository import Inventory
    from slurm_snap.schedule import Runner
    from slurm_snap.slurm.commands import running_from_json

    now = utcnow()
    with tempfile.TemporaryDirectory(prefix="bench-schedule-") as d:
        url = f"sqlite:///{d}/inv.db"
        seed(url, n, now)
        text = squeue_document(n)
        cfg = config_mod.from_dict({"inventory": {"url": url}})
        inv = Inventory(url)
        statements = []
        event.listens_for(inv.engine, "before_cursor_execute")(lambda *a, **k: statements.append(a[2]))

        def refuse(*_a):
            raise AssertionError("nothing is due in this benchmark")

        runner = Runner(cfg, inv, running=lambda: running_from_json(text), snapshot=refuse, drill=refuse)
        times = []
        for i in range(iterations + 1):
            statements.clear()
            t = time.perf_counter()
            report = runner.pass_once()
            elapsed = time.perf_counter() - t
            assert report.periodic == n and not report.due, (report.periodic, report.due)
            if i:                     # the first pass warms the engine's caches
                times.append(elapsed)
        queries = sum(1 for s in statements if s.lstrip().upper().startswith("SELECT"))
        inv.dispose()
    return times, queries


FILL = r"""
import subprocess, sys
n = int(sys.argv[1])
for _ in range(n):
    subprocess.run(["sbatch", "--hold", "-p", "low", "-J", "bench-queue", "-o", "/dev/null", "--wrap", "true"],
                   check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
"""


def queue_size(cluster) -> int:
    proc = cluster.run(["squeue", "-h", "-o", "%i"], timeout=120)
    return len(proc.stdout.split())


def fill_queue(cluster, n: int) -> None:
    """Held jobs of the test user until the queue holds n (one process
    submits them all: a namespace entry per sbatch would take minutes)."""
    missing = n - queue_size(cluster)
    if missing > 0:
        proc = cluster.run([cluster.python, "-c", FILL, str(missing)], user=cluster.user, timeout=3600)
        assert proc.returncode == 0, proc.stderr[-2000:]


def empty_queue(cluster) -> None:
    cluster.run(["scancel", "-n", "bench-queue"], timeout=600)


def squeue_cost(cluster, iterations: int) -> float:
    """Median seconds of one `squeue --json` on ctl, less entering ctl's namespaces."""
    sq, base = [], []
    for _ in range(iterations):
        t = time.perf_counter()
        proc = cluster.run(["squeue", "--json"], timeout=60)
        sq.append(time.perf_counter() - t)
        assert proc.returncode == 0, proc.stderr
        t = time.perf_counter()
        cluster.run(["/bin/true"], timeout=60)
        base.append(time.perf_counter() - t)
    return max(1e-6, statistics.median(sq) - statistics.median(base))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_args(parser)
    parser.add_argument("--cluster", metavar="STATE", help="a dev cluster that is up (for the squeue reference)")
    args = parser.parse_args(argv)
    sizes = (200, 1000) if args.quick else (1000, 10000)
    iterations = 3 if args.quick else 7
    rows, unavailable = [], []
    cluster = None
    if args.cluster:
        try:
            cluster = common.attach_cluster(args.cluster)
        except Unavailable as exc:
            unavailable.append(("squeue --json", str(exc)))
    else:
        unavailable.append(("squeue --json", "no --cluster: the pass is timed alone"))
    try:
        for n in sizes:
            reference = None
            if cluster is not None:
                fill_queue(cluster, n)
                reference = squeue_cost(cluster, iterations) * 1000
            times, queries = pass_cost(n, iterations)
            value = statistics.median(times) * 1000
            met = None if reference is None or args.quick else value / reference < 1.0
            rows.append(Row(bench="schedule", case=f"pass, {n:,} running periodic jobs, none due", value=value,
                            reference=reference, ref_name=f"one squeue --json of {n:,} jobs",
                            target="under x1" if not args.quick else "", met=met,
                            note=f"{queries} inventory queries per pass"))
    finally:
        if cluster is not None:
            empty_queue(cluster)
    return common.finish(args.json, rows, unavailable)


if __name__ == "__main__":
    sys.exit(main())
