"""The restore drills this process is running now.

The sweep (sweep.py) takes a RUNNING test whose journal names this host and a
live pid for a drill in progress, except when the pid is this process's own:
then it may be a leftover of an earlier process that had the pid, or a drill
in another thread of this one (the schedule runner runs several). Only the
process can tell, so it keeps this record and hands the same one to every
drill it runs. Standard library only: the schedule runner holds one from its
start, before it knows whether it will drill at all.
"""
from __future__ import annotations

import threading


class LiveDrills:
    """The restore tests this process is running now, by id. One per process
    that runs drills in threads (the schedule runner), shared by its drills."""

    def __init__(self) -> None:
        self._ids: set[int] = set()
        self._lock = threading.Lock()

    def add(self, test_id: int) -> None:
        with self._lock:
            self._ids.add(test_id)

    def discard(self, test_id: int) -> None:
        with self._lock:
            self._ids.discard(test_id)

    def __contains__(self, test_id: int) -> bool:
        with self._lock:
            return test_id in self._ids
