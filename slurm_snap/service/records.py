"""Typed records to and from the service's JSON: the one conversion at the
wire's edge, driven by the records' type hints, so a hook operation's
arguments and results are frozen dataclasses on both sides and JSON only
on the socket.

A per-job record (slurm_snap.jobrecords) travels as its file's object and
comes back through its own parser (one parser per record); an
acknowledgement also carries when its reader first saw it, which no file
holds. Any other frozen dataclass goes field by field; datetimes as ISO 8601
with their offset. A missing or unknown field, or a value of the wrong type,
is a BadValueError naming where it is.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import types
import typing

from ..errors import BadValueError
from ..jobrecords import Ack

_NONE = type(None)


def encode(value):
    """`value` as JSON: records, tuples, lists, dicts, datetimes and scalars."""
    if isinstance(value, Ack):
        return {"ack": value.to_json(), "seen_at": encode(value.seen_at)}
    if hasattr(value, "to_json") and dataclasses.is_dataclass(value):
        return value.to_json()
    if dataclasses.is_dataclass(value):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


# A node still on a version from before the typed per-job records sends an
# acknowledgement as its fields with seen_at beside them, without the file's
# version, job or epoch (docs/upgrade.md: nodes may lag the controller by a
# version; tests/integration/test_upgrade_mixed_cluster.py). The operation
# names the set the acknowledgements belong to, and the inventory keeps them
# by set, so the job and epoch stand in as "legacy" and are stored nowhere.
_LEGACY_ACK = frozenset({"node", "rank", "local_rank", "local_size", "step", "written_at", "manifest",
                         "world_size", "independent", "agreement", "signalled_at", "seen_at"})


def _from_legacy_ack(value: dict) -> dict:
    ack = {k: v for k, v in value.items() if k != "seen_at"}
    ack.update(version=2, job_id="legacy", epoch="legacy")
    return {"ack": ack, "seen_at": value["seen_at"]}


def _bad(where: str, value, why: str) -> BadValueError:
    return BadValueError(what=f"service field {where}", value=value, why=why)


def decode(hint, value, where: str):
    """The inverse of encode for a value declared as `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        (inner,) = [a for a in args if a is not _NONE] or [_NONE]
        return decode(inner, value, where)
    if hint is Ack:
        if isinstance(value, dict) and "seen_at" in value and "ack" not in value and set(value) <= _LEGACY_ACK:
            value = _from_legacy_ack(value)
        if not isinstance(value, dict) or set(value) != {"ack", "seen_at"}:
            raise _bad(where, value, 'expected {"ack": ..., "seen_at": ...}')
        return Ack.parse(value["ack"], where).seen(decode(dt.datetime | None, value["seen_at"], f"{where}.seen_at"))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if hasattr(hint, "parse"):
            return hint.parse(value, where)
        return _record(hint, value, where)
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise _bad(where, value, "expected a list")
        item = args[0] if args else typing.Any
        items = [decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if hint is dt.datetime:
        try:
            stamp = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
        except ValueError:
            stamp = None
        if stamp is None or stamp.tzinfo is None:
            raise _bad(where, value, "expected an ISO 8601 time with an offset")
        return stamp
    if hint is typing.Any or hint is object:
        return value
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise _bad(where, value, "expected an object")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is _NONE and value is None:
        return None
    if isinstance(hint, type) and isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
        return value
    raise _bad(where, value, f"expected {getattr(hint, '__name__', hint)}")


def _record(cls, value, where: str):
    if not isinstance(value, dict):
        raise _bad(where, value, f"expected a {cls.__name__} object")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", value[unknown[0]], f"unknown in {cls.__name__}")
    kwargs = {}
    for name, f in fields.items():
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _bad(f"{where}.{name}", None, "missing")
            continue
        kwargs[name] = decode(hints[name], value[name], f"{where}.{name}")
    return cls(**kwargs)


def decode_call(fn, args: dict, where: str) -> dict:
    """Keyword arguments for `fn` from a request's JSON, by its type hints."""
    if not isinstance(args, dict):
        raise _bad(where, args, "expected an object of arguments")
    hints = typing.get_type_hints(fn)
    unknown = sorted(set(args) - set(hints) - {"return"})
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", args[unknown[0]], "unknown argument")
    return {name: decode(hints[name], value, f"{where}.{name}") for name, value in args.items()}


def decode_result(fn, value, where: str):
    """`fn`'s result from a reply's JSON, by its return hint."""
    return decode(typing.get_type_hints(fn)["return"], value, where)
