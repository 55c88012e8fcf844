"""Fixtures for tests that need a real Slurm dev cluster.

`cluster` (session scope) runs `scripts/dev-cluster up` (the multi-host
layout: ctl, n1..n3, login) on a fresh state dir and always runs `down`
afterwards; `cluster4` the same with a fourth node (`up --nodes 4`), for
jobs that must move to nodes they did not run on. Its inventory is SLURM_SNAP_TEST_INVENTORY (default postgres; scripts/test
reruns the tests marked crossdb with mariadb and sqlite). Nodes and login
reach it through the slurm-snap service on ctl. If the cluster cannot start, the test
fails under CI=true (a missing real component is a failure there) and is
skipped with the reason locally.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Test modules import the helpers as `cluster`, whatever pytest's import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster import session_cluster  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    """What the package builds of this run cost (none when they were cached):
    the package step's share of CI time, cold on a fresh machine."""
    packages = sys.modules.get("packages")
    for what, seconds in sorted(getattr(packages, "TIMINGS", {}).items()):
        terminalreporter.write_line(f"scripts/package {what}: {seconds:.0f} s")


def pytest_collection_modifyitems(items):
    """Every test on the dev cluster's Slurm is marked `slurm`: the subset CI
    runs on the second Slurm version (scripts/test with SLURM_SNAP_SLURM=24.11).
    The 4-node cluster's tests (node-local parts moved between nodes) are not:
    what they exercise above Slurm does not change with its version. Nor is a
    module that says so (ABOVE_SLURM = "why"): the schedule runner's timing,
    the service's wire, the inventory under load, a drill's restore map. What
    they ask of Slurm is asked by the tests that are marked (squeue --json by
    test_slurm_api_cluster, the hooks by test_hooks, drills' sbatch by
    test_drill_jobs_cluster), and the second version's tier stays within CI's
    budget (README: Slurm versions)."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()) and not getattr(item.module, "ABOVE_SLURM", ""):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def cluster():
    """From the checkout's venv, or with SLURM_SNAP_TEST_PACKAGE=bookworm from
    Debian 12's .deb installed on the machine (scripts/test's sqlite crossdb
    pass, with the tests marked package_cluster: test_package_cluster.py)."""
    release = os.environ.get("SLURM_SNAP_TEST_PACKAGE")
    if not release:
        yield from session_cluster()
        return
    import packages

    if release not in packages.RELEASES:
        pytest.fail(f"SLURM_SNAP_TEST_PACKAGE={release!r} is not one of {sorted(packages.RELEASES)}", pytrace=False)
    slurm = packages.RELEASES[release][1]
    if os.environ.get("SLURM_SNAP_SLURM", "22.05") != slurm:
        pytest.fail(f"the {release} package's plugin is built for Slurm {slurm}, and this run's dev cluster runs "
                    f"SLURM_SNAP_SLURM={os.environ.get('SLURM_SNAP_SLURM')}", pytrace=False)
    yield from session_cluster(package=packages.deb(release))


@pytest.fixture(scope="session")
def cluster4():
    yield from session_cluster("--nodes", "4")


@pytest.fixture
def root_of(tmp_path):
    """root_of(release): a fresh root of that Debian release (packages.fresh_root),
    removed after the test."""
    import packages

    made = []

    def make(release):
        made.append(packages.fresh_root(release, tmp_path))
        return made[-1]
    yield make
    for r in made:
        packages.remove_root(r)
