"""LocalTransport: argv only, fixed environment, stdin, timeouts that kill the whole group."""
from __future__ import annotations

import os
import shlex
import time

import pytest

from slurm_snap import errors
from slurm_snap.backends.ssh import SshTransport
from slurm_snap.backends.transport import FIXED_PATH, LocalTransport

ODD = ["a b", "'q'", '"dq"', "$HOME", "$(id)", "x;y", "*", "\\", ""]


def test_argv_is_not_interpreted_by_a_shell(tmp_path):
    res = LocalTransport().run(["/usr/bin/printf", "%s\\n", *ODD, f"$(touch {tmp_path}/pwned)"], 10)
    assert res.status == 0
    assert res.text.split("\n")[:-2] == ODD
    assert not (tmp_path / "pwned").exists()


def test_environment_is_fixed(monkeypatch):
    monkeypatch.setenv("SLURM_SNAP_LEAK", "1")
    monkeypatch.setenv("PATH", "/evil")
    env = dict(line.split("=", 1) for line in
               LocalTransport(extra_env={"EXTRA": "yes"}).run(["/usr/bin/env"], 10).text.splitlines())
    assert env["PATH"] == FIXED_PATH
    assert env["EXTRA"] == "yes"
    assert "SLURM_SNAP_LEAK" not in env


def test_stdin_is_dev_null_unless_input_given():
    t = LocalTransport()
    assert t.run(["/bin/cat"], 10).stdout == b""
    assert t.run(["/bin/cat"], 10, input=b"abc").stdout == b"abc"
    assert t.run(["/usr/bin/readlink", "/proc/self/fd/0"], 10).text.strip() == "/dev/null"


def test_nonzero_status_is_returned_with_stderr():
    res = LocalTransport().run(["/bin/sh", "-c", "echo bad >&2; exit 4"], 10)
    assert (res.status, res.stderr) == (4, b"bad\n")


def test_timeout_kills_the_tool_and_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    start = time.monotonic()
    with pytest.raises(errors.Timeout) as e:
        # The child sleeps in the background: killing only the shell would leave it holding our pipe.
        LocalTransport().run(["/bin/sh", "-c", f"sleep 30 & echo $! > '{pidfile}'; wait"], 0.3)
    assert time.monotonic() - start < 5
    assert e.value.exit_code == errors.TIMEOUT
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        with open(f"/proc/{child}/stat") as f:
            if f.read().split()[2] == "Z":
                break
        time.sleep(0.02)
    alive = os.path.exists(f"/proc/{child}") and open(f"/proc/{child}/stat").read().split()[2] != "Z"
    assert not alive


def test_missing_executable_is_tool_missing():
    with pytest.raises(errors.ToolMissing) as e:
        LocalTransport().run(["/nonexistent/zfs"], 10)
    assert "/nonexistent/zfs" in str(e.value)


def test_bad_argv_is_rejected():
    for argv in ([], ["a\0b"], "ls -l"):
        with pytest.raises(errors.BadValueError):
            LocalTransport().run(argv, 10)


def test_find_tool_uses_fixed_path_or_tool_dir(tmp_path):
    t = LocalTransport()
    assert t.find_tool("sh", None, 10) in ("/usr/bin/sh", "/bin/sh")
    assert t.find_tool("definitely-not-a-tool", None, 10) is None
    (tmp_path / "zfs").write_text("#!/bin/sh\n")
    assert t.find_tool("zfs", str(tmp_path), 10) is None  # not executable
    (tmp_path / "zfs").chmod(0o755)
    assert t.find_tool("zfs", str(tmp_path), 10) == str(tmp_path / "zfs")


def test_ssh_remote_command_quotes_every_argument():
    argv = ["btrfs", "subvolume", "snapshot", "-r", *ODD]
    words = shlex.split(SshTransport.remote_command(argv, 2.5))
    assert words[0] == f"PATH={FIXED_PATH}"
    assert words[words.index("exec") + 1:] == ["timeout", "-k", "2", "3s", *argv]


def test_ssh_transport_is_shared_per_host_and_settings():
    kw = {"known_hosts": "/etc/slurm-snap/known_hosts", "key_file": "/etc/slurm-snap/id_ed25519"}
    a = SshTransport.for_host("storage1", **kw)
    assert SshTransport.for_host("storage1", **kw) is a  # nothing connects until the first run()
    assert SshTransport.for_host("storage2", **kw) is not a
    assert SshTransport.for_host("storage1", port=2222, **kw) is not a
    assert a.where == "root@storage1"


def test_a_non_root_ssh_account_runs_each_tool_through_sudo_and_looks_for_tools_without():
    argv = ["lctl", "snapshot_create", "-F", "lfs", "-n", "s1"]
    words = shlex.split(SshTransport.remote_command(argv, 2.5, sudo=True))
    assert words[words.index("exec") + 1:] == ["timeout", "-k", "2", "3s", "sudo", "-n", "--", *argv]
    kw = {"known_hosts": "/etc/slurm-snap/known_hosts", "key_file": "/etc/slurm-snap/id_ed25519"}
    assert SshTransport("mgs01", user="snapshot", **kw).sudo and not SshTransport("mgs01", **kw).sudo
