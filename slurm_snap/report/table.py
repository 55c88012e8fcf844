"""sacct's three text layouts: fixed-width with a dashed rule, -p and -P.

Fixed width follows sacct (a value longer than its field is cut and ends in
'+'; fields are joined by one space) except that trailing blanks are trimmed.
-p ends every field in '|' (sacct --parsable); -P separates with '|' and
has no trailing one (sacct --parsable2). Neither pads nor cuts values.
"""
from __future__ import annotations

from operator import gt
from typing import Callable, Iterable, Iterator, Sequence

from .columns import LEFT, Field

FIXED, PARSABLE, PARSABLE2 = "fixed", "parsable", "parsable2"


def fit(value: str, width: int, align: str) -> str:
    if len(value) > width:
        value = value[: width - 1] + "+"
    return value.ljust(width) if align == LEFT else value.rjust(width)


def render(fields: Sequence[Field], rows: Iterable[Sequence[str]], *, layout: str = FIXED,
           header: bool = True, delimiter: str = "|") -> Iterator[str]:
    """Lines of the table; `rows` are the already formatted values per field;
    `delimiter` replaces '|' in -p/-P (sacct --delimiter)."""
    names = [f.column.name for f in fields]
    if layout == FIXED:
        line = fixed_line(fields)
        if header:
            yield line(names)
            yield " ".join("-" * f.width for f in fields).rstrip()
        for values in rows:
            yield line(values)
        return
    end = delimiter if layout == PARSABLE else ""
    if header:
        yield delimiter.join(names) + end
    for values in rows:
        yield delimiter.join(values) + end


def fixed_line(fields: Sequence[Field]) -> Callable[[Sequence[str]], str]:
    """The fixed-width line of one row's values: what " ".join(fit(...))
    computes. A window of 10,000 sets prints 80,000 fields (issue 36), so a
    row whose values all fit is padded by one %-format and its lengths
    checked by map() in C, without a Python call per field; only a row with
    a value to cut goes through fit()."""
    widths = tuple(int(f.width) for f in fields)
    aligns = tuple(f.align for f in fields)
    template = " ".join(f"%{'-' if f.align == LEFT else ''}{w}s" for f, w in zip(fields, widths))

    def line(values: Sequence[str]) -> str:
        if any(map(gt, map(len, values), widths)):
            return " ".join(map(fit, values, widths, aligns)).rstrip()
        return (template % tuple(values)).rstrip()

    return line
