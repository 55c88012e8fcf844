"""The site suite: tests of what only a site provides, never collected by
CI (pyproject's testpaths leave this directory out, and .ci/run never names
it): a Slurm 25.11 the site installed (no package registry these machines
reach carries it) and pyslurm built against it. Run where both exist:

    SLURM_SNAP_SLURM=25.11 scripts/test tests/site

(README, "Slurm versions"). A component that is missing skips with its
reason locally and, like everywhere, fails under CI=true.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from cluster import session_cluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    yield from session_cluster()
