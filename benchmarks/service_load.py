#!/usr/bin/python3
"""Load on `slurm-snap serve` (issue 31): clients on the dev cluster's login
host and nodes at once, requests per second, p50/p99 latency, nothing lost.

    benchmarks/service_load.py --cluster STATE [--quick] [--json OUT]

Each host runs one client process (the cluster's venv, the host's own
config, which names only the service) with several threads, each sending
its requests one after another; every host starts at the same wall-clock
moment. A request counts as answered when its reply's MUNGE seal was
verified and its status was 0; anything else is lost and named. Cases:

  ping       doctor's request (MUNGE both ways, one forked child, no
             inventory), root on n1..n3 and login: the service's floor
  report     `report --json` as the test user on login (a user's command:
             a forked child that queries the inventory), at max_per_user
  burst      ping from every host with more clients at once than
             service.max_connections: the parent refuses the excess as
             busy, the clients ask again; busy lines counted in the log

The reference of each row is one client alone on login (requests per
second of a single client), measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import common
from common import Row, Unavailable

CLIENT = r"""
import io, json, sys, threading, time
from slurm_snap import config
from slurm_snap.errors import SnapError
from slurm_snap.service import client
cfg = config.load(sys.argv[1])
kind, threads, each, start = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

class Null(io.TextIOBase):
    def write(self, s):
        return len(s)

out = sys.stdout
sys.stdout = Null()
lat, failed, lock = [], [], threading.Lock()

def one():
    if kind == "report":
        return client.forward(cfg, ["report", "--json"]) == 0
    client.ping(cfg)
    return True

def worker():
    for _ in range(each):
        t = time.perf_counter()
        try:
            ok, why = one(), "status not 0"
        except SnapError as exc:
            ok, why = False, str(exc)[:300]
        d = time.perf_counter() - t
        with lock:
            (lat.append(d) if ok else failed.append(why))

while time.time() < start:
    time.sleep(0.005)
t0 = time.time()
ts = [threading.Thread(target=worker) for _ in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
out.write(json.dumps({"lat": lat, "failed": failed, "t0": t0, "t1": time.time()}))
"""


def _run_hosts(cluster, plan: list[tuple[str, str | None]], kind: str, threads: int, each: int) -> dict:
    """Every (host, user) of `plan` at once; the merged result."""
    start = time.time() + 4.0     # each client's interpreter starts first (about a second here)
    results: dict[str, dict] = {}

    def go(host: str, user: str | None):
        proc = cluster.run([cluster.python, "-c", CLIENT, cluster.config, kind, str(threads), str(each),
                            str(start)], host=host, user=user, timeout=900)
        try:
            results[host] = json.loads(proc.stdout)
        except ValueError:
            results[host] = {"lat": [], "failed": [f"client on {host} exited {proc.returncode}: "
                                                   f"{proc.stderr.strip()[-300:]}"] * (threads * each),
                             "t0": start, "t1": start}

    ts = [threading.Thread(target=go, args=hp) for hp in plan]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    lat = [x for r in results.values() for x in r["lat"]]
    failed = [x for r in results.values() for x in r["failed"]]
    span = max(r["t1"] for r in results.values()) - min(r["t0"] for r in results.values())
    return {"lat": lat, "failed": failed, "span": span, "sent": len(plan) * threads * each}


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def _busy_lines(cluster) -> int:
    try:
        text = (cluster.host_dir("ctl") / "log" / "slurm-snap-serve.log").read_text(errors="replace")
    except OSError:
        return -1
    return text.count(": busy, ")


def _row(case: str, got: dict, alone: dict, extra: str = "") -> Row:
    answered = len(got["lat"])
    lost = got["sent"] - answered
    rps = answered / got["span"] if got["span"] > 0 else 0.0
    ref = len(alone["lat"]) / alone["span"] if alone["span"] > 0 else None
    why = f"; first loss: {got['failed'][0]}" if got["failed"] else ""
    return Row(bench="service", case=case, value=rps, reference=ref, unit="req/s",
               ref_name="one client alone on login", target="nothing lost", met=lost == 0,
               note=f"{got['sent']} requests, {answered} answered, {lost} lost; latency p50 "
                    f"{_quantile(got['lat'], 0.50):.0f} ms, p99 {_quantile(got['lat'], 0.99):.0f} ms, max "
                    f"{_quantile(got['lat'], 1.0):.0f} ms; {got['span']:.1f} s{extra}{why}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_args(parser)
    parser.add_argument("--cluster", metavar="STATE", help="a dev cluster that is up")
    args = parser.parse_args(argv)
    if not args.cluster:
        return common.finish(args.json, [], [("service load", "no --cluster: needs the dev cluster's hosts")])
    try:
        cluster = common.attach_cluster(args.cluster)
    except Unavailable as exc:
        return common.finish(args.json, [], [("service load", str(exc))])
    if "listen" not in cluster.config_path("ctl").read_text():
        return common.finish(args.json, [], [("service load", "the cluster runs no slurm-snap service")])
    q = args.quick
    each, burst_threads = (5, 20) if q else (25, 32)
    hosts = [*cluster.nodes, "login"]
    rows = []
    alone = _run_hosts(cluster, [("login", None)], "ping", 1, 10 if q else 40)
    print(f"one client alone: {len(alone['lat'])} pings in {alone['span']:.1f} s, p50 "
          f"{_quantile(alone['lat'], 0.5):.0f} ms", flush=True)
    got = _run_hosts(cluster, [(h, None) for h in hosts], "ping", 4, each)
    rows.append(_row(f"ping, {len(hosts)} hosts x 4 clients", got, alone))
    user_alone = _run_hosts(cluster, [("login", cluster.user)], "report", 1, 3 if q else 10)
    got = _run_hosts(cluster, [("login", cluster.user)], "report", 8, 2 if q else 8)
    row = _row(f"report --json as {cluster.user} on login, 8 clients (max_per_user)", got, user_alone)
    row.ref_name = "one report client alone on login"
    rows.append(row)
    busy0 = _busy_lines(cluster)
    got = _run_hosts(cluster, [(h, None) for h in hosts], "ping", burst_threads, 3 if q else 5)
    busy = _busy_lines(cluster) - busy0 if busy0 >= 0 else -1
    rows.append(_row(f"burst: ping, {len(hosts)} hosts x {burst_threads} clients at once (max_connections 64)",
                     got, alone, extra=f"; {busy} busy refusals retried" if busy >= 0 else ""))
    return common.finish(args.json, rows)


if __name__ == "__main__":
    sys.exit(main())
