"""Slurm hostlist expressions (n[1-3,5],gpu[01-02]) expanded without a
Slurm call: hooks must not pay an RPC, and 22.05's `scontrol show hostnames`
is one process per call."""
from __future__ import annotations

import re

from ..errors import BadValueError

_MAX_HOSTS = 100_000


def expand(expr: str) -> list[str]:
    out: list[str] = []
    for item in _split_top(expr.strip()):
        if item:
            out.extend(_expand_one(item, expr))
        if len(out) > _MAX_HOSTS:
            raise BadValueError(what="node list", value=expr, why=f"more than {_MAX_HOSTS} hosts")
    return out


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


_BRACKET = re.compile(r"\[([^\]]*)\]")


def _expand_one(item: str, whole: str) -> list[str]:
    m = _BRACKET.search(item)
    if not m:
        if "[" in item or "]" in item:
            raise BadValueError(what="node list", value=whole, why="unbalanced brackets")
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    out = []
    for rng in m.group(1).split(","):
        if "-" in rng:
            lo, hi = rng.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise BadValueError(what="node list", value=whole, why=f"bad range {rng!r}")
            width = len(lo)
            for n in range(int(lo), int(hi) + 1):
                for rest in _expand_one(tail, whole) if tail else [""]:
                    out.append(f"{head}{n:0{width}d}{rest}")
        else:
            if not rng.isdigit():
                raise BadValueError(what="node list", value=whole, why=f"bad index {rng!r}")
            for rest in _expand_one(tail, whole) if tail else [""]:
                out.append(f"{head}{rng}{rest}")
    return out
