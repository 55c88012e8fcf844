"""Issue 36, target 2: what users run, from the command's start to its last byte.

A. On this host (no cluster), the installed helper (the venv's `slurm-snap`
   script, started by its own #! line as a user's shell starts it):
     - `--version`, `--help`, `report --helpformat`: target at most x5 of
       `python -c pass` (the same interpreter), measured beside them;
     - `report` as root on the controller with a local, empty, migrated SQLite
       inventory: target at most the import of `sqlalchemy.orm` (a process
       that does only that) + 30 ms.
B. With --cluster STATE (a scripts/dev-cluster: users on login reach the
   inventory through `slurm-snap serve` on ctl): `report` and `show` as the
   cluster's test user on login, timed on login itself (a timing loop there
   runs each command as a child process); the user has no sets, so the
   inventory is empty for them: target at most 100 ms wall each. Beside
   them, `python -c pass` on login.
Each group's cases run interleaved, medians.

    $SLURM_SNAP_VENV/bin/python benchmarks/cli.py [--quick] [--cluster STATE] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402

HELPER = os.path.join(os.path.dirname(common.VENV_PY), "slurm-snap")
START_RATIO = 5.0          # --help/--version/--helpformat: at most x5 of python -c pass
LOCAL_ADDED_MS = 30.0      # controller-local report: at most import sqlalchemy.orm + 30 ms
LOGIN_MS = 100.0           # report/show on login through the service: at most 100 ms

# Runs on the host being measured: each argv N times, interleaved, as child
# processes; prints {name: [seconds, ...]} and each one's last exit status.
TIMER = r"""
import json, subprocess, sys, time
cases, n = json.loads(sys.argv[1]), int(sys.argv[2])
out, rc = {k: [] for k in cases}, {}
for i in range(n + 1):                       # the first round warms the page cache
    for name, argv in cases.items():
        t = time.perf_counter()
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        d = time.perf_counter() - t
        rc[name] = [p.returncode, p.stderr.decode(errors="replace")[-300:]]
        if i:
            out[name].append(d)
print(json.dumps({"times": out, "rc": rc}))
"""


def _timed(cases: dict[str, list[str]], n: int, runner=None) -> tuple[dict[str, dict], dict]:
    argv = [common.VENV_PY, "-c", TIMER, json.dumps(cases), str(n)]
    proc = runner(argv) if runner else subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    try:
        got = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise Unavailable(f"timing loop exited {proc.returncode}: {proc.stderr.strip()[-300:]}") from None
    return {k: common.summarize(v) for k, v in got["times"].items()}, got["rc"]


def _local_config(tmp: str) -> str:
    """An admin's config on the controller with a migrated, empty SQLite inventory."""
    db = os.path.join(tmp, "inventory.db")
    cfg = os.path.join(tmp, "slurm-snap.toml")
    with open(cfg, "w") as f:
        f.write(f'[inventory]\nurl = "sqlite:///{db}"\n\n[paths]\nbarrier_dir = "{tmp}/barriers"\n'
                f'log_dir = "{tmp}/log"\nrestore_root = "{tmp}/restore"\n\n[spool]\ndirectory = "{tmp}/spool"\n')
    subprocess.run([HELPER, "--config", cfg, "db", "upgrade"], check=True, capture_output=True, timeout=300)
    return cfg


def bench_local(quick: bool) -> list[Row]:
    if not os.access(HELPER, os.X_OK):
        raise Unavailable(f"{HELPER} is not installed (scripts/test or dev-cluster up installs the venv)")
    n = 5 if quick else 40
    rows = []
    py = common.VENV_PY
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        cfg = _local_config(tmp)
        env_note = "the venv's helper by its #! line; medians, interleaved"
        stats, rc = _timed({"pass": [py, "-c", "pass"],
                            "--version": [HELPER, "--version"], "--help": [HELPER, "--help"],
                            "report --helpformat": [HELPER, "report", "--helpformat"],
                            "orm": [py, "-c", "import sqlalchemy.orm"],
                            "report": [HELPER, "--config", cfg, "report"]}, n)
    bad = {k: v for k, v in rc.items() if v[0] != 0}
    if bad:
        raise Unavailable(f"commands failed: {bad}")
    ref = stats["pass"]["median"]
    for name in ("--version", "--help", "report --helpformat"):
        v = stats[name]["median"]
        rows.append(Row("cli", f"slurm-snap {name}", v, ref, "ms", "python -c pass", "ratio",
                        f"<= x{START_RATIO:g}", v <= START_RATIO * ref,
                        f"median of {stats[name]['n']}, p90 {stats[name]['p90']:.1f} ms; {env_note}", stats[name]))
    orm, rep = stats["orm"]["median"], stats["report"]["median"]
    rows.append(Row("cli", "report on the controller, local empty SQLite inventory", rep, orm, "ms",
                    "python -c 'import sqlalchemy.orm'", "added", f"<= +{LOCAL_ADDED_MS:g} ms",
                    rep - orm <= LOCAL_ADDED_MS,
                    f"median of {stats['report']['n']}, p90 {stats['report']['p90']:.1f} ms; as root", stats["report"]))
    return rows


def bench_login(state: str, quick: bool) -> list[Row]:
    cl = common.attach_cluster(state)
    n = 5 if quick else 30
    cases = {"pass": [cl.python, "-c", "pass"],
             "report": [cl.helper, "--config", cl.config, "report"],
             "show": [cl.helper, "--config", cl.config, "show", "999999"]}
    stats, rc = _timed(cases, n, runner=lambda argv: cl.run([cl.python, *argv[1:]], user=cl.user, host="login",
                                                            timeout=1800))
    if rc["report"][0] != 0:
        raise Unavailable(f"report on login exited {rc['report'][0]}: {rc['report'][1]}")
    rows = []
    for name, what in (("report", "report"), ("show", "show (a job without sets: the service's not-found answer)")):
        s = stats[name]
        rows.append(Row("cli", f"login, as the user through the service: {what}", s["median"], stats["pass"]["median"],
                        "ms", "python -c pass on login", "added", f"<= {LOGIN_MS:g} ms wall", s["median"] <= LOGIN_MS,
                        f"median of {s['n']}, p90 {s['p90']:.1f} ms; exit {rc[name][0]}; timed on login", s))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.standard_args(ap)
    ap.add_argument("--cluster", metavar="STATE", help="a dev cluster that is up (scripts/dev-cluster up STATE)")
    args = ap.parse_args(argv)
    rows, unavailable = [], []
    for what, fn in (("on this host", lambda: bench_local(args.quick)),
                     ("login through the service", lambda: bench_login(args.cluster, args.quick) if args.cluster
                      else (_ for _ in ()).throw(Unavailable("no dev cluster (--cluster STATE)")))):
        try:
            rows += fn()
        except Unavailable as exc:
            unavailable.append((what, str(exc)))
    return common.finish(args.json, rows, unavailable)


if __name__ == "__main__":
    sys.exit(main())
