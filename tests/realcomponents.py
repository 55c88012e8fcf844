"""Real components in tests: missing in CI is a failure, locally a skip that says why.

A module, not conftest.py, so test modules can import it by a name that no
other conftest on sys.path shadows.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def venv_python() -> str:
    """The venv's interpreter (scripts/test exports it from SLURM_SNAP_VENV):
    what programs run as another user in a test must exec, since pytest's own
    interpreter is not guaranteed to be readable by them."""
    return os.environ.get("SLURM_SNAP_TEST_PYTHON") or sys.executable


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(ok: bool, reason: str) -> None:
    if ok:
        return
    if in_ci():
        pytest.fail(f"real component missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def pg_url() -> str | None:
    url = os.environ.get("SLURM_SNAP_TEST_PG_URL")
    if url:
        return url
    f = Path("/var/tmp/slurm-snap-pg/url")
    return f.read_text().strip() if f.exists() else None


def mariadb_url() -> str | None:
    url = os.environ.get("SLURM_SNAP_TEST_MARIADB_URL")
    if url:
        return url
    f = Path("/var/tmp/slurm-snap-mariadb/url")
    return f.read_text().strip() if f.exists() else None


def require_module(name: str, extra: str) -> None:
    """A Python package the client's tests run for real (torch, Lightning,
    transformers): missing is a failure in CI, a skip with its reason here."""
    import importlib.util
    import sys

    require(importlib.util.find_spec(name) is not None,
            f"{name} is not installed in {sys.executable} (pip install .[{extra}])")


def require_torch() -> None:
    """torch (the `example` extra) is a real component of the client's tests."""
    require_module("torch", "example")
