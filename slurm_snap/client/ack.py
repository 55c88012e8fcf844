"""The acknowledgement file a rank writes after its checkpoint is durable.

Shared by both sides of the barrier: the client builds acks with
`build_ack`, the coordinator validates them with `parse_ack` and decides a
node's barrier with `node_barrier_complete`. Pure functions, stdlib only.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from slurm_snap.errors import BadValueError
from slurm_snap.jobdir import ack_filename, check_name  # noqa: F401 (part of the client's API)

ACK_VERSION = 1
MAX_ACK_BYTES = 1 << 20

_SHA256 = re.compile(r"^[0-9a-f]{64}$")

_FIELDS = {
    "version", "job_id", "epoch", "node", "rank", "local_rank", "local_size",
    "step", "written_at", "manifest",
}
_ENTRY_FIELDS = {"path", "size", "sha256"}


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class Ack:
    version: int
    job_id: str
    epoch: str
    node: str
    rank: int
    local_rank: int
    local_size: int
    step: int
    written_at: datetime
    manifest: tuple[ManifestEntry, ...]


def _bad(field: str, value, why: str) -> BadValueError:
    return BadValueError(what=f"acknowledgement field {field!r}", value=value, why=why)


# Ranks and sizes fit the inventory's 32-bit columns, steps its 64-bit one: a
# larger number from a rank must be a clear rejection, not an overflow in the
# coordinator (or a set(range(local_size)) of 10**12 members).
MAX_RANK = 2**31 - 1
MAX_STEP = 2**63 - 1


def _int_field(data: dict, field: str, minimum: int, maximum: int = MAX_RANK) -> int:
    value = data[field]
    # bool is an int subclass; `true` is not a rank.
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(field, value, "expected an integer")
    if value < minimum:
        raise _bad(field, value, f"must be >= {minimum}")
    if value > maximum:
        raise _bad(field, value, f"must be <= {maximum}")
    return value


def _manifest(value) -> tuple[ManifestEntry, ...]:
    if not isinstance(value, list):
        raise _bad("manifest", value, "expected a list")
    entries = []
    for index, item in enumerate(value):
        where = f"manifest[{index}]"
        if not isinstance(item, dict):
            raise _bad(where, item, "expected an object")
        unknown = sorted(set(item) - _ENTRY_FIELDS)
        if unknown:
            raise _bad(where, unknown[0], "unknown key")
        for key in ("path", "size"):
            if key not in item:
                raise _bad(f"{where}.{key}", None, "missing")
        path = item["path"]
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            raise _bad(f"{where}.path", path, "expected an absolute path")
        size = item["size"]
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_STEP:
            raise _bad(f"{where}.size", size, "expected an integer >= 0")
        digest = item.get("sha256")
        if digest is not None and (not isinstance(digest, str) or not _SHA256.match(digest)):
            raise _bad(f"{where}.sha256", digest, "expected 64 lowercase hex digits")
        entries.append(ManifestEntry(path=path, size=size, sha256=digest))
    return tuple(entries)


def parse_ack(raw: bytes, expected_job_id, expected_epoch: str, max_bytes: int = MAX_ACK_BYTES) -> Ack:
    """Validate an ack file's bytes for this job and epoch, or raise
    BadValueError naming the offending value."""
    if len(raw) > max_bytes:
        raise BadValueError(what="acknowledgement", value=f"{len(raw)} bytes",
                            why=f"larger than the limit of {max_bytes} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: a few hundred kB of "[[[[..." nests deeper than the parser goes.
        raise BadValueError(what="acknowledgement", value=bytes(raw[:80]),
                            why=f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadValueError(what="acknowledgement", value=data, why="expected a JSON object")
    missing = sorted(_FIELDS - set(data))
    if missing:
        raise _bad(missing[0], None, "missing")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise _bad(unknown[0], data[unknown[0]], "unknown key")
    version = data["version"]
    if isinstance(version, bool) or version != ACK_VERSION:
        raise _bad("version", version, f"this slurm-snap understands version {ACK_VERSION}")
    job_id = data["job_id"]
    # Other writers may emit the numeric id as a JSON number; normalise to str.
    if isinstance(job_id, bool) or not isinstance(job_id, (str, int)) or str(job_id) == "":
        raise _bad("job_id", job_id, "expected a job id string")
    if str(job_id) != str(expected_job_id):
        raise _bad("job_id", job_id, f"belongs to another job (expected {str(expected_job_id)!r})")
    epoch = data["epoch"]
    if not isinstance(epoch, str):
        raise _bad("epoch", epoch, "expected a string")
    if epoch != expected_epoch:
        raise _bad("epoch", epoch, f"stale or foreign epoch (expected {expected_epoch!r})")
    node = data["node"]
    try:
        check_name("node name", node)
    except BadValueError as exc:
        raise _bad("node", node, exc.kwargs["why"]) from None
    rank = _int_field(data, "rank", 0)
    local_rank = _int_field(data, "local_rank", 0)
    local_size = _int_field(data, "local_size", 1)
    if local_rank >= local_size:
        raise _bad("local_rank", local_rank, f"must be < local_size {local_size}")
    step = _int_field(data, "step", 0, MAX_STEP)
    written_at = data["written_at"]
    try:
        stamp = datetime.fromisoformat(written_at) if isinstance(written_at, str) else None
    except ValueError:
        stamp = None
    if stamp is None or stamp.tzinfo is None:
        raise _bad("written_at", written_at, "expected an ISO 8601 time with a UTC offset")
    return Ack(version=version, job_id=str(job_id), epoch=epoch, node=node, rank=rank,
               local_rank=local_rank, local_size=local_size, step=step, written_at=stamp,
               manifest=_manifest(data["manifest"]))


def build_ack(*, job_id: str, epoch: str, node: str, rank: int, local_rank: int,
              local_size: int, step: int, written_at: datetime,
              manifest: Iterable[ManifestEntry]) -> bytes:
    """Serialise an ack; the inverse of parse_ack."""
    entries = []
    for entry in manifest:
        item = {"path": entry.path, "size": entry.size}
        if entry.sha256 is not None:
            item["sha256"] = entry.sha256
        entries.append(item)
    doc = {
        "version": ACK_VERSION, "job_id": str(job_id), "epoch": epoch, "node": node,
        "rank": rank, "local_rank": local_rank, "local_size": local_size, "step": step,
        "written_at": written_at.isoformat(timespec="microseconds"), "manifest": entries,
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def node_barrier_complete(acks_for_node: Iterable[Ack]) -> bool:
    """True when one node's acks cover local ranks 0..local_size-1, all for the
    same epoch and the same local_size, one distinct rank per local rank."""
    acks = list(acks_for_node)
    if not acks:
        return False
    nodes = {ack.node for ack in acks}
    if len(nodes) > 1:
        raise BadValueError(what="acknowledgements of one node", value=sorted(nodes),
                            why="come from several nodes")
    if len({ack.epoch for ack in acks}) != 1 or len({ack.local_size for ack in acks}) != 1:
        return False
    local_size = acks[0].local_size
    by_local_rank: dict[int, set[int]] = {}
    for ack in acks:
        by_local_rank.setdefault(ack.local_rank, set()).add(ack.rank)
    # Length first: local_size comes from a rank's file and may be huge.
    if len(by_local_rank) != local_size or set(by_local_rank) != set(range(local_size)):
        return False
    # Two different global ranks claiming one local rank means the acks do not
    # describe one consistent layout of this node.
    return all(len(ranks) == 1 for ranks in by_local_rank.values())
