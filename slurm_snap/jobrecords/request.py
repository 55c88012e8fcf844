"""request.json (RequestRecord): an on-demand snapshot's epoch and deadline."""
from __future__ import annotations

from ..record import record
from .fields import Fields, iso, check_name

TYPE_CHECKING = False   # annotations only: datetime's import costs every opted-in Prolog ~2 ms
if TYPE_CHECKING:
    from datetime import datetime


@record
class RequestRecord:
    """request.json: an on-demand snapshot's epoch, written before the signal,
    always with a deadline (docs/client.md)."""

    job_id: str
    epoch: str
    requested_at: datetime | None = None
    deadline: datetime | None = None

    FILE = "request.json"

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "epoch": check_name("epoch", self.epoch),
                "requested_at": iso(self.requested_at), "deadline": iso(self.deadline)}

    @classmethod
    def parse(cls, data, source: str = "", *, job_id: str | None = None) -> "RequestRecord":
        """`job_id`, when given, is the job whose directory holds the file."""
        f = Fields(cls.FILE, data, source)
        owner, epoch = f.get("job_id"), f.get("epoch")
        if job_id is not None and str(owner) != job_id:
            raise f.bad("job_id", owner, f"belongs to another job (expected {job_id!r})")
        at, deadline = f.get("requested_at", None), f.get("deadline", None)
        return cls(job_id=str(owner), epoch=f.name("epoch", epoch, "epoch"),
                   requested_at=None if at is None else f.moment("requested_at", at),
                   deadline=None if deadline is None else f.moment("deadline", deadline))

    def is_live(self, now: float) -> bool:
        """Not yet past its deadline (Unix seconds `now`)."""
        return self.deadline is None or self.deadline.timestamp() >= now
