"""The SPANK plugin's submit-time side (spank/local.c) with a test double of
the SPANK API (spank_local_harness.c): what it hands to the helper, what it
checks alone, what it puts in the job-control environment.

The defect this guards: a drill job is submitted as the job's owner on the
host running the drill, usually the controller, whose configuration is
root's alone (it holds the database's URL). The helper the plugin ran as the
owner could not read it, and every drill job was refused at submit
("slurm-snap.toml: Permission denied", init_post_opt() failed). A drill
job's option is now checked in C alone; every other option still goes
through the helper, as before."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from realcomponents import require

ROOT = Path(__file__).resolve().parents[2]
SPANK = ROOT / "spank"
HARNESS = Path(__file__).resolve().parent / "spank_local_harness.c"


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    require(shutil.which("cc") is not None and os.path.exists("/usr/include/slurm/spank.h"),
            "cc or slurm/spank.h missing (apt-get install build-essential libslurm-dev)")
    out = tmp_path_factory.mktemp("harness") / "harness"
    r = subprocess.run(["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", f"-I{SPANK}",
                        '-DSLURM_SNAP_VERSION="test"', "-o", str(out), str(HARNESS),
                        *(str(SPANK / f) for f in ("checks.c", "helper.c", "local.c"))],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def helper(tmp_path) -> Path:
    """A helper that records its argv (one per line) and answers as told by
    the files beside it: what a real `slurm-snap hook validate-options`
    prints on success, or its one-line refusal and exit 2."""
    script = tmp_path / "slurm-snap"
    script.write_text("#!/bin/sh\n"
                      f'printf "%s\\n" "$@" > {tmp_path}/argv\n'
                      f'if [ -e {tmp_path}/refuse ]; then cat {tmp_path}/refuse >&2; exit 2; fi\n'
                      'echo SLURM_SNAP_BARRIER_DIR=/shared/barriers\n'
                      'echo SLURM_SNAP_SIGNAL=SIGUSR1\n')
    script.chmod(0o755)
    return script


@pytest.fixture
def root_only_config(tmp_path) -> Path:
    """The controller's configuration as the defect met it: no one but root reads it."""
    cfg = tmp_path / "slurm-snap.toml"
    cfg.write_text('[inventory]\nurl = "postgresql://slurmsnap:secret@db/slurmsnap"\n')
    cfg.chmod(0o600)
    return cfg


def post_opt(harness: Path, helper: Path, config: Path, *opts: str) -> tuple[int, list[str], list[str]]:
    r = subprocess.run([str(harness), f"helper={helper}", f"config={config}", *opts], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rc = [int(ln.split()[1]) for ln in lines if ln.startswith("RC ")]
    assert len(rc) == 1, r.stdout
    return (rc[0], [ln[4:] for ln in lines if ln.startswith("SET ")],
            [ln[6:] for ln in lines if ln.startswith("ERROR ")])


def test_a_drill_job_is_accepted_without_the_helper_or_the_configuration(harness, helper, root_only_config):
    rc, env, errs = post_opt(harness, helper, root_only_config, "drill=12")
    assert (rc, errs) == (0, [])
    assert env == ["SLURM_SNAP=1", "SLURM_SNAP_DRILL=12"]
    assert not (helper.parent / "argv").exists(), "the helper ran for a drill job"
    # Whatever the configuration is: nothing of it is read for a drill job.
    rc, env, _ = post_opt(harness, helper, helper.parent / "missing.toml", "drill=2147483647")
    assert rc == 0 and env == ["SLURM_SNAP=1", "SLURM_SNAP_DRILL=2147483647"]


@pytest.mark.parametrize("value", ["0", "012", "2147483648", "99999999999", "12a", "-1", "+1", " 1", "1.0"])
def test_a_drill_value_that_is_not_a_test_id_is_refused_naming_it(harness, helper, root_only_config, value):
    rc, env, errs = post_opt(harness, helper, root_only_config, f"drill={value}")
    assert rc == -1 and env == []
    assert errs == [f"slurm-snap: --snapshot-drill: '{value}' is not a restore test id"]
    assert not (helper.parent / "argv").exists()


@pytest.mark.parametrize("other", ["volumes=scratch", "consistency=app", "resume=python train.py", "every=1h",
                                   "timelimit=5m", "on_preempt", "independent"])
def test_a_drill_job_takes_no_other_snapshot_option(harness, helper, root_only_config, other):
    """Nothing the helper would have validated can ride along unchecked."""
    rc, env, errs = post_opt(harness, helper, root_only_config, "drill=12", other)
    assert rc == -1 and env == []
    assert len(errs) == 1 and "--snapshot-drill" in errs[0] and "no other --snapshot option" in errs[0]
    assert not (helper.parent / "argv").exists()


def test_ordinary_options_still_go_through_the_helper(harness, helper, root_only_config):
    rc, env, errs = post_opt(harness, helper, root_only_config, "on_preempt", "volumes=scratch,/pfs/u/run")
    assert (rc, errs) == (0, [])
    argv = (helper.parent / "argv").read_text().splitlines()
    assert argv == ["--config", str(root_only_config), "hook", "validate-options", "--volumes",
                    "scratch,/pfs/u/run", "--consistency", "app"]
    assert env == ["SLURM_SNAP=1", "SLURM_SNAP_ON_PREEMPT=1", "SLURM_SNAP_VOLUMES=scratch,/pfs/u/run",
                   "SLURM_SNAP_CONSISTENCY=app", "SLURM_SNAP_BARRIER_DIR=/shared/barriers",
                   "SLURM_SNAP_SIGNAL=SIGUSR1"]


def test_the_helpers_refusal_still_refuses_the_submission(harness, helper, root_only_config):
    """What the owner met on the controller, for ordinary options: still a
    refusal that names why (a user's job is never accepted unchecked)."""
    (helper.parent / "refuse").write_text(f"slurm-snap: {root_only_config}: (file): Permission denied\n")
    rc, env, errs = post_opt(harness, helper, root_only_config, "on_preempt", "volumes=scratch")
    assert rc == -1 and env == []
    assert errs == [f"slurm-snap: {root_only_config}: (file): Permission denied"]

