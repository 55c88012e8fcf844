"""A text timeline of one set: where the time went, per node.

One bar per node on a common scale from the request to the end of the set
(finalize, or the last recorded part if it never finished), so a slow rank or a
slow volume stands out without reading timestamps:

    q  quiesce: ranks signalled -> the node's last barrier acknowledgement
    c  cut: the node's first volume cut started -> its last cut done
The "(set)" row shows the coordinator's phases: w waiting to signal,
q quiesce, c cut, f finalize.
"""
from __future__ import annotations

import datetime as dt
from typing import Iterable, Sequence

WIDTH = 60


def _span(start: dt.datetime | None, end: dt.datetime | None, ch: str):
    return (start, end, ch) if start is not None and end is not None else None


def _first(*stamps):
    return next((t for t in stamps if t is not None), None)


def timeline(st, acks: Sequence, snaps: Sequence, *, width: int = WIDTH) -> list[str]:
    t0 = st.requested_at
    stamps = [t for t in (st.signalled_at, st.barrier_at, st.cut_started_at, st.cut_done_at, st.finished_at)
              if t is not None]
    stamps += [a.received_at for a in acks] + [s.cut_at for s in snaps]
    t1 = max(stamps, default=t0)
    total = (t1 - t0).total_seconds()
    # A phase that never ended (a set failed while quiescing or cutting) lasts
    # until the next thing that did happen, so the bar shows where it stalled.
    rows: list[tuple[str, list]] = [("(set)", [
        _span(t0, _first(st.signalled_at, st.cut_started_at, st.finished_at), "w"),
        _span(st.signalled_at, _first(st.barrier_at, st.cut_started_at, st.finished_at), "q"),
        _span(st.cut_started_at, _first(st.cut_done_at, st.finished_at), "c"),
        _span(st.cut_done_at, st.finished_at, "f"),
    ])]
    nodes = sorted({a.node for a in acks} | {s.node for s in snaps})
    for node in nodes:
        node_acks = [a.received_at for a in acks if a.node == node]
        node_snaps = [s for s in snaps if s.node == node]
        spans = []
        if node_acks:
            spans.append(_span(st.signalled_at or t0, max(node_acks), "q"))
        if node_snaps:
            spans.append(_span(min(s.cut_started_at for s in node_snaps), max(s.cut_at for s in node_snaps), "c"))
        rows.append((node or "(shared)", spans))
    label_w = max(len(name) for name, _ in rows)
    scale = f"{'0s':<{width // 2}}{f'{total:.3f}s':>{width - width // 2}}"
    out = [f"{'':<{label_w}}  {scale}"]
    for name, spans in rows:
        out.append(f"{name:<{label_w}} |{_bar(t0, total, [s for s in spans if s], width)}|")
    per = total / width if total else 0.0
    out.append(f"one character = {per:.3f} s; w wait, q quiesce (signal -> barrier), c cut, f finalize")
    return out


def _bar(t0: dt.datetime, total: float, spans: Iterable, width: int) -> str:
    cells = [" "] * width
    for start, end, ch in spans:
        a, b = min(_col(t0, total, start, width), width - 1), _col(t0, total, end, width)
        # A phase shorter than one character still gets one, so it is visible.
        for i in range(a, max(b, a + 1)):
            cells[i] = ch
    return "".join(cells)


def _col(t0: dt.datetime, total: float, t: dt.datetime, width: int) -> int:
    if total <= 0:
        return 0
    x = (t - t0).total_seconds() / total * width
    return max(0, min(width, int(x + 0.5)))
