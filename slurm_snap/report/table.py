"""sacct's three text layouts: fixed-width with a dashed rule, -p and -P.

Fixed width follows sacct (a value longer than its field is cut and ends in
'+'; fields are joined by one space) except that trailing blanks are trimmed.
-p ends every field in '|' (sacct --parsable); -P separates with '|' and
has no trailing one (sacct --parsable2). Neither pads nor cuts values.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

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
        if header:
            yield _fixed(fields, names)
            yield " ".join("-" * f.width for f in fields).rstrip()
        for values in rows:
            yield _fixed(fields, values)
        return
    end = delimiter if layout == PARSABLE else ""
    if header:
        yield delimiter.join(names) + end
    for values in rows:
        yield delimiter.join(values) + end


def _fixed(fields: Sequence[Field], values: Sequence[str]) -> str:
    return " ".join(fit(v, f.width, f.align) for f, v in zip(fields, values)).rstrip()
