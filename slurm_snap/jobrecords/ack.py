"""ack/<node>.<rank>.json (Ack, ManifestEntry): a rank's acknowledgement that
its checkpoint is durable, one type from the file to the inventory's row."""
from __future__ import annotations

import os

from ..errors import BadValueError
from ..record import record, replace
from .fields import Fields, iso

TYPE_CHECKING = False   # annotations only: datetime's import costs every opted-in Prolog ~2 ms
if TYPE_CHECKING:
    from datetime import datetime


# Version 2 adds world_size, independent, agreement and signalled_at (lockstep
# jobs, early release); version 1 files (older clients) still parse, with
# those fields unknown.
ACK_VERSION = 2
ACK_VERSIONS = (1, 2)
MAX_ACK_BYTES = 1 << 20
MAX_AGREEMENT = 255
# Ranks and sizes fit the inventory's 32-bit columns, steps its 64-bit one: a
# larger number from a rank must be a clear rejection, not an overflow in the
# coordinator (or a set(range(local_size)) of 10**12 members).
MAX_RANK = 2**31 - 1
MAX_STEP = 2**63 - 1

_HEX = frozenset("0123456789abcdef")
_ACK_FIELDS = ("version", "job_id", "epoch", "node", "rank", "local_rank", "local_size", "step", "written_at",
               "manifest")
_ACK_V2_FIELDS = ("world_size", "independent", "agreement", "signalled_at")
_ENTRY_FIELDS = ("path", "size", "sha256")


@record
class ManifestEntry:
    """One file a rank's checkpoint consists of, as it was when acknowledged."""

    path: str
    size: int
    sha256: str | None = None

    def to_json(self) -> dict:
        return {"path": self.path, "size": self.size, **({"sha256": self.sha256} if self.sha256 else {})}


@record
class Ack:
    """One rank's acknowledgement: its checkpoint of `step` is durable. The
    same record from the file to the inventory's row to the verdict.

    `world_size` is the launcher's number of ranks (None: the client did not
    say). `independent`: the job declared that its ranks checkpoint
    independently, so mixed steps are one consistent point. `agreement` says
    how the step was chosen: "" (no process group), "collective" (all ranks
    agreed on it), "failed: WHY" (the agreement did not complete).
    `signalled_at` is when this rank's checkpoint signal reached it (None: it
    never came, the rank joined its peers' checkpoint, or an older client).
    `seen_at` is the reader's, not the rank's: when the coordinator or a hook
    first saw the file (an upper bound of the barrier's time; None while it
    is being recorded now). `version` is the file's (None: read back from the
    inventory, which does not keep it)."""

    node: str
    rank: int
    local_rank: int
    local_size: int
    step: int
    written_at: datetime
    manifest: tuple[ManifestEntry, ...] = ()
    world_size: int | None = None
    independent: bool = False
    agreement: str = ""
    signalled_at: datetime | None = None
    job_id: str = ""
    epoch: str = ""
    version: int | None = ACK_VERSION
    seen_at: datetime | None = None

    LABEL = "acknowledgement"

    @property
    def agreement_failed(self) -> bool:
        return self.agreement.startswith("failed")

    def seen(self, at: datetime | None) -> "Ack":
        return replace(self, seen_at=at)

    def to_json(self) -> dict:
        """The file's object (always the current version; `seen_at` is not in it)."""
        return {
            "version": ACK_VERSION, "job_id": str(self.job_id), "epoch": self.epoch, "node": self.node,
            "rank": self.rank, "local_rank": self.local_rank, "local_size": self.local_size, "step": self.step,
            "written_at": iso(self.written_at), "manifest": [e.to_json() for e in self.manifest],
            "world_size": self.world_size, "independent": bool(self.independent),
            "agreement": self.agreement[:MAX_AGREEMENT], "signalled_at": iso(self.signalled_at),
        }

    def to_bytes(self) -> bytes:
        """What a rank writes to ack/<node>.<rank>.json."""
        import json  # here: the hooks import this module and never write an ack

        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes, job_id, epoch: str, max_bytes: int = MAX_ACK_BYTES) -> "Ack":
        """An ack file's bytes for this job and epoch, bounded before decoding."""
        if len(raw) > max_bytes:
            raise BadValueError(what=cls.LABEL, value=f"{len(raw)} bytes",
                                why=f"larger than the limit of {max_bytes} bytes")
        import json

        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            # RecursionError: a few hundred kB of "[[[[..." nests deeper than the parser goes.
            raise BadValueError(what=cls.LABEL, value=bytes(raw[:80]), why=f"not valid JSON: {exc}") from None
        return cls.parse(data, job_id=job_id, epoch=epoch)

    @classmethod
    def parse(cls, data, source: str = "", *, job_id=None, epoch: str | None = None) -> "Ack":
        """`job_id` and `epoch`, when given, are what the reader expects: another
        job's or another epoch's acknowledgement is refused by name."""
        f = Fields(cls.LABEL, data, source)
        version = f.get("version")
        if isinstance(version, bool) or version not in ACK_VERSIONS:
            raise f.bad("version", version, f"this slurm-snap understands versions {', '.join(map(str, ACK_VERSIONS))}")
        for field in sorted(_ACK_FIELDS):
            f.get(field)
        f.only(_ACK_FIELDS + (_ACK_V2_FIELDS if version >= 2 else ()))
        owner = data["job_id"]
        # Other writers may emit the numeric id as a JSON number; normalise to str.
        if isinstance(owner, bool) or not isinstance(owner, (str, int)) or str(owner) == "":
            raise f.bad("job_id", owner, "expected a job id string")
        if job_id is not None and str(owner) != str(job_id):
            raise f.bad("job_id", owner, f"belongs to another job (expected {str(job_id)!r})")
        got_epoch = f.string("epoch", data["epoch"])
        if epoch is not None and got_epoch != epoch:
            raise f.bad("epoch", got_epoch, f"stale or foreign epoch (expected {epoch!r})")
        node = f.name("node", data["node"], "node name")
        rank = f.integer("rank", data["rank"], 0, MAX_RANK)
        local_rank = f.integer("local_rank", data["local_rank"], 0, MAX_RANK)
        local_size = f.integer("local_size", data["local_size"], 1, MAX_RANK)
        if local_rank >= local_size:
            raise f.bad("local_rank", local_rank, f"must be < local_size {local_size}")
        step = f.integer("step", data["step"], 0, MAX_STEP)
        written_at = f.aware("written_at", data["written_at"])
        world_size = None
        if data.get("world_size") is not None:
            world_size = f.integer("world_size", data["world_size"], 1, MAX_RANK)
            if rank >= world_size:
                raise f.bad("rank", rank, f"must be < world_size {world_size}")
            if local_size > world_size:
                raise f.bad("local_size", local_size, f"must be <= world_size {world_size}")
        independent = data.get("independent", False)
        if not isinstance(independent, bool):
            raise f.bad("independent", independent, "expected true or false")
        agreement = data.get("agreement", "")
        if not isinstance(agreement, str) or len(agreement) > MAX_AGREEMENT or not (
                agreement in ("", "collective") or agreement.startswith("failed")):
            raise f.bad("agreement", agreement if isinstance(agreement, str) and len(agreement) < 80 else "...",
                        f'expected "", "collective" or "failed: why" (at most {MAX_AGREEMENT} characters)')
        signalled_at = None
        if data.get("signalled_at") is not None:
            signalled_at = f.aware("signalled_at", data["signalled_at"],
                                   why="expected an ISO 8601 time with a UTC offset, or null")
        return cls(node=node, rank=rank, local_rank=local_rank, local_size=local_size, step=step,
                   written_at=written_at, manifest=_manifest(f, data["manifest"]), world_size=world_size,
                   independent=independent, agreement=agreement, signalled_at=signalled_at, job_id=str(owner),
                   epoch=got_epoch, version=version)


def _manifest(f: Fields, value) -> tuple[ManifestEntry, ...]:
    if not isinstance(value, list):
        raise f.bad("manifest", value, "expected a list")
    entries = []
    for index, item in enumerate(value):
        where = f"manifest[{index}]"
        if not isinstance(item, dict):
            raise f.bad(where, item, "expected an object")
        unknown = sorted(set(item) - set(_ENTRY_FIELDS))
        if unknown:
            raise f.bad(where, unknown[0], "unknown key")
        for key in ("path", "size"):
            if key not in item:
                raise f.bad(f"{where}.{key}", None, "missing")
        path = item["path"]
        if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
            raise f.bad(f"{where}.path", path, "expected an absolute path")
        size = item["size"]
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_STEP:
            raise f.bad(f"{where}.size", size, "expected an integer >= 0")
        digest = item.get("sha256")
        if digest is not None and (not isinstance(digest, str) or len(digest) != 64
                                   or not _HEX.issuperset(digest)):
            raise f.bad(f"{where}.sha256", digest, "expected 64 lowercase hex digits")
        entries.append(ManifestEntry(path=path, size=size, sha256=digest))
    return tuple(entries)
