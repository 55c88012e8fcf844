"""Issue 9, item 1: what the hooks cost on the job start path.

A. The Prolog entry point (prolog/slurm-snap-prolog, installed with HELPER
   and CONFIG substituted the way scripts/lib-slurm.sh does) run with a real
   hook environment and no PATH, against an empty Prolog (/bin/true):
     - a job that did not opt in (no SPANK_SLURM_SNAP): target within a few ms;
     - a job that did (head node of a 3-node job declaring scratch,pfs), with a
       real config, SQLite inventory and btrfs volume classes on a loop device;
       every run is a new job, so each creates its per-job subvolume and
       records the job, as on a real node: target at most 30 ms added (issue 36).
   Each pair is timed interleaved; medians.
B. With --cluster STATE (a scripts/dev-cluster, multi-host): short 1-node jobs
   submitted on login with and without slurm-snap options, interleaved; from slurmctld's own
   millisecond log stamps: allocation -> job done (the start path: both
   Prologs, then the batch script) and submit -> done; plus the sbatch
   command itself (the SPANK plugin validates the options by exec'ing the helper).

    $SLURM_SNAP_VENV/bin/python benchmarks/hooks.py [--quick] [--cluster STATE] [--json OUT]
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import pwd
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402

HELPER = os.path.join(os.path.dirname(common.VENV_PY), "slurm-snap")
PROLOG_SRC = os.path.join(common.REPO, "prolog", "slurm-snap-prolog")
OPTED_OUT_TARGET_MS = 5.0     # "within a few ms of empty"
OPTED_IN_TARGET_MS = 30.0     # issue 36: "at most +30 ms" (issue 9 asked < 100 ms)
SBATCH_TARGET_MS = 30.0       # issue 36: sbatch with options at most +30 ms over sbatch alone
NODES = ("n1", "n2", "n3")
IMPORTS = "import slurm_snap.entry, slurm_snap.hooks.run, slurm_snap.hooks.jobhooks, slurm_snap.backends.factory, slurm_snap.backends.btrfs"


def install_entry_point(src: str, dest: str, helper: str, config: str) -> str:
    """The same substitution scripts/lib-slurm.sh install_slurm_snap makes."""
    out = []
    for line in open(src).read().splitlines(keepends=True):
        if line.startswith("HELPER="):
            line = f"HELPER={helper}\n"
        elif line.startswith("CONFIG="):
            line = f"CONFIG={config}\n"
        out.append(line)
    with open(dest, "w") as f:
        f.writelines(out)
    os.chmod(dest, 0o755)
    return dest


def write_config(path: str, mnt: str) -> None:
    with open(path, "w") as f:
        f.write(f"""[inventory]
url = "sqlite:///{mnt}/../inventory.db"

[paths]
allowed_roots = ["{mnt}"]
barrier_dir = "{mnt}/pfs/.slurm-snap/barriers"
restore_root = "{mnt}/pfs/.slurm-snap/restore"
log_dir = "{mnt}/../log"

[hooks]
failure_policy = "open"

[[volume_class]]
name = "scratch"
prefix = "{mnt}/scratch/{{node}}"
scope = "node-local"
backend = "btrfs"
default = true

[[volume_class]]
name = "pfs"
prefix = "{mnt}/pfs"
scope = "shared"
backend = "btrfs"
default = true
""")


def hook_env(job_id: int, user: pwd.struct_passwd, opted_in: bool) -> dict[str, str]:
    """What slurmd gives a Prolog (docs: SLURM-LAB "Hook environment"): no PATH."""
    env = {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOB_UID": str(user.pw_uid), "SLURM_JOB_GID": str(user.pw_gid),
        "SLURM_JOB_USER": user.pw_name, "SLURMD_NODENAME": NODES[0], "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_NODELIST": "n[1-3]", "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_PARTITION": "low",
        "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_JOB_RESTART_COUNT": "0",
    }
    if opted_in:
        env.update(SPANK_SLURM_SNAP="1", SPANK_SLURM_SNAP_ON_PREEMPT="1",
                   SPANK_SLURM_SNAP_VOLUMES="scratch,pfs", SPANK_SLURM_SNAP_CONSISTENCY="app")
    return env


def bench_entry_point(quick: bool) -> list[Row]:
    if not os.access(HELPER, os.X_OK):
        raise Unavailable(f"helper {HELPER} not installed")
    user = pwd.getpwnam("nobody")
    n_out = 40 if quick else 300
    n_in = 4 if quick else 40
    with common.loop_btrfs(1 << 30, prefix="bench-hooks-") as mnt:
        top = os.path.dirname(mnt)
        for n in NODES:
            os.makedirs(os.path.join(mnt, "scratch", n))
        os.makedirs(os.path.join(mnt, "pfs", ".slurm-snap", "barriers"))
        cfg = os.path.join(top, "slurm-snap.toml")
        write_config(cfg, mnt)
        # Hooks run with cwd = Slurm's log dir; the working directory must not matter.
        common.run([HELPER, "--config", cfg, "db", "upgrade"], env={"PATH": common.SBIN})
        prolog = install_entry_point(PROLOG_SRC, os.path.join(top, "slurm-snap-prolog"), HELPER, cfg)
        true = "/bin/true"
        next_job = iter(range(1000, 1_000_000))
        opted_in_runs: list[int] = []

        def call(argv, env):
            rc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=top, timeout=60).returncode
            if rc != 0:
                raise RuntimeError(f"{argv[0]} exited {rc}")

        out_env = hook_env(999, user, False)

        def opted_in():
            jid = next(next_job)
            opted_in_runs.append(jid)
            call([prolog], hook_env(jid, user, True))

        a = common.interleaved({"empty": lambda: call([true], out_env),
                                "opted-out": lambda: call([prolog], out_env)}, n_out)
        py = os.path.join(os.path.dirname(HELPER), "python")
        # Where the opted-in time goes: the interpreter, then the imports of the hook path.
        b = common.interleaved({"empty": lambda: call([true], out_env), "opted-in": opted_in,
                                "python": lambda: call([py, "-c", "pass"], out_env),
                                "imports": lambda: call([py, "-c", IMPORTS], out_env)}, n_in, warmup=1)
        verified = verify_opted_in(cfg, mnt, opted_in_runs, top)
    s_empty_a, s_out = common.summarize(a["empty"]), common.summarize(a["opted-out"])
    s_empty_b, s_in = common.summarize(b["empty"]), common.summarize(b["opted-in"])
    added_out = s_out["median"] - s_empty_a["median"]
    added_in = s_in["median"] - s_empty_b["median"]
    s_py, s_imp = common.summarize(b["python"]), common.summarize(b["imports"])
    return [
        Row("hooks", "Prolog entry point, job not opted in", s_out["median"], s_empty_a["median"], "ms",
            "empty Prolog", "added", f"< {OPTED_OUT_TARGET_MS:g} ms added", added_out < OPTED_OUT_TARGET_MS,
            f"median of {s_out['n']}, p90 {s_out['p90']:.2f} ms", {"opted_out": s_out, "empty": s_empty_a}),
        Row("hooks", "Prolog entry point, job opted in (btrfs)", s_in["median"], s_empty_b["median"], "ms",
            "empty Prolog", "added", f"<= {OPTED_IN_TARGET_MS:g} ms added", added_in <= OPTED_IN_TARGET_MS,
            f"median of {s_in['n']}, p90 {s_in['p90']:.0f} ms; {verified}", {"opted_in": s_in, "empty": s_empty_b}),
        Row("hooks", "  of which: Python interpreter start", s_py["median"], s_empty_b["median"], "ms",
            "empty Prolog", "added"),
        Row("hooks", "  of which: + imports of the hook path", s_imp["median"], s_empty_b["median"], "ms",
            "empty Prolog", "added", note="python -c 'import " + IMPORTS[7:] + "'"),
    ]


def verify_opted_in(cfg_path: str, mnt: str, job_ids: list[int], top: str) -> str:
    """The opted-in runs did the node Prolog's real work: every head-node volume
    a btrfs subvolume (inode 256), the job's barrier directory and job.json, no
    failure in hooks.log. (Recording in the inventory is PrologSlurmctld's job,
    on the controller, off the node's start path.)"""
    import json

    from slurm_snap.config import load

    cfg = load(cfg_path)
    for jid in job_ids:
        job_json = os.path.join(cfg.paths.barrier_dir, str(jid), "job.json")
        vols = json.load(open(job_json))["volumes"]
        if len(vols) != len(NODES) + 1:
            raise RuntimeError(f"job {jid}: {len(vols)} volumes in job.json, expected {len(NODES) + 1}")
        for v in vols:
            if v["node"] in (None, NODES[0]) and os.stat(v["path"]).st_ino != 256:
                raise RuntimeError(f"job {jid}: {v['path']} is not a subvolume")
    log = os.path.join(top, "log", "hooks.log")
    failed = [ln for ln in open(log)] if os.path.exists(log) else []
    failed = [ln for ln in failed if '"status": "failed"' in ln]
    if failed:
        raise RuntimeError(f"{len(failed)} hook runs failed: {failed[0][:300]}")
    return f"checked: {len(job_ids)} jobs prepared, subvolumes created"


# --- B: on the dev cluster ----------------------------------------------------------
LOG_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")


def _stamp(text: str) -> float:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def ctld_events(log_path: str, offset: int) -> dict[int, dict[str, float]]:
    """job id -> {submit, alloc, configured, done} from slurmctld.log past `offset`."""
    events: dict[int, dict[str, float]] = {}
    with open(log_path, errors="replace") as f:
        f.seek(offset)
        for line in f:
            m = LOG_STAMP.match(line)
            if not m:
                continue
            t, msg = _stamp(m.group(1)), m.group(2)
            for key, pat in (("submit", r"_slurm_rpc_submit_batch_job: JobId=(\d+) "),
                             ("alloc", r"sched: Allocate JobId=(\d+) "),
                             # the backfill scheduler starts some jobs itself
                             ("alloc", r"sched/backfill: _start_job: Started JobId=(\d+) "),
                             ("configured", r"prolog_running_decr: Configuration for JobId=(\d+) is complete"),
                             ("done", r"_job_complete: JobId=(\d+) done")):
                jm = re.search(pat, msg)
                if jm:
                    events.setdefault(int(jm.group(1)), {}).setdefault(key, t)
    return events


def bench_cluster(state: str, quick: bool) -> list[Row]:
    from testkit.cluster import ClusterError

    cl = common.attach_cluster(state)
    log_path = str(cl.host_dir("ctl") / "log" / "slurmctld.log")   # slurmctld runs on ctl
    n = 3 if quick else 15
    variants = {"plain": [], "opted-in": ["--snapshot-volumes=scratch,pfs"]}
    ids: dict[str, list[int]] = {k: [] for k in variants}
    sbatch_s: dict[str, list[float]] = {k: [] for k in variants}
    offset = os.path.getsize(log_path)
    rnd = random.Random(9)
    for i in range(n + 1):  # the first round warms the page cache of the helper
        for name, opts in variants.items():
            # slurmctld allocates on a one-second tick: submitting right after
            # the previous job ended would give each variant its own phase of
            # that tick. A random pause spreads both over it alike.
            time.sleep(rnd.random())
            t = time.perf_counter()
            jid = cl.sbatch("-N1", "-w", NODES[0], "-o", "/dev/null", *opts, "--wrap", "/bin/true")
            took = time.perf_counter() - t
            wait_done(log_path, offset, jid, timeout=60)
            # The Epilog runs after "done"; let the node go idle so the next job
            # does not queue behind it.
            cl.wait_state(jid, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
            if i:
                ids[name].append(jid)
                sbatch_s[name].append(took)
    ev = ctld_events(log_path, offset)
    stats = {}
    for name in variants:
        alloc_done = [ev[j]["done"] - ev[j]["alloc"] for j in ids[name] if {"alloc", "done"} <= ev.get(j, {}).keys()]
        submit_done = [ev[j]["done"] - ev[j]["submit"] for j in ids[name]
                       if {"submit", "done"} <= ev.get(j, {}).keys()]
        if len(alloc_done) != len(ids[name]):
            raise ClusterError(f"slurmctld.log lacks allocation/completion lines for some {name} jobs")
        stats[name] = {"alloc_done": common.summarize(alloc_done), "submit_done": common.summarize(submit_done),
                       "sbatch": common.summarize(sbatch_s[name])}
    p, o = stats["plain"], stats["opted-in"]
    added = o["alloc_done"]["median"] - p["alloc_done"]["median"]
    return [
        Row("hooks", "cluster: allocation -> job done (1 node)", o["alloc_done"]["median"],
            p["alloc_done"]["median"], "ms", "job without options", "added", f"<= {OPTED_IN_TARGET_MS:g} ms added",
            added <= OPTED_IN_TARGET_MS, f"median of {n}; both Prologs + /bin/true batch script", stats),
        Row("hooks", "cluster: submit -> job done (1 node)", o["submit_done"]["median"],
            p["submit_done"]["median"], "ms", "job without options", "added", "",
            None, "includes waiting for the scheduler's 1 s tick (random phase, both variants)"),
        Row("hooks", "cluster: sbatch command (SPANK validation)", o["sbatch"]["median"], p["sbatch"]["median"], "ms",
            "sbatch without options", "added", f"<= +{SBATCH_TARGET_MS:g} ms",
            o["sbatch"]["median"] - p["sbatch"]["median"] <= SBATCH_TARGET_MS,
            f"median of {n}; submit path, not start path"),
    ]


def wait_done(log_path: str, offset: int, job_id: int, timeout: float) -> None:
    needle = f"_job_complete: JobId={job_id} done"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(log_path, errors="replace") as f:
            f.seek(offset)
            if needle in f.read():
                return
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} not done within {timeout:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.standard_args(ap)
    ap.add_argument("--cluster", metavar="STATE", help="a dev cluster that is up (scripts/dev-cluster up STATE)")
    ap.add_argument("--skip-entry-point", action="store_true")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    unavailable: list[tuple[str, str]] = []
    if not args.skip_entry_point:
        try:
            rows += bench_entry_point(args.quick)
        except Unavailable as exc:
            unavailable.append(("Prolog entry point", str(exc)))
    if args.cluster:
        try:
            rows += bench_cluster(args.cluster, args.quick)
        except Exception as exc:  # a broken cluster is a reason to report, not a crash of the suite
            unavailable.append(("cluster job latency", f"{type(exc).__name__}: {exc}"))
    print("hook cost on the job start path (medians)")
    return common.finish(args.json, rows, unavailable)


if __name__ == "__main__":
    sys.exit(main())
