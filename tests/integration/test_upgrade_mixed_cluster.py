"""Mixed versions during an upgrade, on the dev cluster (issue 34, docs/upgrade.md).

The older version is this project as it was before its newest schema
migration (a real earlier commit, installed into a venv of its own). On a
cluster whose controller runs this version (inventory migrated, `serve`):

- nodes still on the older version (their entry points' DEFAULTS name the
  old helper) take part in a preemption: their Epilogs record the set through
  the new service, the set is app-consistent, and their Prologs resume the
  requeued run from it. Supported.
- the reverse, a controller still on the older version (its `serve` and
  slurmctld hooks) under nodes already upgraded, against the migrated
  inventory: the old code refuses the newer schema, naming both revisions;
  the hooks fail open (the job runs, no node drains) and users are told.
  Not supported: upgrade the controller first.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from cluster import Cluster, default_inventory, new_state_dir, pid_alive, remove_state_dir, start_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_protocol_cluster import BATCH, _preempt_set, _start_training  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
NEWEST_MIGRATION = "slurm_snap/inventory/migrations/versions/0010_part_copies.py"


def _older_ref() -> str:
    """The commit before the one that added the newest migration."""
    added = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "--",
                            NEWEST_MIGRATION], capture_output=True, text=True, check=True).stdout.split()
    assert added, f"{NEWEST_MIGRATION} not in this checkout's history"
    return f"{added[-1]}^"


@pytest.fixture(scope="module")
def old_helper() -> tuple[Path, Path]:
    """(a traced old helper, its trace file): the old version in its own venv,
    behind a wrapper that notes every hook it runs."""
    ref = _older_ref()
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True,
                         check=True).stdout.strip()
    base = Path(os.environ.get("SLURM_SNAP_TEST_STATE", "/var/tmp/slurm-snap-test")) / f"old-{sha}"
    env_dir, src = base / "venv", base / "src"
    if not (env_dir / "bin" / "slurm-snap").exists():
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "slurm_snap", "pyproject.toml", "README.md"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        venv.EnvBuilder(with_pip=True).create(env_dir)
        r = subprocess.run([env_dir / "bin" / "pip", "install", "-q", "--disable-pip-version-check",
                            f"{src}[postgres,mysql]"], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
    base.chmod(0o755)
    trace = base / "ran.log"
    wrapper = base / "slurm-snap-old"
    wrapper.write_text(f'#!/bin/sh\necho "${{SLURMD_NODENAME:-ctl}} $*" >>{trace}\nexec {env_dir}/bin/slurm-snap "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, trace


@pytest.fixture(scope="module")
def mixed_cluster():
    state = new_state_dir("slurm-snap-upg-")
    try:
        yield start_cluster(state, "--inventory", default_inventory())
    finally:
        proc = Cluster(state=state, env={}).down() if (state / "etc").exists() else None
        if proc is not None and proc.returncode != 0:
            sys.stderr.write(f"dev-cluster down {state} failed:\n{proc.stderr}\n")
        remove_state_dir(state)


def _defaults(c: Cluster, hosts, helper: Path | None) -> None:
    """Each host's own entry-point overrides (STATE/local/etc/hooks.default
    there); with the old helper, the host's config as the old version knew
    it, without the keys added since (which it refuses: docs/upgrade.md)."""
    for h in hosts:
        f = c.host_dir(h) / "etc" / "hooks.default"
        conf = c.host_dir(h) / "etc" / "slurm-snap.toml"
        saved = conf.with_suffix(".toml.new-version")
        if helper is None:
            f.unlink(missing_ok=True)
            if saved.exists():
                saved.replace(conf)
            continue
        f.write_text(f"HELPER={helper}\n")
        saved.write_text(conf.read_text())
        for _ in range(20):
            # The old version itself, not its traced wrapper: the trace is the hooks'.
            r = subprocess.run([str(helper.parent / "venv" / "bin" / "slurm-snap"), "--config", str(conf), "config",
                                "check"], capture_output=True,
                               text=True, timeout=60)
            # A key added since ("service.sweep_after: unknown key") or a
            # whole table added since ("spool: unknown key").
            m = re.search(r": ([a-z_]+)(?:\.([a-z_]+))?: unknown key", r.stderr)
            if r.returncode == 0 or not m:
                break
            section, key = m.groups()
            text = conf.read_text()
            head = text.index(f"[{section}]")
            if key is None:
                after = re.compile(r"^\[", re.M).search(text, head + 1)
                conf.write_text(text[:head] + (text[after.start():] if after else ""))
                continue
            line = re.compile(rf"^{key}\s*=.*\n", re.M).search(text, head)
            conf.write_text(text[:line.start()] + text[line.end():])
        assert r.returncode == 0, f"{h}: the old version refuses its config: {r.stderr}"


def test_new_controller_with_nodes_still_on_the_older_version(mixed_cluster, old_helper):
    c = mixed_cluster
    helper, trace = old_helper
    trace.write_text("")
    _defaults(c, c.nodes, helper)
    try:
        _train, jid, log = _start_training(c, "upgrade", BATCH, "-p", "low", "--requeue", "--open-mode=append",
                                           "--snapshot-on-preempt")
        try:
            c.preempt()
            deadline = time.monotonic() + 120
            while (found := c.inventory(_preempt_set, jid)) is None:
                assert time.monotonic() < deadline, f"no preemption set; hook log:\n{c.hook_log()[-4000:]}"
                time.sleep(0.5)
            _set_id, state, consistency, reason, step, _epoch = found
            assert (state, consistency) == ("COMPLETE", "app-consistent"), reason
            # The requeued run's (old) Prologs got its resume point from the new service.
            deadline = time.monotonic() + 120
            while len(re.findall(r"^resumed from step \d+", log.read_text() if log.exists() else "", re.M)) < 3:
                assert time.monotonic() < deadline, f"requeued run did not resume:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
        finally:
            c.cancel(jid)
        ran = trace.read_text().splitlines()
        for node in c.nodes:                              # every node's hooks ran the old version
            assert any(ln.startswith(f"{node} ") and " hook epilog" in ln for ln in ran), ran
            assert any(ln.startswith(f"{node} ") and " hook prolog" in ln for ln in ran), ran
        assert not any(ln.startswith("ctl ") and " hook " in ln for ln in ran)   # the controller is new
        assert c.drained() == []
    finally:
        _defaults(c, c.nodes, None)


def test_older_controller_under_upgraded_nodes_refuses_the_newer_schema_and_fails_open(mixed_cluster, old_helper):
    c = mixed_cluster
    helper, trace = old_helper
    pidfile = c.host_dir("ctl") / "run" / "slurm-snap-serve.pid"
    new_pid = int(pidfile.read_text())
    os.kill(new_pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while pid_alive(new_pid):
        assert time.monotonic() < deadline, "the new service did not stop"
        time.sleep(0.1)
    # The controller goes back to the old version: its service and its slurmctld hooks.
    _defaults(c, ["ctl"], helper)
    listen = re.search(r'^listen = "(.*)"$', (c.host_dir("ctl") / "etc" / "slurm-snap.toml").read_text(), re.M)
    subprocess.run(c.exec_argv("ctl") + ["/usr/bin/setsid", "-f",
                                         str(helper), "--config", c.config, "serve", "--listen", listen.group(1),
                                         "--pidfile", str(Path(c.config).parent.parent / "run" /
                                                          "slurm-snap-serve.pid")],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trace.write_text("")
    try:
        jid = c.sbatch("-N3", "--ntasks-per-node=1", "-c1", "--snapshot-on-preempt", "--snapshot-volumes=scratch",
                       script="#!/bin/sh\nsleep 30\n")
        try:
            assert c.wait_state(jid, "RUNNING", timeout=60) is not None, "the job did not start"
            time.sleep(2)
            ctl_log = c.hook_log("ctl")
            assert "prolog-slurmctld" in ctl_log and "this slurm-snap needs" in ctl_log, ctl_log[-3000:]
            r = c.cli("report", "-j", str(jid), host="login", user=c.user)
            assert r.returncode == 9 and "needs" in r.stderr, r.stderr
        finally:
            c.cancel(jid)
        assert any(ln.startswith("ctl ") and " hook prolog-slurmctld" in ln for ln in trace.read_text().splitlines())
        assert c.drained() == []
    finally:
        _defaults(c, ["ctl"], None)
        old_pid = int(pidfile.read_text())
        os.kill(old_pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while pid_alive(old_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
