"""Issue 32: time to resume after a preemption, per Slurm version, at Slurm's
DEFAULT cred_expire (120 s): from the slowest rank's acknowledgement to the
requeued run's first training step.

The demo's job (examples/train.py, 3 nodes x 2 ranks, --snapshot-on-preempt,
early release: rank 0 requeues once every rank acknowledged) is preempted on an
otherwise idle cluster by a 3-node job that ends at once. Before 25.11 the
requeued job waits cred_expire before it may start again; on 25.11+ the
dev cluster's cli_filter asks for --requeue=expedite (SlurmctldParameters=
enable_expedited_requeue), which makes it eligible at once. Phases: slowest
ack -> requeued run's start (Slurm's start_time), -> first step printed after
"resumed from step" (polled every 0.1 s). Target on 25.11+: at most 15 s.

The cluster must be up with SLURM_SNAP_CRED_EXPIRE=default:

    SLURM_SNAP_CRED_EXPIRE=default SLURM_SNAP_SLURM=25.11 scripts/dev-cluster up STATE
    $SLURM_SNAP_VENV/bin/python benchmarks/resume.py --cluster STATE [--runs N] [--json OUT]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402
from e2e import SBATCH, TRAIN_PY, _finished_preempt_set, _set_record, _steps  # noqa: E402

TARGET_S = 15.0


def _config(cl) -> dict[str, str]:
    out = cl.run(["scontrol", "show", "config"], host="ctl", timeout=30).stdout
    return {k.strip(): v.strip() for k, v in (line.split(" = ", 1) for line in out.splitlines() if " = " in line)}


# The requeued run's output, in the order it comes: every rank prints "rank R
# pid P ..." once torch and slurm_snap are imported, then "resumed from step
# N" after the gloo rendezvous and the checkpoint's load, then its steps.
PHASES = (("ranks_up", re.compile(r"^rank \d+ pid ", re.M)),
          ("resumed", re.compile(r"^resumed from step ", re.M)),
          ("first_step", re.compile(r"^step ", re.M)))


def _seen(log: str, offset: int, seen: dict[str, float]) -> None:
    """Stamps (time.time()) each phase in `seen` the first time the log past
    `offset` shows it, each after the one before it."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            text = f.read()
    except OSError:
        return
    at = 0
    for name, pattern in PHASES:
        m = pattern.search(text, at)
        if m is None:
            return
        seen.setdefault(name, time.time())
        at = m.end()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def one_run(cl) -> dict:
    from slurm_snap.slurm.version import json_number

    out_dir = cl.make_user_dir(f"bench-resume-{time.monotonic_ns()}")
    log = os.path.join(out_dir, "train-%j.out")
    jid = cl.sbatch("-p", "low", "-o", log, f"--export=ALL,TRAIN_PY={TRAIN_PY},SLURM_SNAP_PYTHON={cl.python}",
                    SBATCH, cwd=str(out_dir))
    log = log.replace("%j", str(jid))
    preemptor = None
    try:
        cl.wait_state(jid, "RUNNING", timeout=90)
        deadline = time.monotonic() + 120
        while _steps(log) < 9:
            if time.monotonic() > deadline:
                raise Unavailable("training did not start in 120 s")
            time.sleep(0.2)
        offset = _size(log)
        preemptor = cl.preempt()
        deadline = time.monotonic() + 400
        seen: dict[str, float] = {}
        while "first_step" not in seen:
            _seen(log, offset, seen)
            if time.monotonic() > deadline:
                raise Unavailable(f"job {jid} did not resume within 400 s of its preemption")
            time.sleep(0.1)
        resumed_at = seen["first_step"]
        job = cl.job(jid)
        start = float(json_number(job.raw.get("start_time"))) if job is not None else 0.0
        # With expedited requeue the next run may print its first step before
        # the preempted run's set is finished (its Epilog still records).
        found, until = None, time.monotonic() + 120
        while found is None and time.monotonic() < until:
            found = cl.inventory(_finished_preempt_set, jid)
            time.sleep(0.5)
        if found is None:
            raise Unavailable(f"no finished preemption set for job {jid}")
        rec, acks, _cuts = cl.inventory(_set_record, found)
        expedited = "Requeue=expedite" in cl.run(["scontrol", "show", "job", str(jid)], host="ctl", timeout=30).stdout \
            or "ExpeditedRequeue=Yes" in cl.run(["scontrol", "show", "job", str(jid)], host="ctl", timeout=30).stdout
    finally:
        cl.cancel(jid, *([preemptor] if preemptor else []))
    slowest = max(acks)
    return {"job": jid, "slowest_ack": slowest, "start": start, "first_step": resumed_at,
            "to_start_s": start - slowest if start else None, "to_first_step_s": resumed_at - slowest,
            "phases_s": {k: round(v - slowest, 2) for k, v in seen.items()},
            "set_state": rec["state"], "expedited": expedited}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_args(parser)
    parser.add_argument("--cluster", metavar="STATE", required=True)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        cl = common.attach_cluster(args.cluster)
    except Unavailable as exc:
        return common.finish(args.json, [], [("resume", str(exc))])
    cfg = _config(cl)
    version = cfg.get("SLURM_VERSION", "?")
    auth = cfg.get("AuthInfo", "")
    if "cred_expire" in auth:
        return common.finish(args.json, [], [("resume", f"AuthInfo = {auth}: bring the cluster up with "
                                                        "SLURM_SNAP_CRED_EXPIRE=default")])
    runs = [one_run(cl) for _ in range(max(1, args.runs))]
    first = statistics.median(r["to_first_step_s"] for r in runs)
    starts = [r["to_start_s"] for r in runs if r["to_start_s"] is not None]
    expedite = all(r["expedited"] for r in runs)
    newer = version.split(".")[:2] >= ["25", "11"]
    rows = [Row(bench="resume", case=f"Slurm {version}: slowest ack -> requeued run's first step "
                                     f"({'expedited requeue' if expedite else 'cred_expire default'})",
                value=first, unit="s", target=f"<= {TARGET_S:g} s" if newer else "",
                met=(first <= TARGET_S) if newer else None,
                note=(f"-> Slurm start {statistics.median(starts):.1f} s; " if starts else "")
                + "".join(f"-> {k} {statistics.median(r['phases_s'][k] for r in runs):.1f} s; "
                          for k, _p in PHASES[:-1])
                + f"{len(runs)} run(s), sets {','.join(r['set_state'] for r in runs)}",
                extra={"runs": runs, "slurm_version": version})]
    return common.finish(args.json, rows, [])


if __name__ == "__main__":
    sys.exit(main())
