"""SshTransport: run a backend's tools on another host over SSH (paramiko).

Security stance, because this runs as root against storage servers:
- the host key MUST be in the configured known_hosts file (RejectPolicy): an
  unknown or changed key is refused, never learned;
- key authentication only, with the configured key: no passwords, no agent,
  no ~/.ssh key discovery (look_for_keys=False, allow_agent=False);
- the remote command is the argv with every element shlex.quote'd, run under
  a fixed PATH and coreutils `timeout`, so nothing from user input is ever
  interpreted by the remote shell and a hung tool dies on the remote too;
- an account other than root runs each tool through `sudo -n`: the site's
  sudo rule on the storage host allows exactly the snapshot tools, so the
  key grants those verbs and nothing else (etc/README.md). SSH is for what
  a site names (a Lustre MGS, a GPFS manager, the coordinator's cuts of
  node-local volumes): drills, deletes and copies of node-local parts are
  done on the node (restore/onnode.py, nodetasks/).
One connection per transport (one transport per host), reused across calls.
"""
from __future__ import annotations

import shlex
import socket
import threading
import time
from typing import Sequence

import paramiko

from slurm_snap import errors
from slurm_snap.backends.transport import FIXED_PATH, Result, Stream, Transport, _check_argv

# Exit status of coreutils timeout(1) when it had to kill the command.
_TIMEOUT_STATUS = 124


class SshTransport(Transport):
    def __init__(self, host: str, *, known_hosts: str, key_file: str, user: str = "root",
                 port: int = 22, connect_timeout: float = 10.0):
        for what, value in (("known_hosts", known_hosts), ("key_file", key_file)):
            if not value or not value.startswith("/"):
                raise errors.BadValueError(what=f"ssh {what}", value=value, why="must be an absolute path")
        self.host, self.port, self.user = host, int(port), user
        self.known_hosts, self.key_file = known_hosts, key_file
        self.connect_timeout = float(connect_timeout)
        self.where = f"{user}@{host}:{port}" if port != 22 else f"{user}@{host}"
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    _shared: dict[tuple, "SshTransport"] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def for_host(cls, host: str, **kwargs) -> "SshTransport":
        """The one transport (and so the one connection) per host and settings in this process."""
        key = (host, *sorted(kwargs.items()))
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(host, **kwargs)
            return cls._shared[key]

    # -- connection ---------------------------------------------------------
    def _connect(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None:
                t = self._client.get_transport()
                if t is not None and t.is_active():
                    return self._client
                self._client.close()
                self._client = None
            client = paramiko.SSHClient()
            try:
                client.load_host_keys(self.known_hosts)
            except OSError as e:
                raise errors.TransportError(host=self.where, why=f"cannot read known_hosts {self.known_hosts!r}: {e}") from None
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            try:
                client.connect(
                    self.host, port=self.port, username=self.user, key_filename=self.key_file,
                    timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                    auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
                    look_for_keys=False, allow_agent=False)
            except paramiko.BadHostKeyException as e:
                client.close()
                raise errors.TransportError(host=self.where, why=f"host key mismatch ({e}); refusing") from None
            except paramiko.SSHException as e:
                client.close()
                # RejectPolicy raises a plain SSHException for an unknown host key.
                raise errors.TransportError(host=self.where, why=f"ssh: {e}") from None
            except (OSError, socket.timeout) as e:
                client.close()
                raise errors.TransportError(host=self.where, why=f"cannot connect: {e}") from None
            # Each command is a few small request/reply packets: without
            # TCP_NODELAY, Nagle + delayed ACK add ~40 ms to every one.
            client.get_transport().sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._client = client
            return client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- commands -----------------------------------------------------------
    @staticmethod
    def remote_command(argv: Sequence[str], timeout: float, *, sudo: bool = False) -> str:
        """The exact string sshd hands to the remote shell: quoted argv only.
        `sudo`: the account is not root, so the tool runs through `sudo -n`
        (a site's rule allows exactly the snapshot tools; etc/README.md)."""
        secs = max(1, int(timeout + 0.999))
        wrapped = ["timeout", "-k", "2", f"{secs}s", *(["sudo", "-n", "--"] if sudo else []), *argv]
        return f"PATH={FIXED_PATH} LC_ALL=C exec " + " ".join(shlex.quote(a) for a in wrapped)

    @property
    def sudo(self) -> bool:
        return self.user != "root"

    def run(self, argv: Sequence[str], timeout: float, input: bytes | None = None) -> Result:
        return self._run(argv, timeout, input, sudo=self.sudo)

    def _run(self, argv: Sequence[str], timeout: float, input: bytes | None = None, *, sudo: bool) -> Result:
        argv = _check_argv(argv)
        client = self._connect()
        deadline = time.monotonic() + timeout
        what = " ".join(argv[:3])
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError) as e:
            self.close()
            raise errors.TransportError(host=self.where, why=f"cannot open a session: {e}") from None
        try:
            chan.settimeout(timeout)  # bounds sendall of a large input; reads below never block
            chan.exec_command(self.remote_command(argv, timeout, sudo=sudo))
            if input:
                chan.sendall(input)
            chan.shutdown_write()  # the tool sees EOF on stdin, like /dev/null
            out, err = bytearray(), bytearray()
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    raise errors.Timeout(what=f"{what} on {self.where}", seconds=timeout)
                if not got:
                    time.sleep(0.01)
            status = chan.recv_exit_status()
        except (paramiko.SSHException, OSError) as e:
            self.close()
            raise errors.TransportError(host=self.where, why=f"{what}: {e}") from None
        finally:
            chan.close()  # on timeout this drops the session; remote timeout(1) kills the tool
        # timeout(1) exits 124, or 137 if it had to SIGKILL; only believe it
        # near the deadline (an OOM-killed tool also exits 137).
        if status in (_TIMEOUT_STATUS, 128 + 9) and time.monotonic() > deadline - 0.5 - 0.1 * timeout:
            raise errors.Timeout(what=f"{what} on {self.where}", seconds=timeout)
        return Result(status, bytes(out), bytes(err))

    def open(self, argv: Sequence[str], timeout: float, *, reads: bool, writes: bool) -> Stream:
        argv = _check_argv(argv)
        client = self._connect()
        try:
            chan = client.get_transport().open_session(timeout=self.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(self.remote_command(argv, timeout, sudo=self.sudo))
        except (paramiko.SSHException, OSError) as e:
            self.close()
            raise errors.TransportError(host=self.where, why=f"cannot start {' '.join(argv[:3])}: {e}") from None
        if not writes:
            chan.shutdown_write()
        return _SshStream(chan, argv, self.where)

    # The script is a constant; tool names and directories only ever arrive
    # as positional parameters. For each tool it prints the first executable
    # DIR/TOOL, or an empty line. (`command -v` would answer "test" for a
    # shell builtin, not a path we can exec.)
    _FIND_SCRIPT = ('set -f; dirs=$1; shift; for t in "$@"; do p=; IFS=:; for d in $dirs; do '
                    'if [ -x "$d/$t" ]; then p="$d/$t"; break; fi; done; unset IFS; echo "$p"; done')

    def find_tools(self, tools: Sequence[str], tool_dir: str | None, timeout: float) -> dict[str, str | None]:
        tools = list(tools)
        if not tools:
            return {}
        if tool_dir is not None and ":" in tool_dir:
            raise errors.BadValueError(what="tool_dir", value=tool_dir, why="must not contain ':'")
        # Looking needs no privilege: never through sudo.
        res = self._run(["sh", "-c", self._FIND_SCRIPT, "find-tools", tool_dir or FIXED_PATH, *tools], timeout,
                        sudo=False)
        lines = res.text.split("\n")
        if res.status != 0 or len(lines) < len(tools):
            raise errors.TransportError(host=self.where, why=f"tool lookup failed: {res.stderr.decode(errors='replace').strip()}")
        return {t: (p if p.startswith("/") else None) for t, p in zip(tools, lines)}

    def find_tool(self, tool: str, tool_dir: str | None, timeout: float) -> str | None:
        return self.find_tools([tool], tool_dir, timeout)[tool]


class _SshStream(Stream):
    """One session channel: its stdout and stdin are the tool's; stderr is
    buffered by paramiko and read at the end (a tool's stderr is small)."""

    def __init__(self, chan: paramiko.Channel, argv: list[str], where: str):
        self.chan, self.argv, self.where = chan, argv, where

    def _failed(self, e: BaseException):
        self.kill()
        return errors.TransportError(host=self.where, why=f"{' '.join(self.argv[:3])}: {e}")

    def read(self, size: int) -> bytes:
        try:
            return self.chan.recv(size)
        except (paramiko.SSHException, OSError) as e:
            raise self._failed(e) from None

    def write(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (paramiko.SSHException, OSError) as e:
            raise self._failed(e) from None

    def close_input(self) -> None:
        try:
            self.chan.shutdown_write()
        except (paramiko.SSHException, OSError):
            pass  # already closed: the tool has its EOF

    def wait(self, timeout: float) -> Result:
        deadline = time.monotonic() + timeout
        err = bytearray()
        try:
            while not self.chan.exit_status_ready():
                while self.chan.recv_stderr_ready():
                    err += self.chan.recv_stderr(65536)
                if time.monotonic() > deadline:
                    self.kill()
                    raise errors.Timeout(what=f"{' '.join(self.argv[:3])} on {self.where}", seconds=timeout)
                time.sleep(0.01)
            while self.chan.recv_stderr_ready():
                err += self.chan.recv_stderr(65536)
            status = self.chan.recv_exit_status()
        finally:
            self.chan.close()
        return Result(status, b"", bytes(err))

    def kill(self) -> None:
        # Closing the channel hangs up the remote session; the remote
        # timeout(1) wrapper kills the tool even if sshd does not.
        self.chan.close()
