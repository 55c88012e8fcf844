"""`dumps`: the text `json.dumps` gives for plain values (str, int, float,
bool, None, lists, tuples, dicts with string keys), without importing `json`.

The hooks write JSON on every opted-in job's start (job.json, the hooks.log
line), and `import json` compiles its regular expressions: ~25 M instructions
(~8 ms on the 2-core machine of docs/benchmarks.md) of the 30 ms an opted-in
Prolog may add. Strings go through the same C function json uses; any other
value (or a key that is not a string) is handed to `json.dumps` itself, so the
text is always what json would write, and so are its errors.
"""
from __future__ import annotations

_INF = float("inf")
# What needs no escape in a JSON string, as json writes it (ensure_ascii).
_PLAIN = frozenset(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}
_escape = None


def _string(text: str) -> str:
    """json's quoted form of `text`: the C escaper for the rare string that needs it."""
    if _PLAIN.issuperset(text):
        return f'"{text}"'
    global _escape
    if _escape is None:
        from _json import encode_basestring_ascii as _escape
    return _escape(text)


def dumps(value, *, sort_keys: bool = False) -> str:
    """json.dumps(value, sort_keys=sort_keys) with the default separators."""
    parts: list[str] = []
    if _encode(value, parts, sort_keys):
        return "".join(parts)
    import json

    return json.dumps(value, sort_keys=sort_keys)


def _encode(value, out: list[str], sort_keys: bool) -> bool:
    """Append value's JSON to `out`; False (out then unusable) for anything not plain."""
    if isinstance(value, str):
        out.append(_string(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif type(value) is int:
        out.append(int.__repr__(value))
    elif type(value) is float:
        if value != value:
            out.append("NaN")
        elif value in (_INF, -_INF):
            out.append("Infinity" if value > 0 else "-Infinity")
        else:
            out.append(float.__repr__(value))
    elif type(value) in (list, tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(", ")
            if not _encode(item, out, sort_keys):
                return False
        out.append("]")
    elif type(value) is dict:
        if not all(type(k) is str for k in value):
            return False
        out.append("{")
        for i, key in enumerate(sorted(value) if sort_keys else value):
            if i:
                out.append(", ")
            out.append(_string(key))
            out.append(": ")
            if not _encode(value[key], out, sort_keys):
                return False
        out.append("}")
    else:
        return False
    return True
