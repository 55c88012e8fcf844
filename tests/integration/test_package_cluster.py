"""The dev cluster run from the Debian package, the way an admin would
(issue 34): `scripts/dev-cluster up --package slurm-snap_*.deb` installs the
.deb on the machine with apt-get, and Slurm runs the package's SPANK plugin,
entry points and helper, configured through /etc/slurm-snap/plugstack.conf
and /etc/default/slurm-snap. A training job is snapshotted app-consistently
through it; then `apt-get purge` leaves the machine without the package.

This is the session's `cluster` with SLURM_SNAP_TEST_PACKAGE=bookworm
(conftest.py): scripts/test's sqlite crossdb pass, in CI, runs these tests
and the crossdb tests (preemption across 3 nodes, the resume, users through
the service) on that one cluster. Debian 12's package on this Debian 12
machine, with its Slurm 22.05 (no Debian package targets the 24.11 built
under /opt):

    SLURM_SNAP_TEST_PACKAGE=bookworm SLURM_SNAP_TEST_INVENTORY=sqlite \
        scripts/test -m "crossdb or package_cluster" tests/integration"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import packages
from realcomponents import require

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_protocol_cluster import BATCH, _cli, _snapshot, _start_training  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.package_cluster]
PREFIX = "/usr/lib/slurm-snap"


@pytest.fixture(scope="module")
def package_cluster(cluster):
    require(os.environ.get("SLURM_SNAP_TEST_PACKAGE") == "bookworm",
            "the session's cluster runs from the checkout: set SLURM_SNAP_TEST_PACKAGE=bookworm (module doc)")
    return cluster


def test_slurm_runs_the_packages_files(package_cluster):
    c = package_cluster
    assert c.helper == f"{PREFIX}/venv/bin/slurm-snap"
    conf = Path(c.slurm_conf).read_text()
    for hook, name in (("Prolog", "slurm-snap-prolog"), ("Epilog", "slurm-snap-epilog"),
                       ("PrologSlurmctld", "slurm-snap-prolog-slurmctld"),
                       ("EpilogSlurmctld", "slurm-snap-epilog-slurmctld")):
        assert f"\n{hook}=/usr/libexec/slurm-snap/{name}\n" in conf
    plugstack = (Path(c.slurm_conf).parent / "plugstack.conf").read_text()
    assert f"required {PREFIX}/slurm_snap.so helper={PREFIX}/venv/bin/slurm-snap config={c.config}" in plugstack
    assert Path("/etc/default/slurm-snap").read_text().startswith(f"CONFIG={c.config}\n")
    status = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", "slurm-snap"],
                            capture_output=True, text=True).stdout
    assert status == f"install ok installed {packages.version()}+deb12"


def test_a_training_job_is_snapshotted_app_consistently_through_the_package(package_cluster):
    c = package_cluster
    _, jid, _log = _start_training(c, "pkg", BATCH, "--snapshot-on-preempt")
    try:
        code, data, err = _snapshot(c, jid)
        assert code == 0, err
        assert data["state"] == "COMPLETE" and data["consistency"] == "app-consistent", data
        # The hooks that recorded the job ran the package's helper.
        ctl_log = c.hook_log("ctl")
        assert f'"job_id": {jid}' in ctl_log and "prolog-slurmctld" in ctl_log
        shown = _cli(c, "show", str(jid))
        assert shown.returncode == 0 and "COMPLETE" in shown.stdout, shown.stderr
    finally:
        c.cancel(jid)
