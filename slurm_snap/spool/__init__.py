"""A node's durable spool of what its Epilogs cut while the inventory was
away (records.py: what an entry says; outbox.py: the directory). Standard
library only, like jobrecords/: the Epilog's path imports it."""
from __future__ import annotations

import os

ENTRIES = "entries"
REJECTED = "rejected"


def has_entries(directory: str) -> bool:
    """Whether anything waits for delivery: every hook asks this on its way
    out (one scandir of a usually empty directory, ~10 us), so it must
    never raise. Here, not in outbox.py, whose records import dataclasses,
    json and re: ~38 ms on every opted-in Prolog (issue 36)."""
    try:
        with os.scandir(os.path.join(directory, ENTRIES)) as it:
            return any(e.name.endswith(".json") and not e.name.startswith(".") for e in it)
    except OSError:
        return False
