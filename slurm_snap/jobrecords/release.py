"""release/<epoch> (ReleaseRecord): the snapshot is cut, the ranks go on."""
from __future__ import annotations


from ..record import record
from .fields import Fields, check_name


@record
class ReleaseRecord:
    """release/<epoch>: the snapshot is cut, the ranks waiting for this epoch go
    on. Its presence is the message; the content says which set and how it
    ended, for a human reading the directory."""

    epoch: str
    set_id: int | None = None
    state: str = ""
    consistency: str = ""

    FILE = "release"

    def to_json(self) -> dict:
        return {"epoch": check_name("epoch", self.epoch), "set_id": self.set_id, "state": self.state,
                "consistency": self.consistency}

    @classmethod
    def parse(cls, data, source: str = "") -> "ReleaseRecord":
        f = Fields(cls.FILE, data, source)
        set_id = f.get("set_id", None)
        return cls(epoch=f.name("epoch", f.get("epoch"), "epoch"),
                   set_id=None if set_id is None else f.integer("set_id", set_id),
                   state=f.string("state", f.get("state", "")),
                   consistency=f.string("consistency", f.get("consistency", "")))
