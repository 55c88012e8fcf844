"""Where a framework callback puts its checkpoints: on a volume the job
declared, so the snapshot holds them.

A checkpoint outside every declared volume is in no snapshot: the set is cut,
labelled app-consistent from the acknowledgements, and the requeued run finds
nothing to resume from. So the directory comes from the job's own
declaration (job.json, written by the Prolog), never from a class name:
  - a shared volume (the first the job declared): every rank reads rank 0's
    checkpoint at resume, so a node-local volume cannot hold it;
  - none: refused, saying why and what to declare (`CheckpointDirError`);
  - in a restore drill (SLURM_SNAP_RESTORE=1): the restored volume that holds
    the directory (SLURM_SNAP_RESTORE_MAP);
  - outside slurm-snap (no job directory: a plain run, a test) the working
    directory: there is nothing to snapshot.
`covered()` says whether a path the program chose itself (Lightning's
default_root_dir, a Trainer's output_dir) is inside a declared volume.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping

from slurm_snap.errors import CheckpointDirError
from slurm_snap.jobrecords import JobRecord

RESTORE_ENV = "SLURM_SNAP_RESTORE"
RESTORE_MAP_ENV = "SLURM_SNAP_RESTORE_MAP"


def choose(job: JobRecord | None, job_id: str | None, subdir: str, env: Mapping[str, str]) -> str:
    """The checkpoint directory `subdir` of the job (see the module's docstring)."""
    if env.get(RESTORE_ENV) == "1":
        return _restored(subdir, env)
    if job is None:
        return os.path.abspath(subdir)
    shared = [v for v in job.volumes if v.scope == "shared"]
    if shared:
        return os.path.join(shared[0].path, subdir)
    if not job.volumes:
        raise CheckpointDirError(job=job_id, why="it declared no volume, so a checkpoint would be in no "
                                 "snapshot: submit with --snapshot-volumes (a shared class or directory)")
    classes = ", ".join(sorted({v.volume_class for v in job.volumes}))
    raise CheckpointDirError(job=job_id, why=f"it declared only node-local volumes ({classes}): every rank "
                             "reads rank 0's checkpoint at resume, so it must be on a shared volume; add one "
                             "to --snapshot-volumes, or give the callback a directory of your own on one")


def _restored(subdir: str, env: Mapping[str, str]) -> str:
    try:
        restored = sorted(set(json.loads(env.get(RESTORE_MAP_ENV) or "{}").values()))
    except (ValueError, AttributeError):
        raise CheckpointDirError(job="(restore drill)", why=f"{RESTORE_MAP_ENV} is not a JSON object") from None
    for path in restored:
        if isinstance(path, str) and os.path.isdir(os.path.join(path, subdir)):
            return os.path.join(path, subdir)
    raise CheckpointDirError(job="(restore drill)",
                             why=f"no restored volume ({', '.join(map(str, restored)) or 'none'}) holds {subdir}/")


def covered(job: JobRecord | None, node: str, path: str) -> bool:
    """`path` is inside one of the job's declared volumes on this node (or a
    shared one); True outside slurm-snap, where nothing is snapshot."""
    if job is None:
        return True
    real = os.path.realpath(path)
    for v in job.volumes:
        if v.scope == "shared" or v.node == node:
            root = os.path.realpath(v.path)
            if os.path.commonpath([real, root]) == root:
                return True
    return False
