"""`restore-test --submit`: run the drilled command as a Slurm job of its owner.

Root (the CLI) makes the clones; the command then runs where Slurm puts it,
as the job's owner, under Slurm's limits: sbatch is executed *as the owner*
(munge authenticates that uid, so no `--uid` and no root job), with a batch
script that only names fixed paths (no user input in any shell text):

    #!/bin/sh
    exec <python> -m slurm_snap.restore.injob <marker_dir>/spec.json

The in-job runner (restore/injob.py) runs the argv from spec.json with the
same watcher as a local drill and writes result.json next to it. The CLI waits
for the Slurm job to leave the queue, reads the result and cleans up. The
namespace must be visible at the same path on the compute node.

A drill placed on other nodes gets exactly those nodes (--nodelist, one task
per node); the in-job runner starts the command on the first of them with
the job's SLURM_* variables, so a command that launches its ranks with srun
(as the job's own batch script did) starts one on each.
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


class SlurmSubmitter:
    def __init__(self, cfg, *, queue_timeout: float = 600.0, poll: float = 1.0, partition: str | None = None,
                 python: str | None = None):
        self.cfg = cfg
        self.queue_timeout = queue_timeout
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

    def submit(self, *, argv, env, marker_dir, marker_file, deadline, owner, creds, job_name,
               nodes: list[str] | None = None) -> int:
        spec = {"argv": list(argv), "env": dict(env), "cwd": marker_dir, "marker_file": marker_file,
                "deadline": deadline, "result": os.path.join(marker_dir, RESULT)}
        _write_owned(os.path.join(marker_dir, SPEC), json.dumps(spec).encode(), creds, 0o600)
        script = f"#!/bin/sh\nexec {_q(self.python)} -m slurm_snap.restore.injob {_q(os.path.join(marker_dir, SPEC))}\n"
        _write_owned(os.path.join(marker_dir, SCRIPT), script.encode(), creds, 0o700)
        minutes = max(1, math.ceil((deadline + 60) / 60))
        cmd = [tool("sbatch"), "--parsable", f"--job-name={job_name}", f"--time={minutes}", f"--chdir={marker_dir}",
               f"--output={os.path.join(marker_dir, 'slurm-%j.out')}"]
        if nodes:
            cmd += [f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}", "--ntasks-per-node=1"]
        else:
            cmd += ["--nodes=1", "--ntasks=1"]
        if self.partition:
            cmd.append(f"--partition={self.partition}")
        cmd.append(os.path.join(marker_dir, SCRIPT))
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

    def run(self, *, argv, env, marker_dir, marker_file, deadline, owner, creds, job_name,
            on_submitted=None, nodes: list[str] | None = None) -> RunResult:
        job_id = self.submit(argv=argv, env=env, marker_dir=marker_dir, marker_file=marker_file,
                             deadline=deadline, owner=owner, creds=creds, job_name=job_name, nodes=nodes)
        if on_submitted:
            on_submitted(job_id)
        end = time.monotonic() + self.queue_timeout + deadline + 30
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
            return RunResult(started=last == "RUNNING", timed_out=True,
                             error=f"deadline: Slurm job {job_id} did not finish within "
                                   f"{self.queue_timeout + deadline:g} s (last state {last})")
        return self.result(job_id, marker_dir, last)


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
