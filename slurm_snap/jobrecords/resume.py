"""resume.json (ResumeRecord, ResumeRank): where a requeued run resumes from."""
from __future__ import annotations


from ..record import record
from .fields import Fields


@record
class ResumeRank:
    """Where one rank of the requeued run finds its checkpoint."""

    rank: int
    node: str                 # where it runs now
    from_node: str            # where it acknowledged
    live: str                 # its checkpoint's live path
    checkpoint: str | None    # that checkpoint inside the snapshot on `node`, or None
    missing: str = ""         # why it is not there ("" when it is)

    def to_json(self) -> dict:
        return {"node": self.node, "from": self.from_node, "live": self.live, "checkpoint": self.checkpoint,
                "missing": self.missing}


@record
class ResumeRecord:
    """resume.json: where a requeued run resumes from (protocol/resume.py
    computes it on the controller for the head node's Prolog).

    `live`/`snapshot` are rank 0's checkpoint (kept for older readers), at
    least one of them set; `ranks` one entry per rank; `missing` one line per
    part the run starts without ("ranks" and "missing" are empty in files
    written before they existed)."""

    set_id: int | str
    step: int
    live: str | None
    snapshot: str | None
    ranks: tuple[ResumeRank, ...] = ()
    missing: tuple[str, ...] = ()

    FILE = "resume.json"

    def to_json(self) -> dict:
        """The file's object; also what Checkpointer.resume_info() returns."""
        return {"set_id": self.set_id, "step": self.step,
                "checkpoint": {"live": self.live, "snapshot": self.snapshot},
                "ranks": {str(r.rank): r.to_json() for r in self.ranks}, "missing": list(self.missing)}

    def rank(self, rank: int) -> ResumeRank | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    @classmethod
    def parse(cls, data, source: str = "") -> "ResumeRecord":
        f = Fields(cls.FILE, data, source)
        for field in ("set_id", "step", "checkpoint"):
            f.get(field)
        set_id = f.get("set_id")
        if isinstance(set_id, bool) or not isinstance(set_id, (str, int)) or set_id == "":
            raise f.bad("set_id", set_id, "expected a string or integer")
        step = f.integer("step", f.get("step"))
        checkpoint = f.get("checkpoint")
        if not isinstance(checkpoint, dict):
            raise f.bad("checkpoint", checkpoint, "expected an object")
        live = f.abs_path("checkpoint.live", checkpoint.get("live"), null=True)
        snapshot = f.abs_path("checkpoint.snapshot", checkpoint.get("snapshot"), null=True)
        if live is None and snapshot is None:
            raise f.bad("checkpoint", checkpoint, "names neither a live nor a snapshot path")
        ranks = f.get("ranks", None) or {}
        if not isinstance(ranks, dict):
            raise f.bad("ranks", ranks, "expected an object")
        out = []
        for key, entry in ranks.items():
            where = f"ranks.{key}"
            if not isinstance(entry, dict) or not str(key).isdigit():
                raise f.bad(where, entry, "expected an object under a rank number")
            for field in ("node", "from", "live", "missing"):
                if not isinstance(entry.get(field, ""), str):
                    raise f.bad(f"{where}.{field}", entry[field], "expected a string")
            out.append(ResumeRank(rank=int(key), node=entry.get("node", ""), from_node=entry.get("from", ""),
                                  live=entry.get("live", ""),
                                  checkpoint=f.abs_path(f"{where}.checkpoint", entry.get("checkpoint"), null=True),
                                  missing=entry.get("missing", "")))
        missing = f.get("missing", None) or []
        if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
            raise f.bad("missing", missing, "expected a list of strings")
        return cls(set_id=set_id, step=step, live=live, snapshot=snapshot, ranks=tuple(out), missing=tuple(missing))
