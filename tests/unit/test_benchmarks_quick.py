"""Smoke test of the benchmark suite (benchmarks/run --quick): the pieces that
need no cluster, no root and no database server run and hand back sane rows.
No timing assertions: the numbers belong to the machine, not to the test."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402


pytestmark = pytest.mark.slow(25)   # seconds idle: the unit run starts this file early (tests/conftest.py)


def load_run():
    loader = importlib.machinery.SourceFileLoader("bench_run", str(BENCH / "run"))
    spec = importlib.util.spec_from_loader("bench_run", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


REPORT_OUT = """seeding 10,000 sets ...
seeded in 0.7 s
case                                  rows  report s  raw SQL s   ratio
default (root, since midnight)         106     0.019     0.0006    33.2
filtered (-u user7 -S now-7days)        12     0.014     0.0002    71.0
"""
COORD_OUT = """coordinator overhead, median of 2 runs; backend latency 5 ms; 2 CPUs
 nodes  ranks  overhead     min     max  target  ratio  phases ms: request signal barrier
     1      1    13.4ms   7.1ms  19.8ms    10ms   1.34  4.7 3.1 105.0
     8      8     9.0ms   7.0ms  12.0ms    15ms   0.60  6.4 1.9 102.0
    20     20    30.0ms  29.0ms  31.0ms       -    nan  1 2 3
worst ratio to target: 1.34 (over target)
"""


def test_foreign_tables_are_folded_into_rows():
    run = load_run()
    rows = run.parse_report(REPORT_OUT)
    assert [r.case for r in rows] == ["slurm-snap report: default (root, since midnight)",
                                      "slurm-snap report: filtered (-u user7 -S now-7days)"]
    assert rows[0].value == pytest.approx(19.0) and rows[0].reference == pytest.approx(0.6)
    assert "10,000 sets" in rows[0].note
    coord = run.parse_coordinator(COORD_OUT)
    assert [(r.value, r.reference, r.met) for r in coord] == [(13.4, 10.0, False), (9.0, 15.0, True),
                                                             (30.0, None, None)]
    assert run.parse_report("Traceback: boom") == [] and run.parse_coordinator("") == []


def test_missing_foreign_benchmark_is_not_available(monkeypatch, tmp_path):
    run = load_run()
    monkeypatch.setattr(run, "HERE", str(tmp_path))
    rows, unavailable, _ = run.run_bench("report", type("A", (), {"quick": True})(), None)
    assert rows == [] and unavailable == [("report", "report.py not in this tree")]


def test_every_benchmark_on_a_cluster_is_given_it():
    run = load_run()
    args = run.argparse.Namespace(quick=False, big=None, small=None, pg_url=None)
    for name in run.ORDER:
        argv = run.bench_argv(name, "script", "out.json", args, "/var/tmp/c")
        assert (argv[-2:] == ["--cluster", "/var/tmp/c"]) == (name in run.USES_CLUSTER), name
    assert {"slurm_api", "resume", "e2e", "hooks", "schedule"} <= run.USES_CLUSTER
    assert run.bench_argv("resume", "s", "o", args, None)[-2:] == ["--json", "o"]


def test_time_to_resume_gets_a_cluster_at_slurms_default_cred_expire():
    run = load_run()
    assert run.cluster_env("resume") == {"SLURM_SNAP_CRED_EXPIRE": "default"}
    assert all(run.cluster_env(n) == {} for n in run.ORDER if n != "resume")


def test_relations_and_formatting():
    added = common.Row("hooks", "x", 12.5, 2.5, "ms", "empty", "added")
    assert added.relation == pytest.approx(10.0) and common.relation_text(added) == "+10.0 ms"
    ratio = common.Row("barrier", "y", 1.0, 500.0, "ms", "poll")
    assert ratio.relation == pytest.approx(0.002) and "(1/500)" in common.relation_text(ratio)
    assert common.Row("e2e", "z", 3.0).relation is None
    assert common.fmt(12345.0, "ms") == "12.3 s"
    s = common.summarize([0.001, 0.002, 0.003])
    assert s["n"] == 3 and s["median"] == pytest.approx(2.0) and s["p10"] <= s["median"] <= s["p90"] <= s["max"]


def test_cut_sizes_parse_and_reject_bad_values():
    import cut

    assert cut.parse_size("10G:100000") == (10 << 30, 100000)
    assert cut.parse_size("64M:1000") == (64 << 20, 1000)
    assert cut.label(1 << 30, 10000) == "1 GiB/10k files"
    with pytest.raises(SystemExit, match="'10G'"):
        cut.parse_size("10G")
    with pytest.raises(SystemExit, match="> 0"):
        cut.parse_size("0M:10")


def test_installed_prolog_exits_at_once_unless_opted_in(tmp_path):
    import hooks

    prolog = hooks.install_entry_point(str(REPO / "prolog" / "slurm-snap-prolog"), str(tmp_path / "prolog"),
                                       str(tmp_path / "no-helper"), str(tmp_path / "cfg.toml"))
    text = Path(prolog).read_text()
    assert f"HELPER={tmp_path}/no-helper\n" in text and f"CONFIG={tmp_path}/cfg.toml\n" in text
    env = {"SLURM_JOB_ID": "7"}  # hooks have no PATH
    out = subprocess.run([prolog], env=env, capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stderr) == (0, "")
    opted = subprocess.run([prolog], env={**env, "SPANK_SLURM_SNAP": "1"}, capture_output=True, text=True,
                           timeout=30)
    # Opted in, the entry point goes for the helper: missing here, so it says so and fails open.
    assert opted.returncode == 0 and "no-helper" in opted.stderr and "job 7" in opted.stderr


def test_quick_suite_without_cluster(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([str(BENCH / "run"), "--quick", "--only", "barrier,inventory,e2e,agreement,schedule", "--no-cluster",
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, env={**os.environ, "SLURM_SNAP_TEST_PG_URL": ""})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    by_bench = {r["bench"]: r for r in data["rows"]}
    assert set(by_bench) == {"barrier", "inventory", "agreement", "schedule"}, (data.get("unavailable"),
                                                                               proc.stdout[-3000:])
    # A pass over 1,000 running periodic jobs reads the inventory 4 times (2 per 500 jobs), not 1,000 times.
    sched = [r for r in data["rows"] if r["bench"] == "schedule"]
    assert any("1,000" in r["case"] and r["value"] > 0 and r["note"].startswith("4 inventory queries")
               for r in sched), sched
    agreement = [r for r in data["rows"] if r["bench"] == "agreement"]
    # Measured beside its reference: the same loop without the agreement.
    assert any("overlap" in r["case"] and r["value"] > 0 and r["reference"] > 0 for r in agreement), agreement
    assert by_bench["barrier"]["value"] > 0 and by_bench["barrier"]["reference"] > 0
    sqlite = next(r for r in data["rows"] if r["case"].startswith("SQLite"))
    # Correctness, not speed: every row written by the concurrent writers is there.
    assert sqlite["met"] is True, sqlite["note"]
    assert sqlite["extra"]["counts"]["barrier_ack"] == 3 * 2 * 4 * 5
    assert any(u["bench"] == "e2e" and "no dev cluster" in u["reason"] for u in data["unavailable"])
    assert "slurm-snap benchmark results" in proc.stdout and "not available" in proc.stdout


def test_transfer_benchmark_runs_in_the_suite(tmp_path):
    """benchmarks/run lists the transfer benchmark (issue 23) and folds its
    rows in: two real btrfs on loop devices, so root."""
    from realcomponents import require
    from testkit import loopfs

    require(os.geteuid() == 0, "the transfer benchmark mounts loop devices: needs root")
    require(not loopfs.missing("btrfs"), f"btrfs on loop: {loopfs.missing('btrfs')}")
    out = tmp_path / "rows.json"
    proc = subprocess.run([str(BENCH / "run"), "--quick", "--only", "transfer", "--no-cluster", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["unavailable"] == [], data["unavailable"]
    rows = {r["case"].split(": ", 1)[1]: r for r in data["rows"]}
    assert [r["bench"] for r in data["rows"]] == ["transfer"] * 3, data["rows"]
    full = rows["full (btrfs send)"]
    incremental = next(r for c, r in rows.items() if c.startswith("incremental"))
    assert full["value"] > 0 and incremental["reference"] == full["value"]
    # Only what changed travels: a few files' bytes against the whole volume's.
    moved = lambda r: float(r["note"].split(" MiB moved")[0])  # noqa: E731
    assert 0 < moved(incremental) < moved(full) / 5, (incremental["note"], full["note"])
    assert "10. a node-local part to another node" in proc.stdout


def test_service_load_rows_count_what_was_lost():
    import service_load

    alone = {"lat": [0.02] * 10, "failed": [], "span": 0.5, "sent": 10}
    all_well = service_load._row("ping", {"lat": [0.01] * 99 + [0.2], "failed": [], "span": 2.0, "sent": 100}, alone)
    assert all_well.met is True and all_well.value == 50.0 and all_well.reference == 20.0 and all_well.unit == "req/s"
    assert "100 requests, 100 answered, 0 lost" in all_well.note and "p50 10 ms, p99 200 ms" in all_well.note
    lost = service_load._row("ping", {"lat": [0.01] * 98, "failed": ["busy", "x"], "span": 2.0, "sent": 100}, alone)
    assert lost.met is False and "2 lost" in lost.note and "first loss: busy" in lost.note


def test_service_load_without_a_cluster_is_not_available(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([str(BENCH / "run"), "--quick", "--only", "service", "--no-cluster", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert data["rows"] == [] and [u["bench"] for u in data["unavailable"]] == ["service"]
