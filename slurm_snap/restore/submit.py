"""A drill as a Slurm job of its owner: the program runs on compute nodes, never here.

Root (the drill, on the controller) makes the shared parts' clones; the
command then runs where Slurm puts it, as the job's owner, under Slurm's
limits: sbatch is executed *as the owner* (uid, primary gid and groups, as
runuser/setpriv would: munge authenticates that uid, so no `--uid` and no
root job), with a batch script that only names fixed paths (no user input
in any shell text):

    #!/bin/sh
    exec <python> -m slurm_snap.restore.injob <marker_dir>/spec.json

The job carries `--snapshot-drill=TEST`: its Prolog on each node clones the
node-local parts that node holds (restore/onnode.py), its Epilog removes
them. It asks for the nodes that hold the set's node-local parts
(`--nodelist`, one task per node: placement.positions), in the job's
partition or `[restore] partition`/`qos`, at `[restore] nice`, with the
GRES the job had (its recorded options). The in-job runner
(restore/injob.py) waits for every node's Prolog, runs the argv from
spec.json with the same watcher as a local drill and writes result.json next
to it. The drill waits for the job to leave the queue (or, --no-wait, a later
sweep collects it), reads the result and each node's report. The namespace
must be visible at the same path on the compute nodes.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

import slurm_snap

from .. import errors
from ..slurm.commands import tool
from .runner import Credentials, RunResult

SPEC = "spec.json"
RESULT = "result.json"
SCRIPT = "drill.sh"
FIXED_PATH = "/usr/local/bin:/usr/bin:/bin"
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE"})


@dataclass(frozen=True)
class Where:
    """What a drill job asks Slurm for (sbatch options, no user text in a shell)."""

    test_id: int
    nodes: tuple[str, ...] = ()      # the drill's positions, in order; () any node(s) of the partition
    count: int = 1                   # nodes to ask for when `nodes` is empty
    partition: str = ""
    qos: str = ""
    nice: int = 0
    gres: str = ""                   # sbatch --gres, per node
    gpus: str = ""                   # sbatch --gpus, per job


def where_for(cfg, plan, *, partition: str | None = None) -> Where:
    """A plan's drill job: its positions' nodes, the drill partition (or the
    job's), the drill QOS and nice, and the GRES the job had."""
    nodes = tuple(p.node for p in plan.positions)
    return Where(test_id=0, nodes=nodes, count=len(nodes) or max(1, len(plan.job_nodes)),
                 partition=partition or cfg.restore.partition or plan.partition, qos=cfg.restore.qos,
                 nice=cfg.restore.nice, gres=str((plan.options or {}).get("gres") or ""),
                 gpus=str((plan.options or {}).get("gpus") or ""))


class SlurmSubmitter:
    def __init__(self, cfg, *, queue_timeout: float | None = None, poll: float = 1.0, partition: str | None = None,
                 python: str | None = None):
        self.cfg = cfg
        self.queue_timeout = cfg.restore.queue_timeout if queue_timeout is None else queue_timeout
        self.poll = poll
        self.partition = partition
        self.python = python or _python()
        self.cmd_timeout = cfg.timeouts.slurm_command

    def _slurm_env(self, owner) -> dict[str, str]:
        env = {"PATH": FIXED_PATH, "HOME": owner.pw_dir, "USER": owner.pw_name, "LOGNAME": owner.pw_name,
               "LANG": "C.UTF-8",
               # The job imports this very slurm_snap, wherever it is installed.
               "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(slurm_snap.__file__)))}
        if os.environ.get("SLURM_CONF"):
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return env

    def _run(self, argv: list[str], env: dict, creds: Credentials | None = None) -> subprocess.CompletedProcess:
        kwargs = {}
        if creds is not None and os.geteuid() == 0:
            kwargs = {"user": creds.uid, "group": creds.gid, "extra_groups": list(creds.groups)}
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                                  timeout=self.cmd_timeout, close_fds=True, **kwargs)
        except subprocess.TimeoutExpired:
            raise errors.Timeout(what=os.path.basename(argv[0]), seconds=self.cmd_timeout) from None
        except FileNotFoundError:
            raise errors.ToolMissing("slurm", argv[0]) from None

    def submit(self, *, argv, env, marker_dir, marker_file, deadline, owner, creds, job_name, where: Where) -> int:
        spec = {"argv": list(argv), "env": dict(env), "cwd": marker_dir, "marker_file": marker_file,
                "deadline": deadline, "result": os.path.join(marker_dir, RESULT),
                "barrier_dir": self.cfg.paths.barrier_dir if where.nodes else "",
                "positions": list(where.nodes)}
        _write_owned(os.path.join(marker_dir, SPEC), json.dumps(spec).encode(), creds, 0o600)
        script = f"#!/bin/sh\nexec {_q(self.python)} -m slurm_snap.restore.injob {_q(os.path.join(marker_dir, SPEC))}\n"
        _write_owned(os.path.join(marker_dir, SCRIPT), script.encode(), creds, 0o700)
        return self._sbatch(sbatch_argv(where, job_name=job_name, deadline=deadline, marker_dir=marker_dir,
                                        partition=self.partition), owner, creds)

    def _sbatch(self, cmd: list[str], owner, creds) -> int:
        res = self._run(cmd, self._slurm_env(owner), creds)
        out = res.stdout.decode(errors="replace").strip()
        m = re.match(r"^(\d+)", out)
        if res.returncode != 0 or not m:
            raise errors.CommandFailed(argv0="sbatch", status=res.returncode,
                                       stderr=res.stderr.decode(errors="replace").strip() or out or "(no output)")
        return int(m.group(1))

    def job_state(self, job_id: int, owner=None) -> str | None:
        """The job's state while squeue knows it, else None."""
        env = self._slurm_env(owner) if owner is not None else _root_env()
        res = self._run([tool("squeue"), "-h", "-j", str(job_id), "-o", "%T"], env)
        text = res.stdout.decode(errors="replace").strip()
        if res.returncode != 0:
            err = res.stderr.decode(errors="replace").strip()
            if "Invalid job id" in err:
                return None  # already purged from slurmctld's memory: it ended
            # slurmctld unreachable is not "the job ended": never turn it into a verdict.
            raise errors.CommandFailed(argv0="squeue", status=res.returncode, stderr=err or "(no stderr)")
        if not text:
            return None
        return text.splitlines()[0].strip()

    def cancel(self, job_id: int) -> None:
        try:
            self._run([tool("scancel"), str(job_id)], _root_env())
        except errors.SnapError:
            pass  # best effort: the job's own --time ends it anyway

    def finished(self, job_id: int, owner=None) -> tuple[bool, str | None]:
        """(done, last state): done once squeue no longer lists the job or shows it ended."""
        state = self.job_state(job_id, owner)
        return (state is None or state in ENDED), state

    def result(self, job_id: int, marker_dir: str, last: str | None) -> RunResult:
        """What the in-job runner wrote, or a failure saying why there is nothing."""
        result = _read_result(os.path.join(marker_dir, RESULT))
        if result is None:
            tail = _read_tail(os.path.join(marker_dir, f"slurm-{job_id}.out"))
            return RunResult(started=True, error=f"Slurm job {job_id} ended ({last or 'gone'}) without a result"
                                                 + (f"; output: {tail}" if tail else ""))
        return result

    def run(self, *, argv, env, marker_dir, marker_file, deadline, owner, creds, job_name, where: Where,
            on_submitted=None) -> RunResult:
        job_id = self.submit(argv=argv, env=env, marker_dir=marker_dir, marker_file=marker_file,
                             deadline=deadline, owner=owner, creds=creds, job_name=job_name, where=where)
        if on_submitted:
            on_submitted(job_id)
        end = time.monotonic() + self.wait_bound(deadline)
        last = None
        while time.monotonic() < end:
            try:
                done, state = self.finished(job_id, owner)
            except errors.SnapError:
                done, state = False, None  # slurmctld busy or restarting: ask again
            last = state or last
            if done:
                break
            time.sleep(self.poll)
        else:
            self.cancel(job_id)
            return self.overdue(job_id, last, deadline)
        return self.result(job_id, marker_dir, last)

    def wait_bound(self, deadline: float) -> float:
        """How long a drill job may take from its submission: the queue, the
        Prologs (at most the deadline: injob's wait), the program's deadline."""
        return self.queue_timeout + 2 * deadline + 30

    def overdue(self, job_id: int, last: str | None, deadline: float) -> RunResult:
        """The result of a drill job cancelled past wait_bound. One that never
        started says nothing of the set (the queue, a node down): the drill is
        abandoned (errors.Timeout), not failed."""
        if last in (None, "PENDING", "CONFIGURING"):
            raise errors.Timeout(what=f"Slurm job {job_id} of the drill to start (still {last or 'queued'}; "
                                      f"[restore] queue_timeout)", seconds=self.queue_timeout)
        return RunResult(started=True, timed_out=True,
                         error=f"deadline: Slurm job {job_id} did not finish within "
                               f"{self.wait_bound(deadline):g} s of its submission (last state {last})")


def sbatch_argv(where: Where, *, job_name: str, deadline: float, marker_dir: str,
                partition: str | None = None) -> list[str]:
    """The drill job's sbatch command line (pure: tests read it)."""
    # The Prologs may take up to the deadline (injob's wait), the program the deadline.
    minutes = max(1, math.ceil((2 * deadline + 60) / 60))
    cmd = [tool("sbatch"), "--parsable", f"--job-name={job_name}", f"--time={minutes}", f"--chdir={marker_dir}",
           f"--output={os.path.join(marker_dir, 'slurm-%j.out')}", f"--snapshot-drill={where.test_id}"]
    if where.nodes:
        cmd += [f"--nodelist={','.join(where.nodes)}", f"--nodes={len(where.nodes)}", "--ntasks-per-node=1"]
    else:
        cmd += [f"--nodes={where.count}", "--ntasks-per-node=1"]
    if partition or where.partition:
        cmd.append(f"--partition={partition or where.partition}")
    if where.qos:
        cmd.append(f"--qos={where.qos}")
    if where.nice:
        cmd.append(f"--nice={where.nice}")
    if where.gres:
        cmd.append(f"--gres={where.gres}")
    if where.gpus:
        cmd.append(f"--gpus={where.gpus}")
    cmd.append(os.path.join(marker_dir, SCRIPT))
    return cmd


def _root_env() -> dict[str, str]:
    env = {"PATH": FIXED_PATH, "LANG": "C.UTF-8"}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    return env


def _q(path: str) -> str:
    return shlex.quote(path)


def _python() -> str:
    return sys.executable


def _write_owned(path: str, data: bytes, creds: Credentials, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        if os.geteuid() == 0:
            os.fchown(fd, creds.uid, creds.gid)
    finally:
        os.close(fd)


def _read_result(path: str) -> RunResult | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    try:
        return RunResult.from_dict(json.loads(data))
    except (ValueError, TypeError):
        return None


def _read_tail(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return ""
    try:
        data = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()][-3:]
    return " | ".join(lines)[-600:]
