"""The hook failure policy: never drain a node by default; `closed` fails the job."""
import json
import time

import pytest

from slurm_snap import config, errors
from slurm_snap.cli import main
from slurm_snap.hooks.policy import run_hook


def _cfg(tmp_path, policy="open", budget=25.0):
    p = tmp_path / f"c-{policy}.toml"
    p.write_text(f"[hooks]\nfailure_policy='{policy}'\n[timeouts]\nhook_budget={budget}\n"
                 f"[paths]\nlog_dir='{tmp_path}/log'\n[inventory]\nurl='sqlite:///{tmp_path}/inv.db'\n")
    return config.load(str(p))


def _log(tmp_path):
    return [json.loads(line) for line in (tmp_path / "log" / "hooks.log").read_text().splitlines()]


@pytest.mark.parametrize("policy,status", [("open", 0), ("closed", 1)])
def test_error_follows_policy(tmp_path, capsys, policy, status):
    recorded = []

    def body():
        raise errors.BackendError(backend="btrfs", why="tool failed")

    rc = run_hook("prolog", body, cfg=_cfg(tmp_path, policy), job_id=7, record_failure=lambda h, d: recorded.append(d))
    assert rc == status
    assert "btrfs: tool failed" in capsys.readouterr().err
    assert recorded == ["btrfs: tool failed"]
    assert _log(tmp_path)[-1]["status"] == "failed"


def test_bug_is_logged_with_traceback_and_does_not_drain(tmp_path):
    rc = run_hook("epilog", lambda: 1 / 0, cfg=_cfg(tmp_path), job_id=8)
    assert rc == 0
    kinds = [r["status"] for r in _log(tmp_path)]
    assert "traceback" in kinds and kinds[-1] == "failed"


def test_budget_enforced(tmp_path):
    t0 = time.monotonic()
    rc = run_hook("prolog", lambda: time.sleep(10), cfg=_cfg(tmp_path, "closed", budget=0.3), job_id=9)
    assert rc == 1 and time.monotonic() - t0 < 3
    assert "did not finish within 0.3 s" in _log(tmp_path)[-1]["message"]


def test_recording_failure_never_raises(tmp_path):
    def record(h, d):
        raise errors.InventoryError(url="x", why="down")

    assert run_hook("prolog", lambda: (_ for _ in ()).throw(errors.NotFound(what="a", value="b")),
                    cfg=_cfg(tmp_path), job_id=1, record_failure=record) == 0


def _hook_env(monkeypatch, tmp_path, **extra):
    env = {"SLURM_JOB_ID": "55", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
           "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n1", "SPANK_SLURM_SNAP": "1",
           "SPANK_SLURM_SNAP_VOLUMES": "nosuchclass"}
    env.update(extra)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_hook_cli_inventory_unreachable_open_exits_0(tmp_path, monkeypatch, capsys):
    p = tmp_path / "c.toml"
    p.write_text("[inventory]\nurl='postgresql+psycopg2://x@127.0.0.1:1/none'\n"
                 f"[paths]\nlog_dir='{tmp_path}/log'\nbarrier_dir='{tmp_path}/b'\n")
    _hook_env(monkeypatch, tmp_path, SPANK_SLURM_SNAP_VOLUMES="")
    assert main(["--config", str(p), "hook", "prolog-slurmctld"]) == 0
    assert "inventory" in capsys.readouterr().err


def test_hook_cli_closed_fails_job(tmp_path, monkeypatch, capsys):
    p = tmp_path / "c.toml"
    p.write_text(f"[inventory]\nurl='sqlite:///{tmp_path}/i.db'\n[hooks]\nfailure_policy='closed'\n"
                 f"[paths]\nlog_dir='{tmp_path}/log'\n")
    _hook_env(monkeypatch, tmp_path)
    assert main(["--config", str(p), "hook", "prolog-slurmctld"]) == 1
    assert "'nosuchclass'" in capsys.readouterr().err


def test_hook_cli_not_opted_in_does_nothing(tmp_path, monkeypatch):
    p = tmp_path / "c.toml"
    p.write_text(f"[inventory]\nurl='sqlite:///{tmp_path}/i.db'\n[paths]\nlog_dir='{tmp_path}/log'\n")
    _hook_env(monkeypatch, tmp_path)
    monkeypatch.delenv("SPANK_SLURM_SNAP")
    assert main(["--config", str(p), "hook", "prolog"]) == 0
    assert not (tmp_path / "i.db").exists()


def test_hook_cli_missing_config_never_drains(tmp_path, monkeypatch, capsys):
    _hook_env(monkeypatch, tmp_path)
    assert main(["--config", str(tmp_path / "none.toml"), "hook", "epilog"]) == 0
    assert "no such file" in capsys.readouterr().err
