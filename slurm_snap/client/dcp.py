"""torch.distributed.checkpoint (DCP) with slurm-snap: which files a rank
acknowledges. Standard library only (DCP's on-disk names are the contract).

DCP's FileSystemWriter writes each rank's shards as `__<rank>_<n>.distcp` in
the checkpoint directory and the coordinator rank (0 unless the program
chose another) writes `.metadata` once every rank's shards are done. A
rank acknowledges exactly its own files, so a node's barrier says that rank's
shards are durable, and the coordinator's acknowledgement covers the metadata:

    fut = dcp.async_save(state, checkpoint_id=step_dir)
    ckpt.commit_async(step, fut, lambda: shard_files(step_dir, ckpt.rank))
    ckpt.wait_for_release(60)       # waits for the save and the ack first
"""
from __future__ import annotations

import os
import re

from slurm_snap.errors import NotFound

_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
METADATA = ".metadata"


def shard_files(directory: str, rank: int, coordinator_rank: int = 0) -> list[str]:
    """The files of `directory` that rank `rank` wrote (its shards, plus the
    metadata for the coordinator rank), sorted. A coordinator without its
    metadata is a save that did not finish: NotFound."""
    directory = os.path.abspath(directory)
    names = sorted(os.listdir(directory))
    files = [os.path.join(directory, n) for n in names if (m := _SHARD.match(n)) and int(m.group(1)) == rank]
    if rank == coordinator_rank:
        meta = os.path.join(directory, METADATA)
        if not os.path.isfile(meta):
            raise NotFound(what="DCP metadata", value=meta)
        files.append(meta)
    return files
