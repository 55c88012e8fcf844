"""Issue 15 on the multi-host cluster: users work on the login host, which
holds no database and no credentials; nodes record through the controller's
slurm-snap service. An ordinary user runs report, show, snapshot and
restore-test on their own job through it and is refused on another user's."""
from __future__ import annotations

import json
import re
import time

import pytest

from test_protocol_cluster import BATCH, _start_training

pytestmark = [pytest.mark.integration, pytest.mark.crossdb]


# Not in the second Slurm version's CI tier (tests/integration/conftest.py):
ABOVE_SLURM = "the service's wire and its per-user refusals, the same whatever Slurm runs"


def _user_cli(cluster, *args: str, user: str | None = None, timeout: float = 120):
    return cluster.cli(*args, host="login", user=user or cluster.user, timeout=timeout)


def test_login_and_nodes_hold_no_database_url_or_credentials(cluster):
    ctl = cluster.config_path("ctl").read_text()
    assert re.search(r'^listen = "', ctl, re.M), "ctl runs the service"
    for host in [h for h in cluster.hosts if h != "ctl"]:
        text = cluster.config_path(host).read_text()
        url = re.search(r'^url = "(.*)"$', text, re.M).group(1)
        assert url.startswith("slurm-snap://"), (host, url)
        assert not re.search(r"(sqlite|postgresql|mysql)", text), host


def test_user_on_login_works_on_their_job_and_is_refused_on_anothers(cluster):
    train, jid, log = _start_training(cluster, "service", BATCH)
    try:
        snap = _user_cli(cluster, "snapshot", str(jid), "--json", "--deadline", "30", timeout=120)
        assert snap.returncode == 0, snap.stderr
        res = json.loads(snap.stdout)
        assert res["state"] == "COMPLETE", res
        set_id = res["set_id"]

        rep = _user_cli(cluster, "report", "-j", str(jid), "--json")
        assert rep.returncode == 0, rep.stderr
        sets = json.loads(rep.stdout)["sets"]
        assert [s["set_id"] for s in sets] == [set_id] and sets[0]["user"] == cluster.user

        shown = _user_cli(cluster, "show", f"set:{set_id}")
        assert shown.returncode == 0, shown.stderr
        for node in cluster.nodes:
            assert node in shown.stdout

        # The other user: every form is refused (exit 4), never a traceback.
        for args in (["show", f"set:{set_id}"], ["show", str(jid)], ["snapshot", str(jid)],
                     ["restore-test", f"set:{set_id}"]):
            other = _user_cli(cluster, *args, user=cluster.other_user)
            assert other.returncode == 4, (args, other.stdout, other.stderr)
            assert "Traceback" not in other.stderr and cluster.other_user in other.stderr
        other = _user_cli(cluster, "report", "-j", str(jid), "--json", user=cluster.other_user)
        listed = json.loads(other.stdout)["sets"] if other.returncode == 0 else []
        assert set_id not in [s["set_id"] for s in listed], other.stdout

        cluster.cancel(jid)
        cluster.wait_state(jid, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=90)
        step = res["checkpoint_step"]
        drill = _user_cli(cluster, "restore-test", f"set:{set_id}", "--json", "--deadline", "120", "--command",
                          f"{cluster.python} {train} --steps {step + 3}", timeout=300)
        assert drill.returncode == 0, (drill.stdout, drill.stderr)
        assert json.loads(drill.stdout)["result"] == "PASSED"
    finally:
        cluster.cancel(jid)


def _login_shell(cluster, host: str, command: str):
    """`command` in the test user's login shell on `host` (runuser -l: the
    login environment, PATH from login.defs), as a user who logs in there."""
    return cluster.run(["/usr/sbin/runuser", "-l", cluster.user, "-c", command], host=host, timeout=120)


def test_a_user_who_logs_in_runs_the_user_guide_as_written(cluster):
    """README's admin steps 1 and 2 hold on every host of the dev cluster:
    `slurm-snap` on a login shell's PATH and the config at its default path,
    so the user guide's plain `slurm-snap report` works on login."""
    for host in cluster.hosts:
        where = _login_shell(cluster, host, "command -v slurm-snap")
        assert (where.returncode, where.stdout.strip()) == (0, "/usr/local/bin/slurm-snap"), (host, where.stderr)
    login = _login_shell(cluster, "login", "slurm-snap report -n -S 2000-01-01 -o JobID,User")
    assert login.returncode == 0 and "Traceback" not in login.stderr, (login.stdout, login.stderr)
    assert all(line.split()[1] == cluster.user for line in login.stdout.splitlines() if line.strip()), login.stdout
    # The user's SLURM_SNAP_REPORT_FORMAT reaches the service with the command (issue 35 item 3).
    fmt = _login_shell(cluster, "login", "SLURM_SNAP_REPORT_FORMAT=User,JobID slurm-snap report -S 2000-01-01")
    assert fmt.returncode == 0, (fmt.stdout, fmt.stderr)
    assert fmt.stdout.splitlines()[0].split() == ["User", "JobID"], fmt.stdout


def test_without_the_service_a_user_gets_one_sentence(cluster):
    # Point the login host at a port nobody serves: what a site without the service sees.
    path = cluster.config_path("login")
    saved = path.read_text()
    try:
        path.write_text(re.sub(r'^url = "slurm-snap://([^:"]+):\d+"$', r'url = "slurm-snap://\1:1"', saved,
                               count=1, flags=re.M))
        r = _user_cli(cluster, "report")
        assert r.returncode == 9, (r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "slurm-snap serve" in lines[0] and "Traceback" not in r.stderr, r.stderr
    finally:
        path.write_text(saved)
