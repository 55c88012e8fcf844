"""The job as the hooks see it: read from the environment Slurm gives
Prolog/Epilog/PrologSlurmctld/EpilogSlurmctld and from the SPANK job-control
variables our plugin set at submit time (docs/contracts.md)."""
from __future__ import annotations

import os

from ..record import factory, record
from ..access import user_name
from ..errors import BadValueError
from ..states import WANT_APP
from . import hostlist

# A run's SLUID (Slurm 25.11+, SLURM_JOB_SLUID in Prolog/Epilog and the
# slurmctld hooks): "s" and 13 characters of Crockford's base32, unique on the
# cluster where job ids are reused after MaxJobId. A requeued run gets a new
# one (measured on 25.11.7: s2DHM8XNAZKH00, then s2DHM8XNBZDA00), so it names
# one run, as JOBID.RESTART does, not the job. Checked without `re`, which
# the hooks' start path does not import (issue 36).
SLUID_DIGITS = frozenset("0123456789ABCDEFGHJKMNPQRSTVWXYZ")


def is_sluid(text: str) -> bool:
    return len(text) == 14 and text[0] == "s" and all(c in SLUID_DIGITS for c in text[1:])


SPANK = "SPANK_SLURM_SNAP"
# Slurm job ids, uids, gids and restart counts are uint32_t: a larger number is
# not Slurm's and would overflow the inventory's integer columns.
MAX_ID = 2**32 - 1


@record
class JobEnv:
    job_id: int
    restart_count: int
    uid: int
    gid: int
    user: str
    partition: str
    nodes: tuple[str, ...]
    node: str  # this hook's node; "" in the slurmctld hooks
    opted_in: bool
    on_preempt: bool
    volumes: tuple[str, ...]
    consistency: str
    resume_cmd: str
    exit_code: int | None = None
    # --snapshot-every in seconds; None: the job did not ask.
    every: int | None = None
    # "" before 25.11 (or when Slurm's value is not a SLUID).
    sluid: str = ""
    # --snapshot-before-timelimit's margin in seconds; None: the job did not ask.
    timelimit: int | None = None
    # --snapshot-drill: the restore test this job is the drill of (restore/onnode.py);
    # None for every job a user submits to be protected.
    drill: int | None = None
    extra: dict = factory(dict)

    @property
    def head_node(self) -> str:
        return self.nodes[0] if self.nodes else self.node

    def options(self) -> dict:
        return {"on_preempt": self.on_preempt, "volumes": list(self.volumes),
                "consistency": self.consistency, "resume_cmd": self.resume_cmd, "every": self.every,
                "before_timelimit": self.timelimit}


def _int(env, key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        if default is None:
            raise BadValueError(what=f"hook environment variable {key}", value=raw, why="missing")
        return default
    # isascii: str.isdigit() also accepts other scripts' digits ("١٢" would read as 12).
    if not (raw.isascii() and raw.isdigit()):
        raise BadValueError(what=f"hook environment variable {key}", value=raw, why="not a number")
    if int(raw) > MAX_ID:
        raise BadValueError(what=f"hook environment variable {key}", value=raw, why=f"larger than {MAX_ID}")
    return int(raw)


def from_environ(env=None) -> JobEnv:
    env = os.environ if env is None else env
    uid = _int(env, "SLURM_JOB_UID")
    user = env.get("SLURM_JOB_USER") or user_name(uid)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    vols = env.get(f"{SPANK}_VOLUMES", "")
    return JobEnv(
        job_id=_int(env, "SLURM_JOB_ID"),
        restart_count=_int(env, "SLURM_JOB_RESTART_COUNT", 0) if "SLURM_JOB_RESTART_COUNT" in env
        else _int(env, "SLURM_RESTART_COUNT", 0),
        uid=uid,
        gid=_int(env, "SLURM_JOB_GID", 0),
        user=user,
        partition=env.get("SLURM_JOB_PARTITION", ""),
        nodes=tuple(hostlist.expand(nodelist)) if nodelist else (),
        node=env.get("SLURMD_NODENAME", ""),
        opted_in=env.get(SPANK) == "1",
        on_preempt=env.get(f"{SPANK}_ON_PREEMPT") == "1",
        volumes=tuple(v for v in vols.split(",") if v) if vols else (),
        consistency=env.get(f"{SPANK}_CONSISTENCY") or WANT_APP,
        resume_cmd=env.get(f"{SPANK}_RESUME_CMD", ""),
        exit_code=int(env["SLURM_JOB_EXIT_CODE"]) if env.get("SLURM_JOB_EXIT_CODE", "").isdigit() else None,
        every=_seconds(env.get(f"{SPANK}_EVERY", ""), "--snapshot-every"),
        timelimit=_seconds(env.get(f"{SPANK}_TIMELIMIT", ""), "--snapshot-before-timelimit"),
        sluid=env.get("SLURM_JOB_SLUID", "") if is_sluid(env.get("SLURM_JOB_SLUID", "")) else "",
        drill=_int(env, f"{SPANK}_DRILL") if env.get(f"{SPANK}_DRILL") else None,
    )


def _seconds(raw: str, option: str) -> int | None:
    if not raw:
        return None
    from .duration import seconds

    return int(seconds(raw, what=option))

