"""What etc/ ships for monitoring: Prometheus alert rules, the Grafana
dashboard and the systemd timer that writes the textfile.

promtool (Debian's `prometheus`, which scripts/test installs: TEST_PACKAGES in
scripts/lib-packages.sh) is a real component: missing in CI is a failure,
locally a skip that says why.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from realcomponents import require
from slurm_snap.cli import metrics_cmd
from test_report_seed import ROOT, invoke, seed, write_config

ETC = Path(__file__).resolve().parents[2] / "etc"
RULES = ETC / "prometheus" / "slurm-snap.rules.yml"
DASHBOARD = ETC / "grafana" / "slurm-snap.json"
SERVICE = ETC / "slurm-snap-metrics.service"
TIMER = ETC / "slurm-snap-metrics.timer"
# Every timer/service pair shipped, with the subcommand its ExecStart runs.
UNIT_PAIRS = [(TIMER, SERVICE, "metrics"),
              (ETC / "slurm-snap-schedule.timer", ETC / "slurm-snap-schedule.service", "schedule"),
              (ETC / "slurm-snap-node-agent.timer", ETC / "slurm-snap-node-agent.service", "node-agent")]
# How often each timer runs its pass.
PERIOD = {"metrics": "1min", "schedule": "1min", "node-agent": "30s"}
SERIES = re.compile(r"\bslurm_snap_[a-zA-Z0-9_]+")


@pytest.fixture(scope="module")
def exposition(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("metrics")
    url = f"sqlite:///{d}/inv.db"
    seed(url)
    # One job takes periodic snapshots and recorded a resume command, so its per-job series are exported too.
    from sqlalchemy import update

    from slurm_snap.inventory.models import JobRun
    from slurm_snap.inventory.repository import Inventory

    inv = Inventory(url)
    with inv.session() as repo:
        repo.s.execute(update(JobRun).where(JobRun.job_id == 1001).values(
            snapshot_every=3600, options={"resume_cmd": "python train.py --resume"}))
    inv.dispose()
    config = write_config(d, url)
    with open(config, "a") as f:         # scheduled drills on: the overdue gauge is exported too
        f.write('\n[restore]\nverify_within = "1h"\n')
    code, out, exc = invoke(metrics_cmd.command, [], config, ROOT)
    assert code == 0, exc
    return out


def exported(text: str) -> set[str]:
    """Sample names in the exposition (a summary's are NAME_sum and NAME_count)."""
    return {re.split(r"[{ ]", line, 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, "promtool not installed (apt-get install prometheus)")
    return path


def rule_exprs() -> list[str]:
    """Every alert's expression. The rules file keeps each on one line, so
    that a regex reads them without a YAML parser; the count check catches a
    rule written otherwise."""
    text = RULES.read_text()
    exprs = re.findall(r"^\s+expr: (.+)$", text, re.M)
    assert len(exprs) == len(re.findall(r"^\s+- alert: ", text, re.M)) > 0
    return exprs


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


# --- Prometheus -----------------------------------------------------------

def test_the_exposition_passes_promtool_check_metrics(exposition):
    r = subprocess.run([promtool(), "check", "metrics"], input=exposition, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout + r.stderr == ""


def test_promtool_check_metrics_would_catch_a_counter_without_total():
    """The check above can fail: promtool lints what the exposition must avoid."""
    bad = "# HELP slurm_snap_failures a\n# TYPE slurm_snap_failures counter\nslurm_snap_failures 1\n"
    r = subprocess.run([promtool(), "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "_total" in r.stdout + r.stderr


def test_the_rules_pass_promtool_check_rules():
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 7 rules found" in r.stdout


RUNBOOK = "file:///usr/local/src/slurm-snap/docs/troubleshooting.md#"


def _alert(eval_time, name, labels=None, annotations=None):
    """An expected firing of `name` (several when labels and annotations are lists)."""
    if labels is None:
        return {"eval_time": eval_time, "alertname": name, "exp_alerts": []}
    if isinstance(labels, dict):
        labels, annotations = [labels], [annotations]
    exp = [{"exp_labels": lb, "exp_annotations": {**an, "runbook_url": RUNBOOK + name.lower()}}
           for lb, an in zip(labels, annotations)]
    return {"eval_time": eval_time, "alertname": name, "exp_alerts": exp}


def test_the_rules_fire_on_the_series_metrics_writes(tmp_path):
    """`promtool test rules` over series shaped as `slurm-snap metrics` writes
    them: each alert fires when it should, and a counter that stays flat
    (prune does not lower it, so it never dips and comes back) fires nothing."""
    inst = {"instance": "ctl"}
    series = [
        # One FAILED set at minute 10, then none; the PARTIAL counter never moves.
        ('slurm_snap_failures_total{state="FAILED",reason="barrier timeout",instance="ctl"}', "1x10 2x200"),
        ('slurm_snap_failures_total{state="PARTIAL",reason="zfs",instance="ctl"}', "3x200"),
        ('slurm_snap_failures_total{state="FAILED_RESTORE",reason="restore test N",instance="ctl"}', "0x20 1x200"),
        ('slurm_snap_hook_failures_total{instance="ctl"}', "5x30 6x200"),
        # Periodic jobs only have per-job series: 7 has no verified set yet (+Inf), 8's point
        # is a day old against a 2-day interval, 9 takes a set every 10 minutes and its verified
        # point is an hour old.
        ('slurm_snap_newest_verified_age_seconds{job_id="7",instance="ctl"}', "Inf+0x900"),
        ('slurm_snap_rpo_objective_seconds{job_id="7",instance="ctl"}', "3600x900"),
        ('slurm_snap_newest_verified_age_seconds{job_id="8",instance="ctl"}', "86000+60x900"),
        ('slurm_snap_rpo_objective_seconds{job_id="8",instance="ctl"}', "172800x900"),
        ('slurm_snap_newest_verified_age_seconds{job_id="9",instance="ctl"}', "3600x900"),
        ('slurm_snap_rpo_objective_seconds{job_id="9",instance="ctl"}', "600x900"),
        # Three sets went past verify_within undrilled at minute 30.
        ('slurm_snap_drills_overdue{instance="ctl"}', "0x30 3x900"),
        # The textfile stopped being written at minute 0.
        ('slurm_snap_collected_timestamp_seconds{instance="ctl"}', "0x900"),
    ]
    tests = [
        _alert("30m", "SlurmSnapSetsFailing", {"severity": "warning", "state": "FAILED", "reason": "barrier timeout"},
               {"summary": "1 snapshot set(s) became FAILED in the last hour (barrier timeout)",
                "description": "`slurm-snap report -s failed,partial,rolled_back -S now-1hours` lists them; "
                               "`slurm-snap show JOBID` says why."}),
        _alert("3h", "SlurmSnapSetsFailing"),
        _alert("1h", "SlurmSnapRestoreDrillsFailing", {"severity": "critical", "reason": "restore test N"},
               {"summary": "1 restore drill(s) failed in the last 6 hours",
                "description": "A set that does not restore is not a recovery point: "
                               "`slurm-snap report -s failed_restore`."}),
        _alert("40m", "SlurmSnapHookFailures", {"severity": "warning", **inst},
               {"summary": "1 slurm-snap hook failure(s) in the last hour",
                "description": "Under failure_policy open the jobs ran unprotected; `slurm-snap show JOBID` "
                               "lists each hook-failed event."}),
        # 7 (none verified) and 9 (3600 s > 2 x 600 s) from the start; the rule waits 30 minutes.
        # 8 is within twice its objective.
        _alert("20m", "SlurmSnapRPOObjectiveMissed"),
        _alert("40m", "SlurmSnapRPOObjectiveMissed", [{"severity": "warning", "job_id": job, **inst} for job in "79"],
               [{"summary": f"job {job}: verified RPO past twice its --snapshot-every objective",
                 "description": f"`slurm-snap report -j {job} -o JobID,Trigger,State,Cut,RPO,Objective,RPOMet` shows "
                                "which sets were cut and drilled; check `systemctl status slurm-snap-schedule.service`."}
                for job in "79"]),
        _alert("80m", "SlurmSnapDrillsOverdue"),
        _alert("100m", "SlurmSnapDrillsOverdue", {"severity": "warning", **inst},
               {"summary": "3 snapshot set(s) not drilled within restore.verify_within",
                "description": "Raise [schedule] drills or check `slurm-snap schedule --dry-run` and the drills' "
                               "reasons in `slurm-snap report -s complete`."}),
        _alert("9m", "SlurmSnapMetricsStale"),
        _alert("20m", "SlurmSnapMetricsStale", {"severity": "warning", **inst},
               {"summary": "slurm-snap metrics on ctl are 20m 0s old",
                "description": "Check `systemctl status slurm-snap-metrics.service` and `slurm-snap doctor` "
                               "on the controller."}),
        _alert("20m", "SlurmSnapMetricsAbsent"),
    ]
    shutil.copy(RULES, tmp_path / RULES.name)
    spec = {"rule_files": [RULES.name], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                       "alert_rule_test": tests},
                      # Nothing scraped at all: only the absent rule speaks.
                      {"interval": "1m", "input_series": [],
                       "alert_rule_test": [_alert("20m", "SlurmSnapMetricsAbsent", {"severity": "warning"},
                                                  {"summary": "no slurm-snap metrics are scraped",
                                                   "description": "Enable etc/slurm-snap-metrics.timer on the "
                                                                  "controller and check node_exporter's textfile "
                                                                  "directory."})]}]}
    (tmp_path / "test.yml").write_text(json.dumps(spec))  # JSON is YAML
    r = subprocess.run([promtool(), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def _alerts() -> dict[str, dict[str, str]]:
    """Alert name -> its annotations, read from the rules file (one key per line)."""
    out, name = {}, None
    for line in RULES.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- alert: "):
            name = stripped.split(": ", 1)[1]
            out[name] = {}
        elif name and re.match(r"(summary|description|runbook_url): ", stripped):
            key, value = stripped.split(": ", 1)
            out[name][key] = value.strip("'\"")
    return out


def test_every_alert_has_a_runbook_url_to_its_troubleshooting_section():
    """Issue 35 item 6: each alert links the section of docs/troubleshooting.md
    that says what to do (a GitHub-style anchor of its heading)."""
    doc = (ETC.parent / "docs" / "troubleshooting.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", doc, re.M)}
    alerts = _alerts()
    assert len(alerts) == 7
    for name, ann in alerts.items():
        assert ann.get("runbook_url") == RUNBOOK + name.lower(), (name, ann)
        assert name.lower() in anchors, name


def test_no_alert_fires_per_job_for_what_nobody_acts_on():
    """Only periodic jobs' RPO is alerted on per job: not a job without a
    verified set or without a resume command (issue 35 item 6)."""
    alerts = _alerts()
    assert "SlurmSnapJobWithoutVerifiedSet" not in alerts and "SlurmSnapRPOTooOld" not in alerts
    per_job = [n for n in alerts if "job_id" in alerts[n].get("summary", "")]
    assert per_job == ["SlurmSnapRPOObjectiveMissed"]


# --- series named by rules and dashboard -----------------------------------

@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_rules_and_dashboard_name_only_series_that_metrics_exports(exposition, source):
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    named = {name for e in exprs for name in SERIES.findall(e)}
    assert named, "no slurm-snap series named at all"
    assert sorted(named - exported(exposition)) == []


def test_the_series_check_catches_a_name_metrics_does_not_export(exposition):
    assert SERIES.findall("rate(slurm_snap_failure_total[5m])") == ["slurm_snap_failure_total"]
    assert "slurm_snap_failure_total" not in exported(exposition)


def test_every_exported_family_is_on_the_dashboard(exposition):
    named = {name for e in dashboard_exprs() for name in SERIES.findall(e)}
    families = {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}
    shown = {f for f in families if f in named or f + "_sum" in named}
    assert shown == families


def test_the_dashboard_is_a_grafana_dashboard_on_a_chosen_prometheus():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "slurm-snap" and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]
    for p in dash["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["expr"].strip() and t["refId"] for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]


# --- systemd ----------------------------------------------------------------

def unit_values(path: Path) -> dict[str, dict[str, list[str]]]:
    """[section] -> key -> values, as systemd reads a unit (comments, blank lines skipped)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{path.name}: {line!r} outside a section"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.parametrize("timer_path, service_path, name", UNIT_PAIRS)
def test_the_timer_starts_its_service(timer_path, service_path, name):
    timer = unit_values(timer_path)
    assert timer["Timer"]["Unit"] == [service_path.name]
    assert timer["Install"]["WantedBy"] == ["timers.target"]
    assert timer["Timer"]["OnUnitActiveSec"] == [PERIOD[name]]


@pytest.mark.parametrize("timer_path, service_path, name", UNIT_PAIRS)
def test_the_service_runs_a_real_subcommand_with_valid_options(timer_path, service_path, name):
    """ExecStart is parsed by the CLI's own click definitions: a renamed
    option or command fails here, not at 3 a.m. on the controller."""
    import click

    from slurm_snap.cli import cli

    svc = unit_values(service_path)["Service"]
    assert svc["Type"] == ["oneshot"]
    argv = shlex.split(svc["ExecStart"][0])
    # The venv path the README's step 1 installs into; hooks and units exec it by absolute path.
    assert argv[0] == "/opt/slurm-snap/venv/bin/slurm-snap"
    i = argv.index(name)
    ctx = cli.make_context("slurm-snap", argv[1:i + 1])  # the global options, up to the command
    assert ctx.params["config_path"] == "/etc/slurm-snap/slurm-snap.toml"
    rest = argv[i + 1:]
    sub = cli.get_command(ctx, name)
    sub_ctx = sub.make_context(name, list(rest), parent=ctx)
    if name == "metrics":
        assert sub_ctx.params["textfile"].endswith(".prom")
    elif name == "node-agent":
        # One pass that honours its backoff, never the dev cluster's loop.
        assert (sub_ctx.params["loop"], sub_ctx.params["now"], sub_ctx.params["status"]) == (None, False, False)
        assert "9" in svc["SuccessExitStatus"][0].split()
    else:
        assert sub_ctx.params["dry_run"] is False     # the timer's pass acts
    with pytest.raises(click.UsageError):
        sub.make_context(name, rest + ["--no-such-option"], parent=ctx)


@pytest.mark.parametrize("timer_path, service_path, name", UNIT_PAIRS)
def test_systemd_analyze_verifies_the_units(tmp_path, timer_path, service_path, name):
    sa = shutil.which("systemd-analyze")
    require(sa is not None, "systemd-analyze not installed (Debian's systemd; scripts/test installs it)")
    # verify insists that ExecStart's program exists: point it at this venv's.
    here = os.path.join(os.path.dirname(sys.executable), "slurm-snap")
    require(os.access(here, os.X_OK), f"{here} is not installed (scripts/test installs the project into the venv)")
    (tmp_path / service_path.name).write_text(service_path.read_text().replace("/opt/slurm-snap/venv/bin/slurm-snap",
                                                                              here))
    shutil.copy(timer_path, tmp_path / timer_path.name)
    r = subprocess.run([sa, "verify", str(tmp_path / timer_path.name), str(tmp_path / service_path.name)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # Unknown keys are only warnings for systemd: any line about our units is a fault.
    assert [ln for ln in r.stderr.splitlines() if service_path.stem in ln] == []


# Slurm 25.11's own series (its metrics guide; scraped from a 25.11 dev
# cluster's slurmctld, docs/design.md): the dashboard shows them beside ours.
SLURM_OWN = re.compile(r"\bslurm_(?!snap_)[a-z_]+")
SLURM_2511_SERIES = {"slurm_jobs_running", "slurm_jobs_pending", "slurm_nodes_alloc", "slurm_nodes_idle"}


def test_the_dashboard_shows_slurms_own_metrics_and_ours_never_repeat_them(exposition):
    shown = {name for e in dashboard_exprs() for name in SLURM_OWN.findall(e)}
    assert shown == SLURM_2511_SERIES
    families = {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}
    assert all(f.startswith("slurm_snap_") for f in families)
    assert not {f.removeprefix("slurm_snap_") for f in families} & {s.removeprefix("slurm_") for s in SLURM_2511_SERIES}
