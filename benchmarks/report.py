"""Benchmark `slurm-snap report` over a large SQLite inventory.

Seeds N sets (default 1,000,000; --quick: 10,000) spread over 90 days for 200
users and N/100 jobs, then times, each best of --repeat runs:
  default   root, no options: the sets requested since midnight today
  filtered  -u user7 -S now-7days
through the real command (click, repository, formatting) and the same
queries in raw SQL with sqlite3 (fetch only), and prints the ratio.

    $SLURM_SNAP_VENV/bin/python benchmarks/report.py [--quick] [--db PATH] [--keep]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sqlite3
import sys
import tempfile
import time

# slurm_snap and testkit/ (testkit/inventory_helpers.py seeds the synthetic inventory).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from click.testing import CliRunner  # noqa: E402

from slurm_snap import access  # noqa: E402
from slurm_snap.cli import report_cmd  # noqa: E402
from slurm_snap.cli.context import Ctx  # noqa: E402
from slurm_snap.inventory.repository import Inventory  # noqa: E402
from testkit.inventory_helpers import bulk_seed  # noqa: E402

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 30, 23, 0, 0, tzinfo=UTC)
USERS = 200
SPAN = dt.timedelta(days=90)
STATES = ["COMPLETE"] * 70 + ["VERIFIED"] * 15 + ["PARTIAL"] * 5 + ["FAILED"] * 5 + ["DELETED"] * 5


def seed(url: str, n_sets: int) -> float:
    t = time.perf_counter()
    rnd = random.Random(7)
    inv = Inventory(url)
    inv.upgrade()
    n_jobs = max(1, n_sets // 100)
    runs = [{"id": j + 1, "job_id": 100000 + j, "restart_count": 0, "user_name": f"user{j % USERS}",
             "uid": 5000 + j % USERS, "partition": "gpu", "nodes": ["n1", "n2"], "options": {},
             "created_at": NOW - SPAN} for j in range(n_jobs)]
    with inv.session() as repo:
        bulk_seed(repo, "job_run", runs)
    span_s = SPAN.total_seconds()
    chunk = 50000
    for start in range(0, n_sets, chunk):
        rows = []
        for i in range(start, min(n_sets, start + chunk)):
            j = rnd.randrange(n_jobs)
            req = NOW - dt.timedelta(seconds=span_s * (n_sets - i) / n_sets)
            state = rnd.choice(STATES)
            ok = state in ("COMPLETE", "VERIFIED", "DELETED")
            rows.append({
                "job_run_id": j + 1, "job_id": 100000 + j, "user_name": f"user{j % USERS}", "epoch": f"e{i}",
                "trigger": "periodic", "wanted": "app", "consistency": "app-consistent" if ok else "none",
                "state": state, "reason": "" if ok else "barrier timeout: n2", "owner": "", "requested_at": req,
                "signalled_at": req + dt.timedelta(seconds=1), "barrier_at": req + dt.timedelta(seconds=3),
                "cut_started_at": req + dt.timedelta(seconds=3.5), "cut_done_at": req + dt.timedelta(seconds=4),
                "finished_at": req + dt.timedelta(seconds=5),
                "verified_at": req + dt.timedelta(hours=1) if state == "VERIFIED" else None,
                "skew_seconds": 0.2, "checkpoint_step": i, "manifest_ok": ok, "expected_parts": 2,
                "failed_nodes": []})
        with inv.session() as repo:
            bulk_seed(repo, "snapshot_set", rows)
    inv.dispose()
    return time.perf_counter() - t


def product(cfg_path: str, args: list[str]) -> tuple[float, int]:
    ctx = Ctx(config_path=cfg_path)
    ctx.caller, ctx.now, ctx.tz = access.Caller(uid=0, name="root"), NOW, UTC
    t = time.perf_counter()
    res = CliRunner().invoke(report_cmd.command, args, obj=ctx)
    elapsed = time.perf_counter() - t
    if res.exit_code != 0:
        raise SystemExit(f"report {args} failed: {res.output} {res.exception!r}")
    return elapsed, max(0, len(res.output.splitlines()) - 2)


RAW_SETS = """
SELECT s.id, s.job_id, r.restart_count, s.user_name, s.state, s.consistency, s.cut_done_at, s.verified_at,
       (SELECT count(*) FROM snapshot p WHERE p.set_id = s.id)
FROM snapshot_set s JOIN job_run r ON r.id = s.job_run_id
WHERE s.requested_at >= ? {extra}
ORDER BY s.requested_at, s.id
"""
RAW_RPO = ("SELECT job_id, max(cut_done_at) FROM snapshot_set WHERE state = 'VERIFIED' AND job_id IN ({q}) "
           "GROUP BY job_id")


def raw(path: str, start: dt.datetime, user: str | None) -> float:
    con = sqlite3.connect(path)
    t = time.perf_counter()
    params: list = [start.replace(tzinfo=None).isoformat(sep=" ")]
    extra = ""
    if user:
        extra, params = "AND s.user_name = ?", params + [user]
    rows = con.execute(RAW_SETS.format(extra=extra), params).fetchall()
    jobs = sorted({r[1] for r in rows})
    for i in range(0, len(jobs), 900):
        part = jobs[i:i + 900]
        con.execute(RAW_RPO.format(q=",".join("?" * len(part))), part).fetchall()
    elapsed = time.perf_counter() - t
    con.close()
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10,000 sets (CI smoke)")
    ap.add_argument("--sets", type=int, default=None)
    ap.add_argument("--db", help="SQLite file to use (reused if it exists)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temporary database")
    a = ap.parse_args()
    n = a.sets or (10_000 if a.quick else 1_000_000)
    tmpdir = tempfile.mkdtemp(prefix="slurm-snap-bench-")
    path = a.db or os.path.join(tmpdir, "inv.db")
    url = f"sqlite:///{os.path.abspath(path)}"
    cfg = os.path.join(tmpdir, "bench.toml")
    with open(cfg, "w") as fh:
        fh.write(f'[inventory]\nurl = "{url}"\n')
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        print(f"seeding {n:,} sets ...", flush=True)
        print(f"seeded in {seed(url, n):.1f} s", flush=True)
    midnight = NOW.replace(hour=0, minute=0, second=0, microsecond=0)
    cases = [
        ("default (root, since midnight)", [], midnight, None),
        ("filtered (-u user7 -S now-7days)", ["-u", "user7", "-S", "now-7days"], NOW - dt.timedelta(days=7), "user7"),
    ]
    print(f"{'case':<34} {'rows':>7} {'report s':>9} {'raw SQL s':>10} {'ratio':>7}")
    for name, args, start, user in cases:
        best_p, rows = min(product(cfg, args) for _ in range(a.repeat))
        best_r = min(raw(path, start, user) for _ in range(a.repeat))
        print(f"{name:<34} {rows:>7} {best_p:>9.3f} {best_r:>10.4f} {best_p / best_r:>7.1f}")
    os.unlink(cfg)
    if a.keep and not a.db:
        print(f"kept {path}")
        return 0
    if not a.db:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
    os.rmdir(tmpdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
