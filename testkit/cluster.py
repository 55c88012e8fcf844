"""Drive a dev cluster (scripts/dev-cluster) from tests and benchmarks: up/down,
run a command on a host, submit as the test user, wait for job states,
preempt, read hook logs.

Nothing of the cluster's layout is written here: every command on a host
goes through `scripts/dev-cluster exec` (the one way, shared with the
scripts and the demo), and every path (namespaces, host trees, node disks)
is read from the layout dev-cluster writes into STATE/env (`layout_lines` in
scripts/lib-hosts.sh, also `dev-cluster layout STATE`).

Slurm 22.05 ignores -j/-u/-t filters together with --json, so every query
reads the whole `squeue --json` and filters here (on either version: the
cluster's few jobs cost nothing). Numbers and states are read through
slurm_snap.slurm.version, which knows 22.05's and 24.11's JSON shapes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


class ClusterError(RuntimeError):
    """The dev cluster could not be driven (start, query, submit)."""


def run_dev_cluster(action: str, state: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DEV_CLUSTER), action, *extra, str(state)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )


def layout(state: Path) -> dict[str, str]:
    """Where the cluster in `state` has (or would have) its namespaces, host
    trees and disks: dev-cluster's own answer, also for a cluster that never
    came fully up."""
    proc = run_dev_cluster("layout", state, timeout=60)
    if proc.returncode != 0:
        raise ClusterError(f"dev-cluster layout {state} failed: {proc.stderr.strip()}")
    return parse_env(proc.stdout)


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


def parse_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def read_env_file(path: Path) -> dict[str, str]:
    return parse_env(path.read_text())


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
        from slurm_snap.slurm.version import json_number, json_state

        return cls(
            # 22.05's one name (24.11: ["PENDING", "COMPLETING"] reads "COMPLETING").
            job_id=int(j["job_id"]), state=json_state(j.get("job_state", "")), reason=str(j.get("state_reason", "")),
            restart_count=json_number(j.get("restart_cnt", 0)), preempt_time=json_number(j.get("preempt_time", 0)),
            nodes=str(j.get("nodes", "")), partition=str(j.get("partition", "")), user=str(j.get("user_name", "")),
            raw=j,
        )


@dataclass
class Cluster:
    """A multi-host dev cluster: hosts ctl, n1..nN (3 unless `up --nodes N`) and login, each with its own
    network and mount namespace (scripts/lib-hosts.sh). Commands run on a host
    through `dev-cluster exec`; the test process itself is the machine room
    (the root namespace), which sees every node's disks and every host's
    private tree where the layout in `env` says."""
    state: Path
    env: dict[str, str]

    @classmethod
    def up(cls, state: Path, *extra: str, timeout: float = 900) -> "Cluster":
        proc = run_dev_cluster("up", state, *extra, timeout=timeout)
        if proc.returncode != 0:
            raise ClusterError(f"dev-cluster up {state} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return cls(state=state, env=read_env_file(state / "env"))

    @classmethod
    def attach(cls, state: Path) -> "Cluster":
        """A cluster that is already up (scripts/dev-cluster up STATE)."""
        env_file = Path(state) / "env"
        if not env_file.exists():
            raise ClusterError(f"no dev cluster in {state} (run scripts/dev-cluster up {state})")
        return cls(state=Path(state), env=read_env_file(env_file))

    def down(self, timeout: float = 300) -> subprocess.CompletedProcess:
        return run_dev_cluster("down", self.state, timeout=timeout)

    # --- faults (scripts/dev-cluster stop|start|net|reboot) --------------
    def _fault(self, action: str, *args: str, timeout: float = 300) -> None:
        proc = subprocess.run([str(DEV_CLUSTER), action, str(self.state), *args], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ClusterError(f"dev-cluster {action} {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")

    def stop(self, what: str) -> None:
        """Stop slurmctld, service, inventory (the database server) or node-agents."""
        self._fault("stop", what)

    def start(self, what: str) -> None:
        self._fault("start", what)

    def net(self, host: str, how: str) -> None:
        """Cut ("down") or restore ("up") `host`'s link at the switch."""
        self._fault("net", host, how)

    def reboot(self, node: str) -> None:
        """Every process of `node` killed, its namespaces made again, its daemons started."""
        self._fault("reboot", node, timeout=600)

    # --- names ---------------------------------------------------------
    @property
    def slurm_conf(self) -> str:
        return self.env["SLURM_CONF"]

    @property
    def config(self) -> str:
        """The slurm-snap config path as every host sees it (each host has its own file there)."""
        return self.env["SLURM_SNAP_CONFIG"]

    @property
    def helper(self) -> str:
        return self.env["SLURM_SNAP_HELPER"]

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
    def hosts(self) -> list[str]:
        return self.env.get("SLURM_SNAP_HOSTS", "ctl,n1,n2,n3,login").split(",")

    @property
    def inventory_kind(self) -> str:
        return self.env.get("SLURM_SNAP_INVENTORY", "sqlite")

    @property
    def pfs(self) -> Path:
        return Path(self.env["SLURM_SNAP_PFS"])

    @property
    def xfs(self) -> Path:
        """The shared XFS (reflink copies), as every host sees it."""
        return Path(self.env["SLURM_SNAP_XFS"])

    @property
    def scratch(self) -> Path:
        """Node-local scratch: this path on every node, each node's own disk."""
        return Path(self.env["SLURM_SNAP_SCRATCH"])

    def addr(self, host: str) -> str:
        return self.env[f"SLURM_SNAP_ADDR_{host}"]

    def netns(self, host: str) -> str:
        return self.env[f"SLURM_SNAP_NETNS_{host}"]

    def mntns(self, host: str) -> str:
        return self.env[f"SLURM_SNAP_MNTNS_{host}"]

    def namespace_files(self) -> list[tuple[str, str]]:
        """("net" or "mnt", file) of every namespace of the cluster, the switch's too."""
        return [(kind, v) for k, v in sorted(self.env.items())
                for kind, prefix in (("net", "SLURM_SNAP_NETNS_"), ("mnt", "SLURM_SNAP_MNTNS_"))
                if k.startswith(prefix) and k != "SLURM_SNAP_NETNS_TAG"]

    def user_dir(self, fs: str = "pfs", user: str | None = None) -> Path:
        """The test user's own directory on a shared filesystem (pfs, xfs)."""
        return Path(self.env[f"SLURM_SNAP_{fs.upper()}"]) / "users" / (user or self.user)

    # --- the machine room's view of hosts and disks ----------------------
    def disk(self, node: str, fs: str = "scratch") -> Path:
        """Node `node`'s own scratch (or xscratch) disk, as the machine room sees it."""
        return Path(self.env[f"SLURM_SNAP_{fs.upper()}_{node}"])

    def host_dir(self, host: str) -> Path:
        """Host `host`'s private tree (SLURM_SNAP_LOCAL inside it), as the machine room sees it."""
        return Path(self.env[f"SLURM_SNAP_LOCAL_{host}"])

    def root_path(self, path: str | Path, host: str | None = None) -> Path:
        """Where a path seen inside `host` is in the machine room: each host's
        own tree (SLURM_SNAP_LOCAL) and a node's own disks (SLURM_SNAP_SCRATCH,
        SLURM_SNAP_XSCRATCH) are elsewhere there; everything else is the same path."""
        path = Path(path)
        for per_host in ("LOCAL", "SCRATCH", "XSCRATCH"):
            base = Path(self.env[f"SLURM_SNAP_{per_host}"])
            if path == base or base in path.parents:
                if not host:
                    raise ValueError(f"{path} differs per host: name the host")
                outside = self.env.get(f"SLURM_SNAP_{per_host}_{host}")
                return Path(outside) / path.relative_to(base) if outside else path
        return path

    def pids(self) -> dict[str, int]:
        """Daemons recorded in each host's run dir ("slurmctld", "slurmd-n1", "sshd-n1", ...),
        whether alive or not."""
        out = {}
        for host in self.hosts:
            for f in sorted((self.host_dir(host) / "run").glob("*.pid")):
                text = f.read_text().strip()
                if text.isdigit():
                    out[f.stem if host == "ctl" else f"{f.stem}-{host}"] = int(text)
        return out

    # --- running commands on a host --------------------------------------
    @property
    def slurm_bin(self) -> str:
        """The cluster's Slurm commands (SLURM_SNAP_SLURM at `up`): first in PATH."""
        return self.env.get("SLURM_SNAP_SLURM_BIN", "/usr/bin")

    @property
    def slurm_version(self) -> str:
        return self.env.get("SLURM_SNAP_SLURM", "22.05")

    def exec_argv(self, host: str, *, user: str | None = None, cwd: Path | str | None = None,
                  env: dict[str, str] | None = None) -> list[str]:
        """`dev-cluster exec`'s argv up to the command: on `host`, as root or `user`,
        in `cwd`, with the cluster's client environment and `env`."""
        return [str(DEV_CLUSTER), "exec", *(["--user", user] if user else []),
                *(["--chdir", str(cwd)] if cwd else []), str(self.state), host,
                *(f"{k}={v}" for k, v in (env or {}).items()), "--"]

    def run(self, argv: list[str], user: str | None = None, cwd: Path | str | None = None,
            timeout: float = 60, check: bool = False, host: str = "login",
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command on `host` (default login, where users work), as root or
        (runuser) as `user`, as a client of the cluster (its Slurm first in PATH,
        SLURM_CONF) with `env` added: `dev-cluster exec`."""
        proc = run_group(self.exec_argv(host, user=user, cwd=cwd, env=env) + list(argv), timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{argv} on {host} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def cli(self, *args: str, host: str = "ctl", user: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        """slurm-snap with the host's own config: on ctl as root it is the admin's shell."""
        return self.run([self.helper, "--config", self.config, *args], user=user, host=host, timeout=timeout)

    def on(self, host: str, fn, *args, timeout: float = 600, **kwargs):
        """fn(*args, **kwargs) in a child process inside `host`'s network and mount
        namespaces (e.g. the inventory on ctl, a node's own scratch); returns its
        result, re-raises its exception. Nothing of the child's is shared back."""
        return run_in_namespaces([(self.netns(host), CLONE_NEWNET), (self.mntns(host), CLONE_NEWNS)],
                                 _with_slurm_bin, (self.slurm_bin, fn, args, kwargs), None, timeout)

    def inventory(self, fn, *args, **kwargs):
        """fn(repo, *args) in one inventory session on ctl (the inventory exists only there)."""
        return self.on("ctl", _with_inventory, self.config, fn, args, kwargs)

    def sbatch(self, *args: str, script: str | None = None, user: str | None = "",
               cwd: Path | str | None = None, timeout: float = 60) -> int:
        """Submit as the test user (default) on login and return the job id; raise with
        sbatch's stderr on failure.

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
                   timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """sbatch with `args` on login, returning the finished process (for tests expecting failure)."""
        user = self.user if user == "" else user
        return self.run(["sbatch", *args], user=user, cwd=cwd or (self.user_dir(user=user) if user else "/"),
                        timeout=timeout, env=env)

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
        # -t all: 24.11 honours squeue's default filter (pending, running,
        # completing) with --json and hides a job the moment it ends, so a
        # one-second preemptor could start and end unseen between two polls;
        # 22.05 ignores the filter and lists ended jobs until MinJobAge.
        # Both versions then answer alike.
        proc = self.run(["squeue", "--json", "-t", "all"], timeout=30)
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
            self.run(["scancel", *map(str, job_ids)], timeout=30, host="ctl")

    def drained(self) -> list[str]:
        """sinfo's "NODE state" lines of nodes drained, draining, down or failed."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30).stdout.split("\n")
        return [ln for ln in out if ln.strip() and ln.split()[1].startswith(("drain", "drng", "down", "fail"))]

    def preempt(self, nodes: int = 3, partition: str = "high", user: str | None = None) -> int:
        """Submit a short exclusive job on the high-priority partition: it preempts whatever holds the nodes."""
        return self.sbatch("-p", partition, "-N", str(nodes), "--exclusive", "-o", "/dev/null",
                           "-J", "preemptor", "--wrap", "/bin/true", user=user)

    # --- logs ------------------------------------------------------------
    def hook_log(self, host: str | None = None) -> str:
        """What slurm-snap's helper logged on `host` (default: every host, each under its name)."""
        parts = []
        for h in [host] if host else self.hosts:
            log_dir = self.host_dir(h) / "log" / "slurm-snap"
            for f in sorted(log_dir.glob("*")) if log_dir.is_dir() else []:
                if f.is_file():
                    parts.append(f"==> {h}:{f.name} <==\n{f.read_text(errors='replace')}")
        return "\n".join(parts)

    def daemon_log(self, name: str = "slurmctld", host: str = "ctl") -> str:
        path = self.host_dir(host) / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def config_path(self, host: str) -> Path:
        """Host `host`'s own slurm-snap.toml, as the machine room sees it."""
        return self.root_path(self.config, host)


def _with_inventory(config: str, fn, args, kwargs):
    from slurm_snap.config import load
    from slurm_snap.inventory.repository import Inventory

    inv = Inventory.from_config(load(config))
    try:
        with inv.session() as repo:
            return fn(repo, *args, **kwargs)
    finally:
        inv.dispose()


# --- running Python inside a host's namespaces -----------------------------------
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000


def _setns(path: str, nstype: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, nstype) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _with_slurm_bin(slurm_bin: str, fn, args, kwargs):
    # In the forked child only: slurm_snap there must run this cluster's Slurm.
    os.environ["SLURM_SNAP_SLURM_BIN"] = slurm_bin
    return fn(*args, **kwargs)


def run_in_namespaces(namespaces: list[tuple[str, int]], fn, args=(), kwargs=None, timeout: float = 600):
    """fork; the child (single-threaded, so setns may change its mount namespace)
    enters each (namespace file, CLONE_NEW* type) in order (net before mnt: the
    net file is opened through the machine room's mounts), runs fn and pickles
    its outcome back."""
    import pickle
    import select
    import traceback

    kwargs = kwargs or {}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        status = 0
        try:
            os.close(r)
            try:
                for f, nstype in namespaces:
                    _setns(f, nstype)
                os.chdir("/")
                outcome = ("ok", fn(*args, **kwargs), "")
            except BaseException as exc:  # noqa: BLE001 - handed to the parent
                outcome = ("err", exc, traceback.format_exc())
            try:
                data = pickle.dumps(outcome)
            except Exception:  # an unpicklable result or exception
                data = pickle.dumps(("err", RuntimeError(repr(outcome[1])), outcome[2]))
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        except BaseException:  # noqa: BLE001
            status = 1
        finally:
            os._exit(status)
    os.close(w)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                raise TimeoutError(f"{getattr(fn, '__name__', fn)} in {[f for f, _ in namespaces]} still running after {timeout:.0f} s")
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    if not chunks:
        raise ClusterError(f"{getattr(fn, '__name__', fn)} in {[f for f, _ in namespaces]}: the child died without an answer")
    kind, value, tb = pickle.loads(b"".join(chunks))
    if kind == "err":
        if tb and hasattr(value, "add_note"):
            value.add_note(f"in {namespaces[-1][0]}:\n{tb}")
        raise value
    return value


def user_ids(user: str) -> tuple[int, int]:
    import pwd
    pw = pwd.getpwnam(user)
    return pw.pw_uid, pw.pw_gid
