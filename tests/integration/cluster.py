"""Drive a dev cluster (scripts/dev-cluster) from tests: up/down, submit as the
test user, wait for job states, preempt, read hook logs.

Slurm 22.05 ignores -j/-u/-t filters together with --json, so every query
reads the whole `squeue --json` and filters here.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]
DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


class ClusterError(RuntimeError):
    """The dev cluster could not be driven (start, query, submit)."""


def run_dev_cluster(action: str, state: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEV_CLUSTER), action, *extra, str(state)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )


def run_group(argv: list[str], cwd: Path | str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """subprocess.run in its own session: a timeout kills runuser *and* the srun/sbatch under it."""
    with subprocess.Popen(argv, cwd=str(cwd) if cwd else None, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


@dataclass
class Job:
    """One job as squeue --json shows it (the keys tests need)."""
    job_id: int
    state: str
    reason: str
    restart_count: int
    preempt_time: int
    nodes: str
    partition: str
    user: str
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def from_json(cls, j: dict) -> "Job":
        return cls(
            job_id=int(j["job_id"]), state=str(j.get("job_state", "")), reason=str(j.get("state_reason", "")),
            restart_count=int(j.get("restart_cnt", 0) or 0), preempt_time=int(j.get("preempt_time", 0) or 0),
            nodes=str(j.get("nodes", "")), partition=str(j.get("partition", "")), user=str(j.get("user_name", "")),
            raw=j,
        )


@dataclass
class Cluster:
    state: Path
    env: dict[str, str]

    @classmethod
    def up(cls, state: Path, *extra: str, timeout: float = 900) -> "Cluster":
        proc = run_dev_cluster("up", state, *extra, timeout=timeout)
        if proc.returncode != 0:
            raise ClusterError(f"dev-cluster up {state} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return cls(state=state, env=read_env_file(state / "env"))

    def down(self, timeout: float = 300) -> subprocess.CompletedProcess:
        return run_dev_cluster("down", self.state, timeout=timeout)

    # --- names ---------------------------------------------------------
    @property
    def slurm_conf(self) -> str:
        return self.env["SLURM_CONF"]

    @property
    def python(self) -> str:
        """The venv's interpreter on every host (SLURM_SNAP_VENV at `up`)."""
        return self.env["SLURM_SNAP_PYTHON"]

    @property
    def user(self) -> str:
        return self.env.get("SLURM_SNAP_TEST_USER", "snapuser")

    @property
    def other_user(self) -> str:
        return self.env.get("SLURM_SNAP_OTHER_USER", "snapother")

    @property
    def nodes(self) -> list[str]:
        return self.env.get("SLURM_SNAP_NODES", "n1,n2,n3").split(",")

    @property
    def pfs(self) -> Path:
        return Path(self.env.get("SLURM_SNAP_PFS", str(self.state / "mnt" / "pfs")))

    def user_dir(self, fs: str = "pfs", user: str | None = None) -> Path:
        """The test user's own directory on a filesystem (pfs, xfs, scratch/nK)."""
        return self.state / "mnt" / fs / "users" / (user or self.user)

    def pids(self) -> dict[str, int]:
        """Daemons recorded in STATE/run (name -> pid), whether alive or not."""
        out = {}
        for f in sorted((self.state / "run").glob("*.pid")):
            text = f.read_text().strip()
            if text.isdigit():
                out[f.stem] = int(text)
        return out

    # --- running commands ----------------------------------------------
    def client_env(self, user: str | None = None) -> dict[str, str]:
        env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "SLURM_CONF": self.slurm_conf}
        if user:
            env.update(HOME=f"/home/{user}", USER=user, LOGNAME=user)
        return env

    def run(self, argv: list[str], user: str | None = None, cwd: Path | str | None = None,
            timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        """Run a Slurm client command, as root or (runuser) as `user`, with only SLURM_CONF set."""
        env_argv = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in self.client_env(user).items())]
        full = (["/usr/sbin/runuser", "-u", user, "--"] if user else []) + env_argv + argv
        proc = run_group(full, cwd=cwd, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{argv} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, *args: str, script: str | None = None, user: str | None = "",
               cwd: Path | str | None = None, timeout: float = 60) -> int:
        """Submit as the test user (default) and return the job id; raise with sbatch's stderr on failure.

        `script` is written to a file in the user's pfs directory, so every node sees it.
        """
        user = self.user if user == "" else user
        argv = ["sbatch", "--parsable", *args]
        if script is not None:
            path = self.write_user_file(f"job-{time.monotonic_ns()}.sh", script, user=user, mode=0o755)
            argv.append(str(path))
        proc = self.sbatch_raw(argv[1:], user=user, cwd=cwd, timeout=timeout)
        if proc.returncode != 0:
            raise ClusterError(f"sbatch {args} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return int(proc.stdout.strip().split(";")[0])

    def sbatch_raw(self, args: list[str], user: str | None = "", cwd: Path | str | None = None,
                   timeout: float = 60) -> subprocess.CompletedProcess:
        """sbatch with `args`, returning the finished process (for tests expecting failure)."""
        user = self.user if user == "" else user
        return self.run(["sbatch", *args], user=user, cwd=cwd or (self.user_dir(user=user) if user else "/"),
                        timeout=timeout)

    def write_user_file(self, name: str, text: str, user: str | None = None, mode: int = 0o644,
                        fs: str = "pfs") -> Path:
        user = user or self.user
        path = self.user_dir(fs, user) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        uid, gid = user_ids(user)
        os.chown(path, uid, gid)
        return path

    def make_user_dir(self, name: str, user: str | None = None, fs: str = "pfs") -> Path:
        user = user or self.user
        path = self.user_dir(fs, user) / name
        path.mkdir(parents=True, exist_ok=True)
        uid, gid = user_ids(user)
        os.chown(path, uid, gid)
        return path

    # --- jobs ------------------------------------------------------------
    def jobs(self) -> list[Job]:
        proc = self.run(["squeue", "--json"], timeout=30)
        if proc.returncode != 0:
            raise ClusterError(f"squeue --json failed: {proc.stderr.strip()}")
        return [Job.from_json(j) for j in json.loads(proc.stdout).get("jobs", [])]

    def job(self, job_id: int) -> Job | None:
        for j in self.jobs():
            if j.job_id == job_id:
                return j
        return None

    def wait_for(self, job_id: int, predicate, timeout: float, what: str = "condition",
                 interval: float = 0.3) -> Job | None:
        """Poll squeue until predicate(job or None) is true; raise naming `what` and the last state."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            last = self.job(job_id)
            if predicate(last):
                return last
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id}: {what} not reached in {timeout:.0f} s; last seen {last}")
            time.sleep(interval)

    def wait_state(self, job_id: int, states: set[str] | str, timeout: float = 60) -> Job | None:
        wanted = {states} if isinstance(states, str) else set(states)
        # MinJobAge drops finished jobs from squeue; gone counts as terminal.
        gone_ok = bool(wanted & TERMINAL_STATES)
        return self.wait_for(job_id, lambda j: (j is None and gone_ok) or (j is not None and j.state in wanted),
                             timeout, what=f"state in {sorted(wanted)}")

    def cancel(self, *job_ids: int) -> None:
        if job_ids:
            self.run(["scancel", *map(str, job_ids)], timeout=30)

    def preempt(self, nodes: int = 3, partition: str = "high", user: str | None = None) -> int:
        """Submit a short exclusive job on the high-priority partition: it preempts whatever holds the nodes."""
        return self.sbatch("-p", partition, "-N", str(nodes), "--exclusive", "-o", "/dev/null",
                           "-J", "preemptor", "--wrap", "/bin/true", user=user)

    # --- logs ------------------------------------------------------------
    def hook_log(self) -> str:
        """Everything slurm-snap's helper logged in this cluster (STATE/log/slurm-snap/*)."""
        parts = []
        log_dir = self.state / "log" / "slurm-snap"
        for f in sorted(log_dir.glob("*")) if log_dir.is_dir() else []:
            if f.is_file():
                parts.append(f"==> {f.name} <==\n{f.read_text(errors='replace')}")
        return "\n".join(parts)

    def daemon_log(self, name: str = "slurmctld") -> str:
        path = self.state / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def user_ids(user: str) -> tuple[int, int]:
    import pwd
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid


def mounts_under(prefix: Path) -> list[str]:
    """Mount points under prefix, from /proc/mounts (octal escapes decoded)."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[1])
        if target == str(prefix) or target.startswith(str(prefix) + "/"):
            out.append(target)
    return out


def loops_backed_by(prefix: Path) -> list[str]:
    """Loop devices whose backing file is under prefix (losetup -a)."""
    proc = subprocess.run(["/usr/sbin/losetup", "-a", "-n", "-O", "NAME,BACK-FILE", "--list"],
                          capture_output=True, text=True, timeout=30)
    out = []
    for line in proc.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip().startswith(str(prefix) + "/"):
            out.append(parts[0])
    return out


def processes_using(prefix: Path) -> list[int]:
    """PIDs whose cwd or an open file is under prefix."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            links = [os.readlink(d / "cwd")] + [os.readlink(fd) for fd in (d / "fd").iterdir()]
        except OSError:
            continue
        if any(link == str(prefix) or link.startswith(str(prefix) + "/") for link in links):
            found.append(int(d.name))
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is gone for our purposes.
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


# --- starting clusters from tests ---------------------------------------------

def unavailable(reason: str):
    """Fail under CI, skip (with the reason shown by -ra) locally."""
    from realcomponents import require

    require(False, f"dev cluster unavailable: {reason}")


def new_state_dir(prefix: str = "slurm-snap-it-") -> Path:
    """A state dir the test users can traverse: not under /root, not in pytest's 0700 tmp."""
    base = Path("/var/tmp") if Path("/var/tmp").is_dir() else Path(tempfile.gettempdir())
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    path.chmod(0o755)
    return path


def remove_state_dir(path: Path) -> None:
    """Delete a test's state dir, but never through a live mount or loop device."""
    if mounts_under(path) or loops_backed_by(path):
        return
    shutil.rmtree(path, ignore_errors=True)


def start_cluster(state: Path, *extra: str) -> Cluster:
    if os.geteuid() != 0:
        unavailable("needs root (loop devices, mounts, daemons)")
    try:
        return Cluster.up(state, *extra)
    except (ClusterError, OSError) as exc:
        unavailable(str(exc))
    except Exception as exc:  # e.g. TimeoutExpired: still a reason to report, not a crash
        unavailable(f"{type(exc).__name__}: {exc}")


