"""Target guard (pure path logic) and the program runner (real processes)."""
from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from slurm_snap import config as config_mod
from slurm_snap import errors
from slurm_snap.restore.outcome import verdict
from slurm_snap.restore.plan import parse_command, parse_selector
from slurm_snap.restore.guard import check_target, relation
from slurm_snap.restore.runner import RunResult, run_program


@pytest.mark.parametrize("target, live, expected", [
    ("/a/b", "/a/b", "is"), ("/a/b/", "/a/b", "is"), ("/a/b/c", "/a/b", "is inside"), ("/a", "/a/b", "contains"),
    ("/", "/a/b", "contains"), ("/a/bc", "/a/b", None), ("/a/c", "/a/b", None), ("/x", "/a/b", None),
])
def test_relation(target, live, expected):
    assert relation(target, live) == expected


def test_relation_with_node_template():
    tpl = "/srv/{node}/scratch/jobs"
    assert relation("/srv/n1/scratch/jobs/7", tpl, template=True) == "is inside"
    assert relation("/srv", tpl, template=True) == "contains"
    assert relation("/srv/n1/other", tpl, template=True) is None


def test_check_target_refuses_job_trees_but_not_snapshot_dirs():
    cfg = config_mod.from_dict({"volume_class": [
        {"name": "scratch", "prefix": "/srv/{node}/scratch", "scope": "node-local", "backend": "btrfs"}]})
    with pytest.raises(errors.BadValueError, match="jobs"):
        check_target("/srv/n2/scratch/jobs/12/x", [], cfg)
    with pytest.raises(errors.BadValueError, match="jobs"):
        check_target("/srv/n2/scratch/jobs", [], cfg)
    assert check_target("/srv/n2/scratch/jobs/.snapshots/.slurm-snap-restore-1-2", [], cfg)
    assert check_target("/srv/n2/scratch/.restore", [], cfg)
    with pytest.raises(errors.BadValueError, match="absolute"):
        check_target("relative/dir", [], cfg)
    with pytest.raises(errors.BadValueError, match="snapshot /snap/s1"):
        check_target("/snap/s1/inner", [], cfg, protected=["/snap/s1"])


def test_parse_command_and_selector():
    assert parse_command("python 'my script.py' --x \"a b\" ; rm -rf /") == [
        "python", "my script.py", "--x", "a b", ";", "rm", "-rf", "/"]
    for bad in ("", "   ", "python 'unclosed"):
        with pytest.raises(errors.BadValueError):
            parse_command(bad)
    assert parse_selector("42") == ("job", 42) and parse_selector("set:7") == ("set", 7)
    for bad in ("set:", "x", "42.1", "-1"):
        with pytest.raises(errors.BadValueError):
            parse_selector(bad)


def test_verdict_messages():
    assert verdict(RunResult(started=True, first_step=10, time_to_first_step=1.0), 9, 5) == (True, "")
    assert verdict(RunResult(started=True, first_step=9, time_to_first_step=1.0), 9, 5) == (True, "")
    ok, why = verdict(RunResult(started=True, first_step=1), 9, 5)
    assert not ok and "before the set's checkpoint step 9" in why
    ok, why = verdict(RunResult(started=True, exit_status=-9, stderr_tail="a\nb\n"), None, 5)
    assert not ok and why == "killed by SIGKILL before the first step; stderr: a | b"
    ok, why = verdict(RunResult(started=True, timed_out=True), None, 2.5)
    assert why == "deadline: no first step within 2.5 s"
    ok, why = verdict(RunResult(started=False, error="cannot start 'x': No such file"), None, 5)
    assert not ok and why.startswith("cannot start")


def _py(tmp_path, body: str) -> list[str]:
    p = tmp_path / "prog.py"
    p.write_text(textwrap.dedent(body))
    return [sys.executable, str(p)]


def test_runner_stdout_marker_and_stop(tmp_path):
    argv = _py(tmp_path, """
        import time
        print("warming up", flush=True)
        time.sleep(0.2)
        print("SLURM_SNAP_FIRST_STEP 7", flush=True)
        time.sleep(3600)
    """)
    start = time.monotonic()
    r = run_program(argv, env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path), deadline=30)
    assert (r.first_step, r.marker_source) == (7, "stdout")
    assert 0.15 < r.time_to_first_step < 10 and time.monotonic() - start < 15
    assert r.stdout_tail[0] == "warming up"
    assert r.exit_status is not None and r.exit_status < 0     # we stopped it


def test_runner_marker_file(tmp_path):
    marker = tmp_path / "marker"
    argv = _py(tmp_path, f"""
        import time
        open({str(marker)!r}, "w").write("SLURM_SNAP_FIRST_STEP 12\\n")
        time.sleep(3600)
    """)
    r = run_program(argv, env={}, cwd=str(tmp_path), deadline=30, marker_file=str(marker))
    assert (r.first_step, r.marker_source) == (12, "marker file")


def test_runner_marker_file_symlink_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("SLURM_SNAP_FIRST_STEP 5\n")
    marker = tmp_path / "marker"
    marker.symlink_to(target)
    argv = _py(tmp_path, "import sys; sys.exit(0)")
    r = run_program(argv, env={}, cwd=str(tmp_path), deadline=10, marker_file=str(marker))
    assert r.first_step is None and r.exit_status == 0


def test_runner_deadline_kills_the_whole_process_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    argv = _py(tmp_path, f"""
        import subprocess, time
        child = subprocess.Popen(["sleep", "3600"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        time.sleep(3600)
    """)
    r = run_program(argv, env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path), deadline=1.0)
    assert r.timed_out and r.first_step is None
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {child} survived the deadline")


def test_runner_exit_status_and_stderr_tail(tmp_path):
    argv = _py(tmp_path, """
        import sys
        print("x" * 5000, file=sys.stderr)
        print("the real error", file=sys.stderr)
        sys.exit(4)
    """)
    r = run_program(argv, env={}, cwd=str(tmp_path), deadline=30)
    assert r.exit_status == 4 and r.stderr_tail.endswith("the real error\n") and len(r.stderr_tail) <= 2000


def test_runner_cannot_start(tmp_path):
    r = run_program(["/nonexistent/prog"], env={}, cwd=str(tmp_path), deadline=5)
    assert not r.started and "cannot start" in r.error
