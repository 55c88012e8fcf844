"""What every per-job record is built from: the epoch and file-name rules,
and the field checks whose errors name the file, the field and the value."""
from __future__ import annotations

import os

from ..errors import BadValueError

TYPE_CHECKING = False   # annotations only: datetime's import costs every opted-in Prolog ~2 ms
if TYPE_CHECKING:
    from datetime import datetime


# At preemption nobody writes a request: the ranks and the hooks both call the
# epoch preempt-<restart count of the run being preempted> (docs/client.md).
PREEMPT_PREFIX = "preempt-"


def preempt_epoch(restart_count: int) -> str:
    return f"{PREEMPT_PREFIX}{int(restart_count)}"


def is_preempt_epoch(epoch: str) -> bool:
    return epoch.startswith(PREEMPT_PREFIX)


def preempt_restart(epoch: str) -> int | None:
    """The restart count preempt_epoch() wrote into `epoch`; None for any other epoch."""
    rest = epoch[len(PREEMPT_PREFIX):] if epoch.startswith(PREEMPT_PREFIX) else ""
    return int(rest) if rest.isdigit() else None


# Epochs and node names become file names (release/<epoch>, ack/<node>.<rank>.json):
# a conservative character set keeps them from escaping their directory.
# (Sets, not a regular expression: hooks import this, and `re` costs ~6 ms.)
_NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_NAME_REST = _NAME_FIRST | frozenset(".:+-")


def check_name(what: str, value) -> str:
    """Validate an epoch or node name that is used as a file name."""
    if not (isinstance(value, str) and 0 < len(value) <= 128 and value[0] in _NAME_FIRST
            and _NAME_REST.issuperset(value)):
        raise BadValueError(what=what, value=value,
                            why="must be 1-128 characters of A-Z a-z 0-9 . _ : + - and not start with . or -")
    return value


def iso(t: datetime | None) -> str | None:
    return t.isoformat(timespec="microseconds") if t is not None else None


# -- the field checks every parser is built from -------------------------------------
class Fields:
    """One file's decoded object and how to name what is wrong in it:
    "invalid <label> field '<field>' <value>: <why>[ (in <source>)]"."""

    _MISSING = object()

    def __init__(self, label: str, data, source: str = ""):
        self.label, self.source = label, source
        if not isinstance(data, dict):
            raise BadValueError(what=label, value=data, why="expected a JSON object" + self._in())
        self.data = data

    def _in(self) -> str:
        return f" (in {self.source})" if self.source else ""

    def bad(self, field: str, value, why: str) -> BadValueError:
        return BadValueError(what=f"{self.label} field {field!r}", value=value, why=why + self._in())

    def get(self, field: str, default=_MISSING):
        if field in self.data:
            return self.data[field]
        if default is self._MISSING:
            raise self.bad(field, None, "missing")
        return default

    def only(self, known) -> None:
        unknown = sorted(set(self.data) - set(known))
        if unknown:
            raise self.bad(unknown[0], self.data[unknown[0]], "unknown key")

    def integer(self, field: str, value, minimum: int = 0, maximum: int | None = None) -> int:
        # bool is an int subclass; `true` is not a rank.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(field, value, "expected an integer")
        if value < minimum:
            raise self.bad(field, value, f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise self.bad(field, value, f"must be <= {maximum}")
        return value

    def string(self, field: str, value) -> str:
        if not isinstance(value, str):
            raise self.bad(field, value, "expected a string")
        return value

    def name(self, field: str, value, what: str) -> str:
        try:
            return check_name(what, value)
        except BadValueError as exc:
            raise self.bad(field, value, exc.kwargs["why"]) from None

    def abs_path(self, field: str, value, *, null: bool) -> str | None:
        if value is None and null:
            return None
        if not isinstance(value, str) or not os.path.isabs(value) or "\0" in value:
            raise self.bad(field, value, "expected an absolute path or null" if null else "expected an absolute path")
        return value

    def number(self, field: str, value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(field, value, "expected Unix seconds")
        return float(value)

    def aware(self, field: str, value, *, why: str = "expected an ISO 8601 time with a UTC offset") -> datetime:
        from datetime import datetime

        try:
            stamp = datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            stamp = None
        if stamp is None or stamp.tzinfo is None:
            raise self.bad(field, value, why)
        return stamp

    def moment(self, field: str, value) -> datetime:
        """Unix seconds or an ISO 8601 time with an offset, as an aware time."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            from datetime import datetime, timezone

            return datetime.fromtimestamp(value, timezone.utc)
        return self.aware(field, value, why="expected Unix seconds or an ISO 8601 time with an offset")
