"""SshTransport against a real sshd on 127.0.0.1 (started and killed by tests/integration/fs.py)."""
from __future__ import annotations

import os
import time

import pytest

import fs as realfs
from slurm_snap import errors
from slurm_snap.backends.ssh import SshTransport
from slurm_snap.backends.transport import FIXED_PATH

sshd = realfs.sshd  # session fixture
pytestmark = pytest.mark.integration
ODD = ["a b", "'single'", '"double"', "$HOME", "$(touch /tmp/slurm-snap-pwned)", "x;y", "&", "|", "*", "\\", ""]


@pytest.fixture
def t(sshd):
    transport = SshTransport(sshd.host, port=sshd.port, user=sshd.user,
                             known_hosts=sshd.known_hosts, key_file=sshd.key_file, connect_timeout=5)
    yield transport
    transport.close()


def test_argv_reaches_the_tool_unchanged(t):
    res = t.run(["printf", "%s\\n", *ODD], 10)
    assert res.status == 0
    assert res.stdout.decode().split("\n")[:-1] == ODD
    assert not os.path.exists("/tmp/slurm-snap-pwned")


def test_fixed_path_and_status_and_stderr(t):
    assert t.run(["sh", "-c", 'echo "$PATH"'], 10).text.strip() == FIXED_PATH
    res = t.run(["sh", "-c", "echo oops >&2; exit 7"], 10)
    assert (res.status, res.stderr) == (7, b"oops\n")


def test_input_and_eof_on_stdin(t):
    assert t.run(["cat"], 10, input=b"payload\x00\xff").stdout == b"payload\x00\xff"
    start = time.monotonic()
    assert t.run(["cat"], 10).stdout == b""  # EOF at once, like /dev/null
    assert time.monotonic() - start < 5


def _remote_sleepers(marker: str) -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", marker.encode()]:
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def test_timeout_raises_and_kills_the_remote_command(t):
    marker = "29.4217"  # a sleep nobody else runs, so we can find ours in /proc
    start = time.monotonic()
    with pytest.raises(errors.Timeout) as e:
        t.run(["sleep", marker], 0.5)
    assert time.monotonic() - start < 3
    assert e.value.exit_code == errors.TIMEOUT
    deadline = time.monotonic() + 5
    while _remote_sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _remote_sleepers(marker) == []
    assert t.run(["true"], 10).status == 0  # the connection is still usable


def test_connection_is_reused(t):
    t.run(["true"], 10)
    first = t._client.get_transport()
    t.run(["true"], 10)
    assert t._client.get_transport() is first


def test_find_tools(t, tmp_path):
    found = t.find_tools(["sh", "no-such-tool-xyz"], None, 10)
    assert found["sh"] in ("/usr/bin/sh", "/bin/sh")
    assert found["no-such-tool-xyz"] is None
    tool = tmp_path / "my tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert t.find_tool("my tool", str(tmp_path), 10) == str(tool)
    assert t.find_tool("sh", str(tmp_path), 10) is None  # tool_dir replaces the search path


def test_unknown_host_key_is_refused(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    for known in (str(empty), sshd.wrong_known_hosts):
        t = SshTransport(sshd.host, port=sshd.port, known_hosts=known, key_file=sshd.key_file, connect_timeout=5)
        with pytest.raises(errors.TransportError) as e:
            t.run(["true"], 10)
        assert sshd.host in str(e.value)
    assert "mismatch" in str(e.value)  # the wrong key is reported as such, not as "unknown"


def test_missing_known_hosts_file_is_refused(sshd, tmp_path):
    t = SshTransport(sshd.host, port=sshd.port, known_hosts=str(tmp_path / "absent"), key_file=sshd.key_file)
    with pytest.raises(errors.TransportError) as e:
        t.run(["true"], 10)
    assert "known_hosts" in str(e.value)


def test_unauthorized_key_is_refused_without_fallback(sshd, tmp_path):
    other = tmp_path / "other_key"  # a valid key that is not in authorized_keys
    realfs._run([realfs.which("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", str(other)])
    t = SshTransport(sshd.host, port=sshd.port, known_hosts=sshd.known_hosts, key_file=str(other))
    with pytest.raises(errors.TransportError):
        t.run(["true"], 10)


def test_relative_paths_are_rejected():
    with pytest.raises(errors.BadValueError):
        SshTransport("h", known_hosts="known_hosts", key_file="/k")
