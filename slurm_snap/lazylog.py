"""A module's logger that imports `logging` when it first logs.

Modules on the hooks' start path log only when something goes wrong, and
`import logging` costs an opted-in Prolog ~15 ms on the 2-core machine of
docs/benchmarks.md (48 M instructions, with the threading, traceback and
string modules it pulls in). `getLogger(__name__)` here stands in for
`logging.getLogger(__name__)`: the same logger, the same handlers and levels,
reached on the first call."""
from __future__ import annotations


class _LazyLogger:
    __slots__ = ("_name", "_logger")

    def __init__(self, name: str):
        self._name = name
        self._logger = None

    def __getattr__(self, attr: str):
        if self._logger is None:
            import logging

            self._logger = logging.getLogger(self._name)
        return getattr(self._logger, attr)


def getLogger(name: str) -> _LazyLogger:   # noqa: N802 - the name logging gives it
    return _LazyLogger(name)
