"""Who this rank is, from the environment Slurm gives every task.

Pure functions over a mapping (os.environ by default) so they are testable
without Slurm.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_snap.errors import BadValueError

# One entry of Slurm's compressed per-node task count: "2" or "2(x3)".
_TASKS_ENTRY = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(value: str) -> list[int]:
    """Expand Slurm's compressed task counts, e.g. "2(x3),1" -> [2, 2, 2, 1].

    This is the format of SLURM_TASKS_PER_NODE and SLURM_STEP_TASKS_PER_NODE.
    """
    if not isinstance(value, str) or not value.strip():
        raise BadValueError(what="tasks-per-node list", value=value, why="empty")
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_ENTRY.match(item.strip())
        if match is None:
            raise BadValueError(what="tasks-per-node entry", value=item,
                                why="expected N or N(xM), as in '2(x3),1'")
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat < 1:
            raise BadValueError(what="tasks-per-node entry", value=item, why="repeat count must be >= 1")
        # A node listed with 0 tasks has no ranks; it is a real (if odd) state.
        counts.extend([tasks] * repeat)
    return counts


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadValueError(what=f"environment variable {name}", value=raw, why="not an integer") from None
    if value < 0:
        raise BadValueError(what=f"environment variable {name}", value=raw, why="must be >= 0")
    return value


def local_size_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """Number of ranks on this node, or None when Slurm did not say.

    The step's value wins over the job's: a step may use fewer tasks than the
    allocation. SLURM_NODEID is this node's index in that list.
    """
    env = os.environ if env is None else env
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        raw = env.get(name)
        if not raw:
            continue
        counts = parse_tasks_per_node(raw)
        node_id = _int_env(env, "SLURM_NODEID")
        if node_id is None:
            if len(counts) == 1:
                return counts[0]
            raise BadValueError(what=f"environment variable {name}", value=raw,
                                why="lists several nodes but SLURM_NODEID is not set")
        if node_id >= len(counts):
            raise BadValueError(what="environment variable SLURM_NODEID", value=str(node_id),
                                why=f"{name}={raw!r} lists only {len(counts)} node(s)")
        return counts[node_id]
    return None


def int_from_env(name: str, env: Mapping[str, str] | None = None) -> int | None:
    return _int_env(os.environ if env is None else env, name)


def node_name_from_env(env: Mapping[str, str] | None = None) -> str:
    """SLURMD_NODENAME (the Slurm node name, which can differ from the host
    name, e.g. several slurmd on one host); the short host name otherwise."""
    env = os.environ if env is None else env
    name = env.get("SLURMD_NODENAME")
    if name:
        return name
    return os.uname().nodename.split(".")[0]


# torchrun (torch.distributed.elastic) gives each worker these; under
# `srun torchrun` Slurm's own SLURM_PROCID/SLURM_LOCALID describe the agent,
# one per node, so every worker would claim to be local rank 0 of 1.
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")


@dataclass(frozen=True)
class Identity:
    """Who this process is among the job's ranks, and who the launcher says
    must answer: `local_size` ranks on this node, `world_size` in all
    (None when the launcher did not say)."""

    rank: int
    local_rank: int
    local_size: int
    world_size: int | None
    launcher: str          # "torchrun", "slurm" or "" (nothing known: a lone process)


def identity_from_env(env: Mapping[str, str] | None = None) -> Identity:
    """The launcher's view of this rank. torchrun's variables win when all
    four are set (they describe the workers, Slurm's the agent); otherwise
    Slurm's task variables; otherwise a lone process (rank 0 of 1)."""
    env = os.environ if env is None else env
    if all(env.get(name) not in (None, "") for name in TORCHRUN_VARS):
        rank, local_rank, local_size, world = (_int_env(env, name) for name in TORCHRUN_VARS)
        launcher = "torchrun"
    else:
        rank = _int_env(env, "SLURM_PROCID")
        local_rank = _int_env(env, "SLURM_LOCALID")
        local_size = local_size_from_env(env)
        # The step's task count (srun sets it for each task), not the job's
        # SLURM_NTASKS: a step may use fewer tasks, and a program run
        # straight from the batch script is one process, not the job's N.
        world = _int_env(env, "SLURM_STEP_NUM_TASKS")
        launcher = "slurm" if rank is not None else ""
    ident = Identity(rank=rank or 0, local_rank=local_rank or 0, local_size=local_size or 1,
                     world_size=world, launcher=launcher)
    check_identity(ident)
    return ident


def check_identity(ident: Identity) -> None:
    if ident.local_size < 1 or ident.local_rank >= ident.local_size:
        raise BadValueError(what="local rank", value=ident.local_rank,
                            why=f"must be in 0..{ident.local_size - 1} (local size {ident.local_size})")
    if ident.world_size is not None:
        if ident.world_size < 1 or ident.rank >= ident.world_size:
            raise BadValueError(what="rank", value=ident.rank,
                                why=f"must be in 0..{ident.world_size - 1} (world size {ident.world_size})")
        if ident.local_size > ident.world_size:
            raise BadValueError(what="local size", value=ident.local_size,
                                why=f"larger than the world size {ident.world_size}")
