"""Issue 32: what pyslurm saves over Slurm's commands, where it matches (25.11).

Side by side in one process on the dev cluster's controller (one run, one
queue, interleaved so drift hits both sides alike), through slurm/api.py's two
interfaces:
  - listing: the schedule runner's question (job id -> restart count of the
             running jobs) with N held jobs queued and one running:
             pyslurm's Jobs.load() (every job, with details: libslurm has no
             state filter) vs `squeue --json -t RUNNING` and its parse (the
             commands side; squeue filters before printing) and, for what
             the filter saves, `squeue --json` of every job;
  - lookup:  the Epilog's question about one job: pyslurm's Job.load() vs
             `scontrol show job J` (a fork and a text parse) and the
             `squeue --json -j J` slurm-snap's commands side runs;
  - fresh process: what a process of its own pays for its first question
             (every caller of slurm/api.py is one: each hook, each
             `schedule` pass of the systemd timer, prune, repair): the probe,
             `import pyslurm` (libslurm reads slurm.conf and loads its
             plugins) and one Job.load() or Jobs.load(), vs the same through
             the commands.
Quoted: medians in ms and pyslurm's over the command's (under x1: pyslurm
saves). Needs a cluster on a Slurm whose series pyslurm matches.

    $SLURM_SNAP_VENV/bin/python benchmarks/slurm_api.py --cluster STATE [--quick] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402
from schedule import empty_queue, fill_queue  # noqa: E402

# Runs on ctl with the cluster's SLURM_CONF and bin dir: prints a JSON of
# {case: [seconds...]}. Interleaved: each iteration times every case once.
ON_CTL = r"""
import json, statistics, subprocess, sys, time
from slurm_snap.slurm import api, commands
n, iterations, job = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
choice = api.probe()
if choice.name != "pyslurm":
    print(json.dumps({"unavailable": choice.refused or choice.why})); sys.exit(0)
py, cmd = api.Pyslurm(), api.Commands()
scontrol = commands.tool("scontrol")
squeue = commands.tool("squeue")
cases = {
    "list pyslurm": lambda: py.running_jobs(),
    "list squeue": lambda: cmd.running_jobs(),
    "list squeue unfiltered": lambda: commands.running_from_json(commands.run([squeue, "--json"], timeout=120)),
    "lookup pyslurm": lambda: py.job(job),
    "lookup scontrol": lambda: commands.run([scontrol, "show", "job", str(job)]),
    "lookup squeue": lambda: cmd.job(job),
}
for f in cases.values():
    f()
out = {k: [] for k in cases}
for _ in range(iterations):
    for k, f in cases.items():
        t = time.perf_counter(); f(); out[k].append(time.perf_counter() - t)
print(json.dumps(out))
"""

# A process's first question in a fresh interpreter: probe + import + one
# lookup (a hook) or one listing (a schedule pass).
FRESH = r"""
import sys, time
t = time.perf_counter()
from slurm_snap.slurm import api
iface = api.interface()
iface.job(int(sys.argv[2])) if sys.argv[3] == "lookup" else iface.running_jobs(timeout=120)
if api.chosen().name != sys.argv[1]:
    raise SystemExit(f"chose {api.chosen().name}, not {sys.argv[1]}")
print(time.perf_counter() - t)
"""

# Held filler jobs through libslurm, one process: 10,000 sbatch forks (each
# with the cli_filter) take longer than the shared machine's slot.
FILL_PYSLURM = r"""
import os, sys, pyslurm
n = int(sys.argv[1])
for _ in range(n):
    pyslurm.JobSubmitDescription(name="bench-queue", partitions="low", standard_output="/dev/null", priority=0,
                                 script="#!/bin/sh\ntrue\n", working_directory="/tmp",
                                 environment={"PATH": "/usr/bin:/bin"}).submit()
"""


def submit_running(cluster) -> int:
    proc = cluster.run(["sbatch", "--parsable", "-p", "high", "-J", "bench-lookup", "-o", "/dev/null",
                        "--wrap", "sleep 600"], user=cluster.user, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def on_ctl(cluster, script: str, *args, env: dict | None = None, timeout: float = 900) -> str:
    proc = cluster.run([cluster.python, "-c", script, *map(str, args)], host="ctl", timeout=timeout, env=env)
    if proc.returncode != 0:
        raise Unavailable(f"on ctl: {proc.stderr.strip()[-400:]}")
    return proc.stdout


def fresh(cluster, side: str, job: int, question: str, iterations: int) -> float:
    import statistics

    env = {"SLURM_SNAP_SLURM_API": "commands"} if side == "commands" else {}
    return statistics.median(float(on_ctl(cluster, FRESH, side, job, question, env=env))
                             for _ in range(iterations)) * 1000


def fill(cluster, n: int) -> None:
    from schedule import queue_size

    missing = n - queue_size(cluster)
    if missing > 0:
        proc = cluster.run([cluster.python, "-c", FILL_PYSLURM, str(missing)], user=cluster.user, timeout=3600)
        if proc.returncode != 0:  # pyslurm's submission refused: sbatch, slower
            fill_queue(cluster, n)


def main(argv=None) -> int:
    import statistics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_args(parser)
    parser.add_argument("--cluster", metavar="STATE", required=True, help="a dev cluster that is up")
    args = parser.parse_args(argv)
    sizes = (100, 1000) if args.quick else (1000, 10000)
    iterations = 5 if args.quick else 15
    rows, unavailable = [], []
    try:
        cluster = common.attach_cluster(args.cluster)
    except Unavailable as exc:
        return common.finish(args.json, rows, [("slurm api", str(exc))])
    job = None
    try:
        job = submit_running(cluster)
        for n in sizes:
            fill(cluster, n)
            got = json.loads(on_ctl(cluster, ON_CTL, n, iterations, job))
            if "unavailable" in got:
                unavailable.append(("pyslurm", got["unavailable"]))
                break
            med = {k: statistics.median(v) * 1000 for k, v in got.items()}
            rows.append(Row(bench="slurm_api", case=f"schedule listing, {n:,} jobs queued: pyslurm Jobs.load()",
                            value=med["list pyslurm"], reference=med["list squeue"],
                            ref_name="squeue --json -t RUNNING + parse",
                            note=f"same process, interleaved; squeue --json of every job: "
                                 f"{med['list squeue unfiltered']:.1f} ms"))
            py, cm = (fresh(cluster, side, job, "listing", iterations) for side in ("pyslurm", "commands"))
            rows.append(Row(bench="slurm_api", case=f"a schedule pass's listing in a fresh process, {n:,} queued "
                                                    "(probe, import, Jobs.load())",
                            value=py, reference=cm, ref_name="the same through squeue --json -t RUNNING",
                            note="one pass of the systemd timer is one process"))
            if n == sizes[0]:
                rows.append(Row(bench="slurm_api", case="one job lookup: pyslurm Job.load()",
                                value=med["lookup pyslurm"], reference=med["lookup scontrol"],
                                ref_name="scontrol show job", note=f"squeue --json -j: {med['lookup squeue']:.1f} ms"))
        if not unavailable:
            py, cm = (fresh(cluster, side, job, "lookup", iterations) for side in ("pyslurm", "commands"))
            rows.append(Row(bench="slurm_api", case="a hook's first lookup in a fresh process (probe, import, one job)",
                            value=py, reference=cm, ref_name="the same through squeue --json -j",
                            note="each hook is its own process"))
    finally:
        if job is not None:
            cluster.run(["scancel", str(job)], timeout=60)
        empty_queue(cluster)
    return common.finish(args.json, rows, unavailable)


if __name__ == "__main__":
    sys.exit(main())
