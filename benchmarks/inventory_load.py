"""Issue 9, item 6: the inventory under many hooks writing at once.

P processes (default 16) each make K registrations (default 50), all started
together, through slurm_snap.inventory.repository exactly as the hooks do:
one transaction records a job run and its 4 volumes (PrologSlurmctld), a
second opens a preemption set and records 3 acknowledgements (Epilog): 9
rows per registration. The reference is the same total work done by one
process alone, in the same run. Afterwards every row is counted (nothing
lost) and every writer's errors are listed ("database is locked" is a
failure, never retried here: the product's busy timeout must absorb it).

Runs on SQLite (a file in a temp dir on local disk) and on PostgreSQL: the
server named by --pg-url or SLURM_SNAP_TEST_PG_URL (a scratch database is
created in it and dropped), else our own server started with
scripts/postgres in /var/tmp/bench-pg (port 55490) and stopped afterwards.

    $SLURM_SNAP_VENV/bin/python benchmarks/inventory_load.py [--quick] [--procs 16] [--each 50]
"""
from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402

ROWS_PER_REGISTRATION = 9  # 1 job run + 4 volumes + 1 set + 3 acks
PG_STATE = "/var/tmp/bench-pg"
PG_PORT = "55490"
UTC = dt.timezone.utc


def register(repo_factory, job_id: int) -> None:
    from slurm_snap.jobrecords import Ack, ManifestEntry, VolumeRecord

    nodes = ["n1", "n2", "n3"]
    with repo_factory() as repo:
        run = repo.record_job_run(job_id=job_id, restart_count=0, user_name=f"user{job_id % 50}", uid=5000,
                                  partition="low", nodes=nodes, options={"volumes": ["scratch", "pfs"]})
        repo.add_volumes(run, [VolumeRecord(path=f"/scratch/{n}/jobs/{job_id}", scope="node-local",
                                          volume_class="scratch", backend="btrfs", node=n) for n in nodes]
                         + [VolumeRecord(path=f"/pfs/jobs/{job_id}", scope="shared", volume_class="pfs",
                                       backend="btrfs")])
    now = dt.datetime.now(UTC)
    with repo_factory() as repo:
        run = repo.job_run(job_id, 0)
        st, _ = repo.create_set(run, epoch="preempt-0", trigger="preempt", requested_at=now)
        repo.record_acks(st.id, [Ack(node=n, rank=i, local_rank=0, local_size=1, step=100, written_at=now,
                                     manifest=(ManifestEntry(f"/pfs/jobs/{job_id}/ckpt/rank-{i}.pt", 1),))
                                 for i, n in enumerate(nodes)])


def worker(url: str, first_job: int, count: int, start_at: float, out) -> None:
    from slurm_snap.inventory.repository import Inventory

    errors: list[str] = []
    done = 0
    inv = Inventory(url)
    try:
        delay = start_at - time.time()
        if delay > 0:
            time.sleep(delay)  # everyone starts together: the point is contention
        t = time.perf_counter()
        for j in range(first_job, first_job + count):
            try:
                register(inv.session, j)
                done += 1
            except Exception as exc:  # counted and reported, never retried
                errors.append(f"job {j}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        elapsed = time.perf_counter() - t
    except Exception:
        errors.append(traceback.format_exc(limit=3))
        elapsed = 0.0
    finally:
        inv.dispose()
    out.put({"done": done, "errors": errors, "elapsed": elapsed})


def run_load(url: str, procs: int, each: int, first_job: int) -> dict:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start_at = time.time() + 0.5 + 0.05 * procs
    ps = [ctx.Process(target=worker, args=(url, first_job + i * each, each, start_at, q)) for i in range(procs)]
    for p in ps:
        p.start()
    results = [q.get(timeout=1800) for _ in ps]
    wall = time.time() - start_at
    for p in ps:
        p.join(timeout=60)
    errors = [e for r in results for e in r["errors"]]
    return {"procs": procs, "each": each, "done": sum(r["done"] for r in results), "errors": errors,
            "wall_s": wall, "rows_per_s": sum(r["done"] for r in results) * ROWS_PER_REGISTRATION / wall}


def count_rows(url: str) -> dict[str, int]:
    from sqlalchemy import func, select

    from slurm_snap.inventory.models import BarrierAck, JobRun, SnapshotSet, Volume
    from slurm_snap.inventory.repository import Inventory

    inv = Inventory(url)
    try:
        with inv.session() as repo:
            return {m.__tablename__: repo.s.scalar(select(func.count()).select_from(m))
                    for m in (JobRun, Volume, SnapshotSet, BarrierAck)}
    finally:
        inv.dispose()


def bench_db(kind: str, url: str, procs: int, each: int) -> list[Row]:
    from slurm_snap.inventory.repository import Inventory

    inv = Inventory(url)
    inv.upgrade()
    inv.dispose()
    # Reference first, on job ids of its own, same total work.
    serial = run_load(url, 1, procs * each, first_job=1_000_000)
    conc = run_load(url, procs, each, first_job=2_000_000)
    counts = count_rows(url)
    total = 2 * procs * each
    expected = {"job_run": total, "volume": 4 * total, "snapshot_set": total, "barrier_ack": 3 * total}
    lost = {k: expected[k] - counts.get(k, 0) for k in expected if counts.get(k, 0) != expected[k]}
    locked = sum("locked" in e for e in conc["errors"] + serial["errors"])
    errors = conc["errors"] + serial["errors"]
    ok = not lost and not errors
    note = (f"{procs}x{each} registrations; rows after: {sum(counts.values()):,} of {sum(expected.values()):,}"
            f" expected; {len(errors)} writer errors ({locked} 'database is locked')")
    if lost:
        note += f"; MISSING {lost}"
    if errors:
        note += f"; first error: {errors[0][:200]}"
    return [Row("inventory", f"{kind}: {procs} concurrent writers", conc["rows_per_s"], serial["rows_per_s"],
                "rows/s", "1 writer, same work", "ratio", "nothing lost, no writer fails", ok, note,
                {"serial": {k: v for k, v in serial.items() if k != "errors"},
                 "concurrent": {k: v for k, v in conc.items() if k != "errors"},
                 "counts": counts, "errors": errors[:20]})]


def pg_server(explicit: str | None, allow_start: bool):
    """(url to a scratch database, cleanup) or raise Unavailable."""
    import psycopg2
    from sqlalchemy.engine import make_url

    base = explicit or os.environ.get("SLURM_SNAP_TEST_PG_URL")
    started = False
    if not base:
        if not allow_start:
            raise Unavailable("no --pg-url / SLURM_SNAP_TEST_PG_URL (the full run starts its own server)")
        env = dict(os.environ, SLURM_SNAP_PG_PORT=PG_PORT, PATH=common.SBIN)
        proc = subprocess.run([os.path.join(common.REPO, "scripts", "postgres"), "start", PG_STATE], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise Unavailable(f"scripts/postgres start failed: {proc.stderr.strip()[-300:]}")
        base, started = proc.stdout.strip().splitlines()[-1], True
    u = make_url(base)
    dbname = f"slurmsnap_bench_{os.getpid()}"
    admin = dict(host=u.host, port=u.port or 5432, user=u.username, password=u.password, dbname=u.database)

    def sql(statement: str) -> None:
        con = psycopg2.connect(**admin, connect_timeout=10)
        con.autocommit = True
        try:
            con.cursor().execute(statement)
        finally:
            con.close()

    try:
        sql(f'CREATE DATABASE "{dbname}"')
    except Exception as exc:
        if started:
            _stop_pg()
        raise Unavailable(f"cannot create a scratch database on {u.host}:{u.port}: {exc}") from None

    def cleanup():
        try:
            sql(f'DROP DATABASE IF EXISTS "{dbname}"')
        finally:
            if started:
                _stop_pg()
    return u.set(database=dbname).render_as_string(hide_password=False), cleanup


def _stop_pg() -> None:
    subprocess.run([os.path.join(common.REPO, "scripts", "postgres"), "stop", PG_STATE],
                   env=dict(os.environ, SLURM_SNAP_PG_PORT=PG_PORT, PATH=common.SBIN),
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.standard_args(ap)
    ap.add_argument("--procs", type=int)
    ap.add_argument("--each", type=int)
    ap.add_argument("--pg-url", help="PostgreSQL server URL (a scratch database is created in it)")
    ap.add_argument("--no-pg", action="store_true")
    args = ap.parse_args(argv)
    procs = args.procs or (4 if args.quick else 16)
    each = args.each or (5 if args.quick else 50)
    rows, unavailable = [], []
    print(f"inventory under concurrent hooks ({procs} processes x {each} registrations, "
          f"{ROWS_PER_REGISTRATION} rows each)", flush=True)
    tmp = tempfile.mkdtemp(prefix="bench-inv-", dir="/var/tmp")
    try:
        rows += bench_db("SQLite", f"sqlite:///{tmp}/inventory.db", procs, each)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.no_pg:
        try:
            url, cleanup = pg_server(args.pg_url, allow_start=not args.quick)
            try:
                rows += bench_db("PostgreSQL", url, procs, each)
            finally:
                cleanup()
        except Unavailable as exc:
            unavailable.append(("PostgreSQL", str(exc)))
    return common.finish(args.json, rows, unavailable)


if __name__ == "__main__":
    sys.exit(main())
