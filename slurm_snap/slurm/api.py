"""The one way slurm-snap asks Slurm about jobs and nodes: pyslurm where the
installed pyslurm was built for the running Slurm's major.minor, otherwise
Slurm's own commands (slurm/commands.py).

`interface()` chooses once per process and every call goes wholly through the
chosen side, never a mix inside one call. `choose()` says why (doctor prints
it). pyslurm releases follow Slurm's (25.11.2 = Slurm 25.11, pyslurm patch 2)
and its extension only works against the libslurm of that series, so the
choice is made before `import pyslurm`, which loads libslurm and reads
slurm.conf at once (and exits the process when it finds none, measured with
25.11.2): the installed Slurm's series comes from its slurm_version.h beside
the commands slurm-snap runs, pyslurm's from its package metadata. A pyslurm
of another series is refused by name with what to install, never imported.

What it saves, measured in docs/benchmarks.md (row 13): a fork, an exec and a
JSON parse per question in a process that asks more than once; a process that
asks once pays more for `import pyslurm` than the fork costs, so the hooks ask
through the commands (`for_hook()`).
"""
from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass
from importlib import metadata

from ..errors import CommandFailed, NotFound, SnapError
from . import commands
from .commands import JobInfo

# SLURM_SNAP_SLURM_API=commands keeps a site (or a benchmark) on the commands
# even where pyslurm would match.
_FORCE_ENV = "SLURM_SNAP_SLURM_API"
_VERSION_H = re.compile(r"#define\s+SLURM_VERSION_NUMBER\s+0x([0-9a-fA-F]+)")


@dataclass(frozen=True)
class Choice:
    """Which side talks to Slurm, and why."""
    name: str             # "pyslurm" or "commands"
    why: str
    refused: str = ""     # a pyslurm present but not usable: what to do about it


def installed_series(bin_dir: str | None = None) -> str | None:
    """"25.11" from slurm_version.h beside the Slurm commands slurm-snap runs
    (/usr/bin -> /usr/include, /opt/slurm-25.11/bin -> its include); None
    when the headers are not installed."""
    if bin_dir is None:
        try:
            bin_dir = os.path.dirname(commands.tool("squeue"))
        except SnapError:
            return None
    header = os.path.join(os.path.dirname(bin_dir), "include", "slurm", "slurm_version.h")
    try:
        with open(header, encoding="ascii", errors="replace") as f:
            m = _VERSION_H.search(f.read())
    except OSError:
        return None
    if not m:
        return None
    number = int(m.group(1), 16)  # 0x190b07 = 25.11.7
    return f"{number >> 16 & 0xff}.{number >> 8 & 0xff:02d}"


def pyslurm_version() -> str | None:
    """The installed pyslurm's version from its metadata (no import)."""
    if importlib.util.find_spec("pyslurm") is None:
        return None
    try:
        return metadata.version("pyslurm")
    except metadata.PackageNotFoundError:
        return None


def choose(slurm_series: str | None = None, pyslurm: str | None = None, *, force: str | None = None,
           conf: str | None = None) -> Choice:
    """Pure decision (tests pass every input). `slurm_series` is the running
    Slurm's major.minor ("25.11"), `pyslurm` the installed pyslurm's version."""
    if force == "commands":
        return Choice("commands", f"{_FORCE_ENV}=commands")
    if pyslurm is None:
        return Choice("commands", "pyslurm is not installed")
    series = ".".join(pyslurm.split(".")[:2])
    if slurm_series is None:
        return Choice("commands", f"pyslurm {pyslurm} installed, but the running Slurm's version is unknown "
                                  "(no slurm_version.h beside its commands)",
                      refused=f"pyslurm {pyslurm} not used: install Slurm's headers (libslurm-dev) so "
                              "slurm-snap can tell whether it matches")
    if _series_key(series) != _series_key(slurm_series):
        return Choice("commands", f"pyslurm {pyslurm} is for Slurm {series}, Slurm {slurm_series} runs",
                      refused=f"pyslurm {pyslurm} refused: built for Slurm {series}, this Slurm is {slurm_series}; "
                              f"install pyslurm=={slurm_series}.* built against this Slurm's headers "
                              "(README: 'pyslurm'), or uninstall pyslurm")
    if conf is not None and not os.path.exists(conf):
        return Choice("commands", f"pyslurm {pyslurm} matches Slurm {slurm_series}, but {conf} does not exist",
                      refused=f"pyslurm not used: importing it without a readable slurm.conf ends the process; "
                              f"set [slurm] conf or SLURM_CONF")
    return Choice("pyslurm", f"pyslurm {pyslurm} matches Slurm {slurm_series}")


def _series_key(series: str) -> tuple[int, int]:
    major, minor = series.split(".")[:2]
    return int(major), int(minor)


def probe() -> Choice:
    return choose(installed_series(), pyslurm_version(), force=os.environ.get(_FORCE_ENV),
                  conf=commands.effective_conf())


class Commands:
    """Slurm's commands: one fork per question (22.05 and 24.11 always)."""
    name = "commands"

    def job(self, job_id: int, timeout: float = 10.0) -> JobInfo:
        return commands.squeue_job(job_id, timeout=timeout)

    def running_jobs(self, timeout: float = 10.0) -> dict[int, int]:
        return commands.running_jobs(timeout=timeout)

    def node_states(self, timeout: float = 10.0) -> dict[str, tuple[str, str]]:
        return commands.node_states(timeout=timeout)


class Pyslurm:
    """libslurm's RPCs through pyslurm. Timeouts are Slurm's own
    (MessageTimeout): libslurm takes none per call."""
    name = "pyslurm"

    def __init__(self):
        # The environment must name slurm.conf before libslurm initialises.
        os.environ.setdefault("SLURM_CONF", commands.effective_conf())
        import pyslurm  # noqa: PLC0415  only once chosen

        self._p = pyslurm

    def _rpc(self, what: str, call):
        try:
            return call()
        except self._p.RPCError as exc:
            raise CommandFailed(argv0=f"pyslurm {what}", status=getattr(exc, "errno", 1) or 1,
                                stderr=str(exc)[-500:]) from None

    def job(self, job_id: int, timeout: float = 10.0) -> JobInfo:
        try:
            j = self._p.Job.load(int(job_id))
        except self._p.RPCError as exc:
            if "Invalid job id" in str(exc):
                raise NotFound(what="Slurm job", value=str(job_id)) from None
            raise CommandFailed(argv0="pyslurm Job.load", status=1, stderr=str(exc)[-500:]) from None
        return _job_info(j)

    def running_jobs(self, timeout: float = 10.0) -> dict[int, int]:
        jobs = self._rpc("Jobs.load", self._p.Jobs.load)
        return {int(j.id): int(j.requeue_count or 0) for j in jobs.values() if j.state == "RUNNING"}

    def node_states(self, timeout: float = 10.0) -> dict[str, tuple[str, str]]:
        nodes = self._rpc("Nodes.load", self._p.Nodes.load)
        return {str(n.name): (sinfo_state(str(n.state)), n.reason or "") for n in nodes.values()}


def _job_info(j) -> JobInfo:
    # pyslurm 25.11: preempt_time is epoch seconds or None; the node list is
    # allocated_nodes; state names the first flag set, as 22.05's squeue did.
    return JobInfo(job_id=int(j.id), user=str(j.user_name or ""), uid=int(j.user_id if j.user_id is not None else -1),
                   state=str(j.state), restart_count=int(j.requeue_count or 0),
                   preempt_time=int(j.preempt_time or 0), nodes=str(j.allocated_nodes or ""),
                   partition=str(j.partition or ""), batch_host=str(j.batch_host or ""),
                   state_reason=str(j.state_reason or ""), end_time=int(j.end_time or 0))


# libslurm's complete node state ("IDLE+DRAIN", "DOWN+NOT_RESPONDING") in
# sinfo %T's words, which nodeloss and the drill's placement read: a drained
# idle node is "drained", a drained busy one "draining", not responding adds "*".
def sinfo_state(complete: str) -> str:
    parts = [p for p in complete.upper().split("+") if p]
    base, flags = (parts[0] if parts else "UNKNOWN"), set(parts[1:])
    if "DRAIN" in flags and base not in ("DOWN", "FAIL"):
        name = "drained" if base == "IDLE" else "draining"
    elif "FAIL" in flags:
        name = "fail" if base == "IDLE" else "failing"
    elif "COMPLETING" in flags and base != "DOWN":
        name = "completing"
    else:
        name = base.lower()
    return name + ("*" if "NOT_RESPONDING" in flags else "")


_CHOSEN: Choice | None = None
_IFACE: Commands | Pyslurm | None = None


def for_hook() -> Commands:
    """What the hooks ask Slurm through: the commands, whatever the probe
    says. A hook is a process of its own that asks once, and `import
    pyslurm` (libslurm initialises: slurm.conf, its plugins) costs more than
    the one fork it saves: the first lookup in a fresh process took 399 ms
    through pyslurm against 311 ms through squeue (docs/benchmarks.md, row 13)."""
    return Commands()


def import_failed(choice: Choice, exc: ImportError) -> Choice:
    """A pyslurm whose metadata matches but whose extension does not load
    against this libslurm (built against another Slurm's headers, libslurm
    missing): the commands serve, and doctor names what to reinstall."""
    series = choice.why.rsplit("Slurm ", 1)[-1]
    return Choice("commands", f"{choice.why}, but `import pyslurm` failed: {str(exc)[:300]}",
                  refused=f"pyslurm refused: it does not load against this Slurm ({str(exc)[:200]}); reinstall "
                          f"pyslurm=={series}.* built against this Slurm's headers (README: 'pyslurm'), "
                          "or uninstall pyslurm")


def interface() -> Commands | Pyslurm:
    """The side chosen for this process (probed on first use)."""
    global _CHOSEN, _IFACE
    if _IFACE is None:
        choice, iface = probe(), None
        if choice.name == "pyslurm":
            try:
                iface = Pyslurm()
            except ImportError as exc:
                choice = import_failed(choice, exc)
        _CHOSEN, _IFACE = choice, iface or Commands()
    return _IFACE


def chosen() -> Choice:
    interface()
    assert _CHOSEN is not None
    return _CHOSEN
