"""Slurm's own commands, run with an argv, absolute paths and a timeout.

22.05 has no pyslurm build on PyPI, so this is the access layer. Hooks get no
PATH, so commands are looked up in fixed directories, never through PATH.
"""
from __future__ import annotations

import os

from .. import spawn
from ..errors import CommandFailed, NotFound, Timeout, ToolMissing
from ..record import record

_BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin")
_SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Where Slurm's commands look without SLURM_CONF (Debian's and upstream's build default).
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


def adopt_conf(conf: str) -> None:
    """Give this process's Slurm commands the cluster's slurm.conf when the
    environment names none: the slurmctld hooks get no SLURM_CONF (a node's
    slurmd passes its own, which then wins), nor does a sudo'ed command."""
    if conf and not os.environ.get("SLURM_CONF"):
        os.environ["SLURM_CONF"] = conf


def adopt_bin_dir(bin_dir: str) -> None:
    """Look for Slurm's commands in `bin_dir` first ([slurm] bin_dir): a Slurm
    installed under its own prefix (/opt/slurm-24.11/bin beside Debian's
    22.05 in /usr/bin) must not be answered by the other version's client,
    which the controller refuses. The environment carries it to child helpers."""
    if bin_dir and not os.environ.get("SLURM_SNAP_SLURM_BIN"):
        os.environ["SLURM_SNAP_SLURM_BIN"] = bin_dir


def effective_conf() -> str:
    return os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF


def tool(name: str) -> str:
    override = os.environ.get(f"SLURM_SNAP_{name.upper()}")
    if override:
        return override
    first = os.environ.get("SLURM_SNAP_SLURM_BIN", "")
    for d in ((first,) if os.path.isabs(first) else ()) + _BIN_DIRS:
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    import shutil

    found = shutil.which(name, path=_SAFE_PATH)
    if not found:
        raise ToolMissing(backend="slurm", tool=name)
    return found


def run(argv: list[str], timeout: float = 10.0, env: dict | None = None) -> str:
    full_env = {"PATH": _SAFE_PATH, "LC_ALL": "C"}
    if "SLURM_CONF" in os.environ:
        full_env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    full_env.update(env or {})
    try:
        status, out, err = spawn.run(argv, full_env, timeout)
    except spawn.Expired:
        raise Timeout(what=os.path.basename(argv[0]), seconds=timeout) from None
    if status != 0:
        raise CommandFailed(argv0=os.path.basename(argv[0]), status=status,
                            stderr=err.decode(errors="replace").strip()[-500:])
    return out.decode(errors="replace")


@record
class JobInfo:
    job_id: int
    user: str
    uid: int
    state: str
    restart_count: int
    preempt_time: int  # epoch seconds; 0 when never preempted
    nodes: str
    partition: str
    batch_host: str
    # Why the job is in its state: "TimeLimit" once it reached its time limit
    # (until it is requeued); its end, epoch seconds (0: not known).
    state_reason: str = ""
    end_time: int = 0


def squeue_job(job_id: int, timeout: float = 10.0) -> JobInfo:
    """The job's current record. -j is given always: 24.11 answers with that
    job alone, 22.05 ignores it with --json and prints every job (measured),
    so the job is picked out here either way."""
    argv = [tool("squeue"), "--json", "-j", str(int(job_id))]
    try:
        out = run(argv, timeout=timeout)
    except CommandFailed as exc:
        # 24.11 with -j on a job slurmctld has forgotten: exit 1, "Invalid job id".
        if "Invalid job id" in exc.kwargs.get("stderr", ""):
            raise NotFound(what="Slurm job", value=str(job_id)) from None
        raise
    info = job_from_json(out, job_id)
    if info is None:
        raise NotFound(what="Slurm job", value=str(job_id))
    return info


def job_from_json(text: str, job_id: int) -> JobInfo | None:
    # Here, not at the top: every hook imports this module (adopt_conf), few parse squeue.
    import json

    from . import version

    for job in json.loads(text).get("jobs", []):
        if int(job.get("job_id", -1)) == int(job_id):
            return JobInfo(
                job_id=int(job["job_id"]), user=str(job.get("user_name", "")), uid=int(job.get("user_id", -1)),
                state=version.json_state(job.get("job_state", "")),
                restart_count=version.json_number(job.get("restart_cnt", 0)),
                preempt_time=version.json_number(job.get("preempt_time", 0)), nodes=str(job.get("nodes", "")),
                partition=str(job.get("partition", "")), batch_host=str(job.get("batch_host", "")),
                state_reason=str(job.get("state_reason", "")), end_time=version.json_number(job.get("end_time", 0)),
            )
    return None


def running_jobs(timeout: float = 10.0) -> dict[int, int]:
    """Job id -> restart count of every RUNNING job, from one squeue call
    (the schedule runner's one question to Slurm per pass)."""
    # As -j above: 22.05 ignores -t with --json, 24.11 honours it; the state
    # is checked here either way.
    out = run([tool("squeue"), "--json", "-t", "RUNNING"], timeout=timeout)
    return running_from_json(out)


def running_from_json(text: str) -> dict[int, int]:
    import json

    from . import version

    running = {}
    for job in json.loads(text).get("jobs", []):
        if "RUNNING" in version.json_states(job.get("job_state", "")):
            running[int(job["job_id"])] = version.json_number(job.get("restart_cnt", 0))
    return running


def signal_job(job_id: int, signal_name: str, timeout: float = 10.0) -> None:
    """One call delivers the signal to every task on every node (not per node)."""
    sig = signal_name.removeprefix("SIG")
    run([tool("scancel"), f"--signal={sig}", str(int(job_id))], timeout=timeout)


def requeue_job(job_id: int, timeout: float = 10.0) -> None:
    """`scontrol requeue JOB`: pending again with the same id (also a job that
    ended TIMEOUT, until slurmctld forgets it after MinJobAge)."""
    run([tool("scontrol"), "requeue", str(int(job_id))], timeout=timeout)


def show_config(timeout: float = 10.0) -> dict[str, str]:
    out = run([tool("scontrol"), "show", "config"], timeout=timeout)
    cfg = {}
    for line in out.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            cfg[k.strip()] = v.strip()
    return cfg


def show_partitions(timeout: float = 10.0) -> list[dict[str, str]]:
    out = run([tool("scontrol"), "show", "partition", "-o"], timeout=timeout)
    parts = []
    for line in out.splitlines():
        rec = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                rec[k] = v
        if rec:
            parts.append(rec)
    return parts


def job_gres(job_id: int, timeout: float = 10.0) -> dict[str, str]:
    """The generic resources a job asked for, as sbatch would be asked again
    (its restore drills run with them): {"gres": "gpu:2", "gpus": "4"}, empty
    when it asked for none. One `scontrol show job`, by the recording
    PrologSlurmctld, which runs after the launch."""
    return gres_from_show_job(run([tool("scontrol"), "show", "job", "-o", str(job_id)], timeout=timeout))


def gres_from_show_job(text: str) -> dict[str, str]:
    """TresPerNode=gres:gpu:2 (22.05; gres/gpu:2 later) -> {"gres": "gpu:2"};
    TresPerJob=gres:gpu:4 -> {"gpus": "4"}."""
    fields = dict(tok.split("=", 1) for tok in text.split() if "=" in tok)

    def gres_items(value: str) -> list[str]:
        return [item[5:] for item in value.split(",") if item.startswith(("gres:", "gres/"))]

    out = {}
    per_node = gres_items(fields.get("TresPerNode", ""))
    if per_node:
        out["gres"] = ",".join(per_node)
    gpus = [i.rsplit(":", 1)[-1] for i in gres_items(fields.get("TresPerJob", "")) if i.startswith("gpu")]
    if gpus and gpus[0].isdigit():
        out["gpus"] = gpus[0]
    return out


def node_names(timeout: float = 10.0) -> list[str]:
    """Every node Slurm knows, once each, in sinfo's order."""
    out = run([tool("sinfo"), "-h", "-N", "-o", "%N"], timeout=timeout)
    return list(dict.fromkeys(n.strip() for n in out.splitlines() if n.strip()))


def node_states(timeout: float = 10.0) -> dict[str, tuple[str, str]]:
    """node -> (state as sinfo prints it, e.g. "drained", "down*"; the admin's
    or slurmd's reason). One sinfo call; a node in several partitions once."""
    out = run([tool("sinfo"), "-h", "-N", "-o", "%N|%T|%E"], timeout=timeout)
    states: dict[str, tuple[str, str]] = {}
    for line in out.splitlines():
        node, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if node.strip():
            states.setdefault(node.strip(), (state.strip(), "" if reason.strip() == "none" else reason.strip()))
    return states
