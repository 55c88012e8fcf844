"""What the per-job files say: one frozen record (slurm_snap.record) per file of the barrier
area, each with ONE parser that names what is wrong and ONE writer; one
module per file here, everything exported from this package.

jobdir.py is the map (where each file lives, its owner and mode, and the safe
reading and writing); this package is the contents. Hooks, protocol, inventory,
service and the rank client all take and give these records; no dict of a
per-job file crosses a package line. Standard library only: the rank client
imports it inside training processes and containers.

    file (jobdir.py)            record (module here)      written by -> read by
    job.json                    JobRecord (job)           Prolog -> ranks (volume paths)
      its "volumes"             VolumeRecord (job)        also the inventory's, cutter's and verdict's volume
    request.json                RequestRecord (request)   coordinator -> ranks (on-demand epoch, deadline)
    release/<epoch>             ReleaseRecord (release)   coordinator, Epilog, repair -> ranks (presence)
    resume.json                 ResumeRecord (resume)     Prolog of a requeued run -> ranks
      its "ranks"               ResumeRank (resume)
    ack/<node>.<rank>.json      Ack (ack)                 rank -> coordinator, Epilog, rank 0, inventory
      its "manifest"            ManifestEntry (ack)
    ack/early-<epoch>.decision  EarlyDecision (early)     rank 0 -> head node's Epilog -> the set's events
    ack/timelimit-<epoch>.request TimeLimitRecord (timelimit)  rank 0 or EpilogSlurmctld -> Epilogs (a
                                                          time-limit set: --snapshot-before-timelimit)
    cut/<epoch>/<node>.json     CutRecord (cut)           Epilog -> the requeued run's head Prolog (when the
      its "parts"               CutPart (cut)               service is away); also a node spool's parts
    prolog/<restart>/<node>     plain text, no record     Prolog -> the job's output (jobdir.write_prolog_done)

The epoch rule (`preempt-<restart count>` at preemption) and the file-name
rule for epochs and node names are in fields.py.

Every record has `parse(data, source="")`, a classmethod taking the decoded
JSON object and raising BadValueError("invalid <file> field '<name>' <value>:
<why> (in <source>)"), and `to_json()`, the object its file holds. Acks come
from a user's process, so `Ack.from_bytes` also bounds and decodes the bytes
before parsing, and `Ack.to_bytes` is what a rank writes.

To add a per-job record (a node-side spool of cut parts, a time-limit record,
a container record...):
  1. here: a module named for its file, holding a frozen @record with
     `parse` built from fields.Fields' checks (one line per field, each
     naming its field) and `to_json`; its names in __all__ below and a line
     in the table above;
  2. in jobdir.py: its file name constant, a line in the layout map, and a
     `write_<name>(record)` / `read_<name>()` pair through `_write`/`_read`
     (owner, mode, no link followed);
  3. a unit test beside tests/unit/test_jobrecords.py: a round trip and one
     bad value per field, each named in the error.
Nothing here may import beyond the standard library, slurm_snap.errors and
slurm_snap.record (tests/unit/test_client_env.py imports the client with the heavy modules blocked).
"""
from slurm_snap.jobrecords.ack import (ACK_VERSION, ACK_VERSIONS, MAX_ACK_BYTES, MAX_AGREEMENT, MAX_RANK, MAX_STEP,
                                       Ack, ManifestEntry)
from slurm_snap.jobrecords.cut import HOOK_TRIGGERS, CutPart, CutRecord
from slurm_snap.jobrecords.early import (EARLY_ASKED, EARLY_DECISIONS, EARLY_FAILED, EARLY_KEPT, EARLY_RELEASED,
                                         EARLY_REQUEUED, EARLY_REQUEUEING, EARLY_WAITED, EarlyDecision)
from slurm_snap.jobrecords.fields import PREEMPT_PREFIX, check_name, is_preempt_epoch, preempt_epoch, preempt_restart
from slurm_snap.jobrecords.job import JobRecord, VolumeRecord
from slurm_snap.jobrecords.release import ReleaseRecord
from slurm_snap.jobrecords.request import RequestRecord
from slurm_snap.jobrecords.resume import ResumeRank, ResumeRecord
from slurm_snap.jobrecords.timelimit import BY_EPILOG, BY_NODE, BY_RANK, SIGNAL_SLACK, TimeLimitRecord

__all__ = [
    "ACK_VERSION", "ACK_VERSIONS", "MAX_ACK_BYTES", "MAX_AGREEMENT", "MAX_RANK", "MAX_STEP", "Ack", "ManifestEntry",
    "HOOK_TRIGGERS", "CutPart", "CutRecord", "EARLY_ASKED", "EARLY_DECISIONS", "EARLY_FAILED", "EARLY_KEPT",
    "EARLY_RELEASED", "EARLY_REQUEUED", "EARLY_REQUEUEING", "EARLY_WAITED", "EarlyDecision", "PREEMPT_PREFIX", "check_name",
    "is_preempt_epoch", "preempt_epoch", "preempt_restart",
    "JobRecord", "VolumeRecord", "ReleaseRecord", "RequestRecord", "ResumeRank",
    "ResumeRecord", "BY_EPILOG", "BY_NODE", "BY_RANK", "SIGNAL_SLACK", "TimeLimitRecord",
]
