"""Slurm hostlist expressions (n[1-3,5],gpu[01-02]) expanded without a
Slurm call: hooks must not pay an RPC, and 22.05's `scontrol show hostnames`
is one process per call. No regular expressions: hooks import this, and
`re` alone costs an opted-in Prolog ~6 ms."""
from __future__ import annotations

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


def _expand_one(item: str, whole: str) -> list[str]:
    # The first "[...]": from the first "[" to the next "]".
    start = item.find("[")
    end = item.find("]", start + 1) if start >= 0 else -1
    if end < 0:
        if "[" in item or "]" in item:
            raise BadValueError(what="node list", value=whole, why="unbalanced brackets")
        return [item]
    head, tail = item[:start], item[end + 1:]
    out = []
    for rng in item[start + 1:end].split(","):
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


# ---- compression, as Slurm prints node lists ---------------------------------
# Slurm's hostlist keeps the order it is given: a host joins the previous range
# when it has the same prefix, the next number and a compatible zero padding;
# neighbouring ranges with one prefix share one bracket (n[1-3,5],gpu[01-02]).
def _numbered(host: str) -> tuple[str, str] | None:
    """(prefix, trailing digits) of a host name ending in digits, else None."""
    i = len(host)
    while i > 0 and host[i - 1].isdecimal():
        i -= 1
    return (host[:i], host[i:]) if i < len(host) else None


def _padding(num: int, width: int) -> int:
    return max(0, width - len(str(num)))


def _same_width(lo: int, width: int, num: int, num_width: int) -> int | None:
    """The combined width when `num` (written num_width wide) may extend a range
    that starts at `lo` written `width` wide, else None: 9 and 10 combine (no
    padding either way), 09 and 10 combine at width 2, 01 and 2 do not."""
    if width == num_width:
        return width
    if _padding(lo, width) != _padding(lo, num_width):
        return width if _padding(num, num_width) == _padding(num, width) else None
    return num_width if _padding(lo, width) == _padding(lo, num_width) else None


def compress(hosts: list[str] | tuple[str, ...]) -> str:
    """['n1','n2','n3','gpu01','gpu02'] -> 'n[1-3],gpu[01-02]', as
    `scontrol show hostlist` prints it (order kept, duplicates kept)."""
    ranges: list[list] = []   # [prefix, lo, hi, width] or [name, None, None, 0]
    for host in hosts:
        m = _numbered(host)
        if m is None:
            ranges.append([host, None, None, 0])
            continue
        prefix, digits = m
        num, width = int(digits), len(digits)
        if ranges:
            tail = ranges[-1]
            if tail[1] is not None and tail[0] == prefix and tail[2] + 1 == num:
                combined = _same_width(tail[1], tail[3], num, width)
                if combined is not None:
                    tail[2], tail[3] = num, combined
                    continue
        ranges.append([prefix, num, num, width])
    out, i = [], 0
    while i < len(ranges):
        prefix, lo, hi, width = ranges[i]
        if lo is None:
            out.append(prefix)
            i += 1
            continue
        group = [ranges[i]]
        i += 1
        while i < len(ranges) and ranges[i][1] is not None and ranges[i][0] == prefix:
            group.append(ranges[i])
            i += 1
        nums = [f"{g[1]:0{g[3]}d}" + (f"-{g[2]:0{g[3]}d}" if g[2] > g[1] else "") for g in group]
        if len(group) == 1 and lo == hi:
            out.append(prefix + nums[0])
        else:
            out.append(f"{prefix}[{','.join(nums)}]")
    return ",".join(out)
