"""What every command owes a user at the CLI boundary (issue 35 items 1, 2):
an ordinary user never gets a traceback, only one sentence and a documented
exit code; listing columns, --help and --version need no configuration.

The unprivileged caller is a real uid (a forked child that setuid()s to
nobody), since root is never refused by the filesystem.
(Covered elsewhere: another user's job refused -- test_access_cli.py; the
service's own boundary -- test_service.py.)
"""
from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

import dbtemplates
from realcomponents import require
from slurm_snap import errors
from slurm_snap.cli import main


def _nobody() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return 65534, 65534


def _main_as(uid: int, gid: int, argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    import contextlib
    import io

    os.environ.update(env)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def run_as(uid: int, gid: int, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """main(argv) in a forked child with real ids uid/gid: (exit, stdout, stderr)."""
    from testkit.cluster import run_in_namespaces

    return run_in_namespaces([], _main_as, (uid, gid, argv, env or {}), timeout=120)


@pytest.fixture
def root_only_site():
    """The documented single-host default: a world-readable config naming a
    SQLite inventory in a directory only root may enter (0700)."""
    require(os.geteuid() == 0, "a real unprivileged caller needs root to setuid")
    d = Path(tempfile.mkdtemp(prefix="slurm-snap-boundary-", dir="/var/tmp"))
    d.chmod(0o755)
    var = d / "var"
    var.mkdir(mode=0o700)
    cfg = d / "slurm-snap.toml"
    cfg.write_text(f'[inventory]\nurl = "sqlite:///{var}/inventory.db"\n'
                   f'[paths]\nbarrier_dir = "{d}/barriers"\nlog_dir = "{d}/log"\nrestore_root = "{d}/restore"\n')
    cfg.chmod(0o644)
    dbtemplates.sqlite(var / "inventory.db")     # migrated, as `db upgrade` leaves it
    try:
        yield d, cfg
    finally:
        shutil.rmtree(d, ignore_errors=True)


# Each command that opens the inventory, as an ordinary user would type it.
USER_ARGV = {
    "report": ["report"],
    "report-json": ["report", "--json", "-a"],
    "show": ["show", "1"],
    "snapshot": ["snapshot", "1"],
    "restore-test": ["restore-test", "1", "--command", "/bin/true"],
    "prune": ["prune", "--keep-last", "1"],
    "db-status": ["db", "status"],
    "db-upgrade": ["db", "upgrade"],
}


@pytest.mark.parametrize("name", sorted(USER_ARGV))
def test_an_ordinary_user_with_a_root_only_sqlite_gets_one_sentence(root_only_site, name):
    d, cfg = root_only_site
    uid, gid = _nobody()
    code, out, err = run_as(uid, gid, ["--config", str(cfg), *USER_ARGV[name]],
                            env={"SLURM_SNAP_SQUEUE": "/bin/false"})
    assert "Traceback" not in err, err
    assert code == errors.INVENTORY, (code, err)
    lines = [ln for ln in err.splitlines() if ln.startswith("slurm-snap: ") and "cannot tell which jobs" not in ln]
    assert len(lines) == 1, err
    # Names the cause and what the site gives users instead.
    assert "cannot read" in lines[0] and "permission denied" in lines[0].lower(), lines[0]
    assert "slurm-snap serve" in lines[0] and "service" in lines[0], lines[0]
    assert out == ""


@pytest.mark.parametrize("argv", [["repair"], ["metrics"], ["schedule", "--dry-run"], ["doctor", "--no-slurm"]])
def test_operator_commands_refuse_an_ordinary_user_without_a_traceback(root_only_site, argv):
    d, cfg = root_only_site
    uid, gid = _nobody()
    code, _out, err = run_as(uid, gid, ["--config", str(cfg), *argv], env={"SLURM_SNAP_SQUEUE": "/bin/false"})
    assert "Traceback" not in err, err
    assert code in errors.EXIT_CODES and code != errors.INTERNAL, (code, err)


def test_an_unexpected_error_is_one_line_and_exit_1(monkeypatch, capsys, write_config, tmp_path):
    """A bug still ends in one sentence (exit 1), not a traceback; -vv shows where."""
    from slurm_snap.cli import report_cmd

    def broken(*_a, **_k):
        raise KeyError("a bug")

    monkeypatch.setattr(report_cmd, "_fields", broken)
    monkeypatch.setenv("SLURM_SNAP_CONFIG", write_config(f'[inventory]\nurl = "sqlite:///{tmp_path}/i.db"\n'))
    assert main(["report"]) == errors.INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("slurm-snap: internal error") and "KeyError" in err and "-vv" in err
    assert main(["-vv", "report"]) == errors.INTERNAL
    assert "Traceback" in capsys.readouterr().err


# --- no configuration needed -------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["report", "--help"], ["report", "--helpformat"],
                                  ["report", "-e"], ["report", "--rpo-by-user", "--helpformat"],
                                  ["show", "--help"], ["snapshot", "-h"], ["restore-test", "--help"],
                                  ["prune", "--help"], ["metrics", "--help"], ["db", "--help"]])
def test_help_version_and_column_lists_need_no_configuration(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.setenv("SLURM_SNAP_CONFIG", str(tmp_path / "absent.toml"))
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.strip()
    if "-e" in argv or "--helpformat" in argv:
        assert "JobID" in out or "User" in out


# --- commands that run on the controller (issue 35 item 8) -------------------------------------------

CONTROLLER_ARGV = {
    "prune-own-job": ["prune", "--job", "5", "--keep-last", "1"],
    "prune": ["prune", "--keep-last", "1", "--apply"],
    "repair": ["repair"],
    "metrics": ["metrics"],
    "schedule": ["schedule", "--dry-run"],
    "db-upgrade": ["db", "upgrade"],
    "db-status": ["db", "status"],
    "serve": ["serve", "--listen", "127.0.0.1:1"],
}


@pytest.fixture
def login_host_config(tmp_path):
    """A login host's config: the service is the inventory (nobody serves
    this port: the refusal must come before any connection)."""
    cfg = tmp_path / "login.toml"
    cfg.write_text('[inventory]\nurl = "slurm-snap://127.0.0.1:1"\n')
    return cfg


@pytest.mark.parametrize("who", ["root", "owner"])
@pytest.mark.parametrize("name", sorted(CONTROLLER_ARGV))
def test_a_controller_command_on_a_login_host_is_one_refusal_with_one_code(login_host_config, monkeypatch, capsys,
                                                                           name, who):
    if who == "owner":
        # Through the sudo rule as an ordinary user (the job's owner for prune --job).
        monkeypatch.setenv("SUDO_UID", str(_nobody()[0]))
    monkeypatch.setenv("SLURM_SNAP_SQUEUE", "/bin/false")
    code = main(["--config", str(login_host_config), *CONTROLLER_ARGV[name]])
    err = capsys.readouterr().err
    assert code == errors.CONTROLLER, (code, err)
    top = CONTROLLER_ARGV[name][0]
    assert err.strip() == (f"slurm-snap: {top} runs on the controller: this host reaches the inventory only "
                           "through the slurm-snap service (slurm-snap://127.0.0.1:1), which runs report, show, "
                           "snapshot and restore-test for users and the hooks' recording; run `slurm-snap "
                           f"{top}` on the controller"), err


def test_the_readme_lists_every_exit_code_with_its_meaning():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(line.split("|")[1]): line.split("|")[2].strip() for line in table.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()}
    assert sorted(rows) == sorted(errors.EXIT_CODES)
    assert "runs on the controller" in rows[errors.CONTROLLER]
