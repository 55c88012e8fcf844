"""How backends run tools: an argv on some host, with a deadline.

Backends never build shell strings and never call subprocess themselves: they
hand an argv to a Transport, so the same backend code runs locally or over SSH
(slurm_snap.backends.ssh). Hooks run without PATH, so tools are resolved in a
fixed search path (or an explicit tool_dir) to absolute paths first.
"""
from __future__ import annotations

import abc
import os

from slurm_snap import errors, spawn
from slurm_snap.record import record

TYPE_CHECKING = False   # typing's import would cost every opted-in Prolog ~10 ms
if TYPE_CHECKING:
    import subprocess
    from typing import Mapping, Sequence

FIXED_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@record
class Result:
    status: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


def _check_argv(argv: Sequence[str]) -> list[str]:
    # A bare string would be split into characters, or worse, read as a shell line.
    if isinstance(argv, (str, bytes)) or not argv or not all(isinstance(a, str) for a in argv):
        raise errors.BadValueError(what="argv", value=argv, why="must be a non-empty list of strings")
    if any("\0" in a for a in argv):
        raise errors.BadValueError(what="argv", value=argv, why="arguments must not contain NUL")
    return list(argv)


class Transport(abc.ABC):
    """Runs an argv somewhere. `where` names the host in error messages."""

    where: str = "localhost"
    # Runs on this host, as this process: backends may then ask the kernel
    # about a path instead of running a tool (base.Backend's path helpers).
    local: bool = False

    @abc.abstractmethod
    def run(self, argv: Sequence[str], timeout: float, input: bytes | None = None) -> Result:
        """Run argv (no shell) and return its status and output.

        MUST raise errors.Timeout if it has not finished within `timeout`
        seconds, after killing it. A nonzero status is returned, not raised:
        deciding what is a failure is the backend's business.
        """

    def find_tool(self, tool: str, tool_dir: str | None, timeout: float) -> str | None:
        """Absolute path of an executable `tool` on the target host, or None."""
        dirs = [tool_dir] if tool_dir else FIXED_PATH.split(":")
        for d in dirs:
            path = f"{d.rstrip('/')}/{tool}"
            if self.run(["test", "-x", path], timeout).status == 0:
                return path
        return None

    def find_tools(self, tools: Sequence[str], tool_dir: str | None, timeout: float) -> dict[str, str | None]:
        """find_tool for several tools; remote transports do it in one round trip."""
        return {t: self.find_tool(t, tool_dir, timeout) for t in tools}

    def open(self, argv: Sequence[str], timeout: float, *, reads: bool, writes: bool) -> "Stream":
        """Start argv (no shell) with its stdout (`reads`) and/or stdin
        (`writes`) as byte streams for the caller: how a snapshot travels from
        one host's tool to another's (backends.transfer) without a shell pipe.
        MUST stop the tool once `timeout` seconds have passed. Optional."""
        raise errors.Unsupported(backend=f"transport {self.where}", verb="streams")

    def close(self) -> None:
        """Release connections; the transport may be used again afterwards."""


class Stream(abc.ABC):
    """A running tool whose stdout and/or stdin the caller moves (Transport.open)."""

    where: str

    @abc.abstractmethod
    def read(self, size: int) -> bytes:
        """Up to `size` bytes of the tool's stdout; b"" at its end."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """All of `data` to the tool's stdin."""

    @abc.abstractmethod
    def close_input(self) -> None:
        """EOF on the tool's stdin."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> Result:
        """The tool's exit status and stderr (stdout was the caller's); errors.Timeout after killing it."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Stop the tool now (a timeout or the other end failed); idempotent."""


class _LocalStream(Stream):
    def __init__(self, proc: subprocess.Popen, err, argv: list[str]):
        self.proc, self.err, self.argv, self.where = proc, err, argv, "localhost"

    def read(self, size: int) -> bytes:
        return self.proc.stdout.read1(size)

    def write(self, data: bytes) -> None:
        self.proc.stdin.write(data)

    def close_input(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def wait(self, timeout: float) -> Result:
        import subprocess

        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise errors.Timeout(what=" ".join(self.argv[:3]), seconds=timeout) from None
        finally:
            for f in (self.proc.stdout, self.proc.stdin):
                if f is not None and not f.closed:
                    try:
                        f.close()
                    except OSError:
                        pass  # a killed reader: nothing more to say to it
        self.err.seek(0)
        stderr = self.err.read()
        self.err.close()
        return Result(status, b"", stderr)

    def kill(self) -> None:
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class LocalTransport(Transport):
    """A tool run with an argv (slurm_snap.spawn), stdin /dev/null, fixed PATH, kill-on-timeout.

    `extra_env` adds variables to the fixed environment (tests point fake
    tools at their state directory this way); nothing else is inherited, so a
    hook's or user's environment cannot change what a tool does.
    """

    where = "localhost"
    local = True

    def __init__(self, extra_env: Mapping[str, str] | None = None):
        self.env = {"PATH": FIXED_PATH, "LC_ALL": "C", **(extra_env or {})}

    def find_tool(self, tool: str, tool_dir: str | None, timeout: float) -> str | None:
        # Same rule as the base class, without forking `test` per directory.
        dirs = [tool_dir] if tool_dir else FIXED_PATH.split(":")
        for d in dirs:
            path = os.path.join(d, tool)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None

    def open(self, argv: Sequence[str], timeout: float, *, reads: bool, writes: bool) -> Stream:
        import subprocess
        import tempfile

        argv = _check_argv(argv)
        # stderr to a file, not a pipe nobody reads while the data flows: a
        # chatty tool would otherwise block on a full pipe and hang the transfer.
        err = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE if writes else subprocess.DEVNULL,
                stdout=subprocess.PIPE if reads else subprocess.DEVNULL, stderr=err, env=self.env,
                close_fds=True, start_new_session=True)
        except FileNotFoundError:
            err.close()
            raise errors.ToolMissing("local", argv[0]) from None
        return _LocalStream(proc, err, argv)

    def run(self, argv: Sequence[str], timeout: float, input: bytes | None = None) -> Result:
        argv = _check_argv(argv)
        try:
            # A new session (spawn gives one) so a timeout kills the tool's
            # children too (a hung `btrfs` may have forked helpers holding our pipes).
            status, out, err = spawn.run(argv, self.env, timeout, input)
        except FileNotFoundError:
            raise errors.ToolMissing("local", argv[0]) from None
        except PermissionError as e:
            raise errors.CommandFailed(argv0=argv[0], status=126, stderr=str(e), argv=argv,
                                       host=self.where) from None
        except spawn.Expired:
            raise errors.Timeout(what=" ".join(argv[:3]), seconds=timeout) from None
        return Result(status, out, err)
