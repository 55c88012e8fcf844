"""Recording the ranks' acknowledgements in the inventory.

An on-demand set's barrier wait is mostly idle: the ranks are writing their
checkpoints. The ledger records the acknowledgements that have arrived in
batches during that wait, so what is left for the critical path (between the
last acknowledgement and the cut) is the last few rows, not all of them. On
1,000 simulated nodes recording all rows during the cut took about 16 ms of
the GIL from the cutting threads (docs/benchmarks.md).

Batches are time-based (at most one transaction per `interval`), never one
per node or per acknowledgement. The ledger remembers which version of each
(node, rank) acknowledgement it recorded: a rank that rewrites its file in
the same epoch has its row replaced at the next flush, so the inventory ends
with exactly what the collector judged.
"""
from __future__ import annotations

import logging
import time


log = logging.getLogger(__name__)


def record_all(repo, set_id: int, collector) -> int:
    """Record every acknowledgement the collector holds that the set does not have yet (one statement)."""
    return repo.record_acks(set_id, collector.state.records())


class AckLedger:
    """Batches of one set's acknowledgements, recorded while the barrier is open."""

    def __init__(self, inventory, set_id: int, *, interval: float = 0.02):
        self.inv = inventory
        self.set_id = set_id
        self.interval = interval
        self._recorded: dict[tuple[str, int], tuple] = {}   # (node, rank) -> (ack, seen) as recorded
        self._last = time.monotonic()
        self._unsure = False   # a batch failed: what the inventory holds is not known
        self.flushes = 0

    def _pending(self, collector) -> tuple[list, list[tuple[str, int]]]:
        rows, replace = [], []
        for a, seen in collector.state.all_acks():
            key = (a.node, a.rank)
            have = self._recorded.get(key)
            if have is not None and have[0] == a and have[1] == seen:
                continue
            if have is not None:
                replace.append(key)
            rows.append((a, seen))
        return rows, replace

    def flush(self, repo, collector) -> int:
        """Record what is new or changed, inside the caller's transaction."""
        if self._unsure:
            rows, replace = list(collector.state.all_acks()), None
        else:
            rows, replace = self._pending(collector)
        if rows:
            repo.record_acks(self.set_id, [a.seen(seen) for a, seen in rows],
                             replace=replace, replace_all=self._unsure)
            for a, seen in rows:
                self._recorded[(a.node, a.rank)] = (a, seen)
            self.flushes += 1
        self._unsure = False
        self._last = time.monotonic()
        return len(rows)

    def maybe_flush(self, collector) -> None:
        """During the barrier wait: one transaction per interval at most.

        A failure here is only logged: the flush before the cut records
        everything again and is the one whose failure stops the set."""
        if time.monotonic() - self._last < self.interval:
            return
        try:
            with self.inv.session() as repo:
                self.flush(repo, collector)
        except Exception as exc:
            # The batch may or may not have committed (a lost connection at
            # COMMIT): the next flush rewrites the set's rows from scratch.
            self._recorded.clear()
            self._unsure = True
            self._last = time.monotonic()
            log.warning("set %s: recording acknowledgements during the barrier failed (%s); "
                        "they are recorded again before the cut", self.set_id, exc)
