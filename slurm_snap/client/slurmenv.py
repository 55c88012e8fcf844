"""Who this rank is, from the environment Slurm gives every task.

Pure functions over a mapping (os.environ by default) so they are testable
without Slurm.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping

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
