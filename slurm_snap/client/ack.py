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

# Version 2 adds world_size, independent and agreement (lockstep jobs);
# version 1 files (older clients) still parse, with those fields unknown.
ACK_VERSION = 2
ACK_VERSIONS = (1, 2)
MAX_ACK_BYTES = 1 << 20

_SHA256 = re.compile(r"^[0-9a-f]{64}$")

_FIELDS = {
    "version", "job_id", "epoch", "node", "rank", "local_rank", "local_size",
    "step", "written_at", "manifest",
}
_V2_FIELDS = {"world_size", "independent", "agreement", "signalled_at"}
MAX_AGREEMENT = 255
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
    # The launcher's number of ranks (None: the client did not say).
    world_size: int | None = None
    # The job declared that its ranks checkpoint independently: mixed steps
    # are then one consistent point; otherwise they are not.
    independent: bool = False
    # How the step was chosen: "" (no process group), "collective" (all
    # ranks agreed on it), "failed: WHY" (the agreement did not complete).
    agreement: str = ""
    # When this rank's checkpoint signal reached it (None: it never came,
    # the rank joined its peers' checkpoint); the observed request time.
    signalled_at: datetime | None = None


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
    if "version" not in data:
        raise _bad("version", None, "missing")
    version = data["version"]
    if isinstance(version, bool) or version not in ACK_VERSIONS:
        raise _bad("version", version,
                   f"this slurm-snap understands versions {', '.join(map(str, ACK_VERSIONS))}")
    fields = _FIELDS | (_V2_FIELDS if version >= 2 else set())
    missing = sorted(_FIELDS - set(data))
    if missing:
        raise _bad(missing[0], None, "missing")
    unknown = sorted(set(data) - fields)
    if unknown:
        raise _bad(unknown[0], data[unknown[0]], "unknown key")
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
    world_size = None
    if data.get("world_size") is not None:
        world_size = _int_field(data, "world_size", 1)
        if rank >= world_size:
            raise _bad("rank", rank, f"must be < world_size {world_size}")
        if local_size > world_size:
            raise _bad("local_size", local_size, f"must be <= world_size {world_size}")
    independent = data.get("independent", False)
    if not isinstance(independent, bool):
        raise _bad("independent", independent, "expected true or false")
    agreement = data.get("agreement", "")
    if not isinstance(agreement, str) or len(agreement) > MAX_AGREEMENT or not (
            agreement in ("", "collective") or agreement.startswith("failed")):
        raise _bad("agreement", agreement if isinstance(agreement, str) and len(agreement) < 80 else "...",
                   f'expected "", "collective" or "failed: why" (at most {MAX_AGREEMENT} characters)')
    signalled_at = None
    if data.get("signalled_at") is not None:
        raw_at = data["signalled_at"]
        try:
            signalled_at = datetime.fromisoformat(raw_at) if isinstance(raw_at, str) else None
        except ValueError:
            signalled_at = None
        if signalled_at is None or signalled_at.tzinfo is None:
            raise _bad("signalled_at", raw_at, "expected an ISO 8601 time with a UTC offset, or null")
    return Ack(version=version, job_id=str(job_id), epoch=epoch, node=node, rank=rank,
               local_rank=local_rank, local_size=local_size, step=step, written_at=stamp,
               manifest=_manifest(data["manifest"]), world_size=world_size, independent=independent,
               agreement=agreement, signalled_at=signalled_at)


def build_ack(*, job_id: str, epoch: str, node: str, rank: int, local_rank: int,
              local_size: int, step: int, written_at: datetime,
              manifest: Iterable[ManifestEntry], world_size: int | None = None,
              independent: bool = False, agreement: str = "",
              signalled_at: datetime | None = None) -> bytes:
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
        "world_size": world_size, "independent": bool(independent), "agreement": agreement[:MAX_AGREEMENT],
        "signalled_at": signalled_at.isoformat(timespec="microseconds") if signalled_at else None,
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def node_barrier_complete(acks_for_node: Iterable) -> bool:
    """True when one node's acks cover local ranks 0..local_size-1, all with
    the same local_size, one distinct rank per local rank.

    Takes client Acks or inventory AckRecords (anything with node, rank,
    local_rank, local_size): both were checked for this set's epoch when
    they were parsed."""
    acks = list(acks_for_node)
    if not acks:
        return False
    nodes = {ack.node for ack in acks}
    if len(nodes) > 1:
        raise BadValueError(what="acknowledgements of one node", value=sorted(nodes),
                            why="come from several nodes")
    if len({ack.local_size for ack in acks}) != 1:
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
