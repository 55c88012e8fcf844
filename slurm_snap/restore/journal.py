"""A drill's crash journal (drill.json in its namespace): what the drill may
have made, and where, written before each thing is made.

A drill killed anywhere leaves this file; the next drill's sweep (sweep.py)
reads it to tell a live drill from a dead one (host, pid), to finish a
--no-wait drill whose Slurm job ended (slurm_job_id, deadline,
checkpoint_step), and cleanup (namespace.py) reads it to remove every clone
and copy it lists, each on its node. One record type, one parser, one writer:

    {"version": 1, "set_id": 7, "test_id": 3, "host": "ctl", "pid": 4242,
     "started_at": "2026-12-03T08:00:00+00:00",
     "clones": [{"snapshot_id": 11, "path": NS/scratch@n1, "ns": NS, "live": "/scratch/jobs/42",
                 "class": "scratch", "node": "n1"[, "on": "n3"]}],
     "namespaces": [alternative namespaces next to snapshots],
     "copies": [{"snapshot_id", "on", "class", "backend", "volume", "name", "ref", "path", "from"}],
     ["nodes": [the drill's nodes], "slurm_job_id": 77, "detached": false,
      "deadline": 120.0, "checkpoint_step": 30]}

The record is frozen: a drill adds to its journal with `with_*` (a new
record) and writes it with `write`, so what is on disk is always a whole
record the drill held. Root reads it back, so the parser trusts nothing:
each wrong field is named (BadValueError), and cleanup still refuses any
path the namespace does not contain (namespace.remove_clone).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from ..errors import BadValueError
from ..fsio import write_json

FILE = "drill.json"
VERSION = 1


@dataclass(frozen=True)
class Clone:
    """A writable clone of one snapshot: at `path` inside namespace `ns`, on
    `on` (a placed drill's node) or else where the snapshot's backend runs."""
    snapshot_id: int
    path: str
    ns: str
    live: str
    volume_class: str
    node: str
    on: str = ""


@dataclass(frozen=True)
class Copy:
    """A node-local part brought to drill node `on` (at its original's path)
    from `source`, removed there after the drill."""
    snapshot_id: int
    on: str
    volume_class: str
    backend: str
    volume: str
    name: str
    ref: str
    path: str | None
    source: str

    def error_prefix(self) -> str:
        """How cleanup starts the error about a copy it could not delete."""
        return f"copy {self.ref} on {self.on}:"


@dataclass(frozen=True)
class Journal:
    set_id: int
    test_id: int
    host: str
    pid: int
    started_at: str
    clones: tuple[Clone, ...] = ()
    namespaces: tuple[str, ...] = ()
    copies: tuple[Copy, ...] = ()
    nodes: tuple[str, ...] = ()
    # Set once the command is a Slurm job (restore-test --submit).
    slurm_job_id: int | None = None
    detached: bool = False
    deadline: float | None = None
    checkpoint_step: int | None = None

    def with_clone(self, clone: Clone) -> "Journal":
        return dataclasses.replace(self, clones=self.clones + (clone,))

    def with_namespace(self, ns: str) -> "Journal":
        return self if ns in self.namespaces else dataclasses.replace(self, namespaces=self.namespaces + (ns,))

    def with_copies(self, copies) -> "Journal":
        return dataclasses.replace(self, copies=self.copies + tuple(copies))

    def submitted(self, job_id: int, *, detached: bool, deadline: float, checkpoint_step: int | None) -> "Journal":
        return dataclasses.replace(self, slurm_job_id=job_id, detached=detached, deadline=deadline,
                                   checkpoint_step=checkpoint_step)

    def as_json(self) -> dict:
        out: dict = {"version": VERSION, "set_id": self.set_id, "test_id": self.test_id, "host": self.host,
                     "pid": self.pid, "started_at": self.started_at,
                     "clones": [_clone_json(c) for c in self.clones],
                     "namespaces": list(self.namespaces),
                     "copies": [_copy_json(c) for c in self.copies]}
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.slurm_job_id is not None:
            out.update(slurm_job_id=self.slurm_job_id, detached=self.detached, deadline=self.deadline,
                       checkpoint_step=self.checkpoint_step)
        return out


def _clone_json(c: Clone) -> dict:
    out = {"snapshot_id": c.snapshot_id, "path": c.path, "ns": c.ns, "live": c.live, "class": c.volume_class,
           "node": c.node}
    if c.on:
        out["on"] = c.on
    return out


def _copy_json(c: Copy) -> dict:
    return {"snapshot_id": c.snapshot_id, "on": c.on, "class": c.volume_class, "backend": c.backend,
            "volume": c.volume, "name": c.name, "ref": c.ref, "path": c.path, "from": c.source}


def write(ns: str, journal: Journal) -> None:
    """Durably, atomically, never through a symlink: before the thing it lists is made."""
    write_json(os.path.join(ns, FILE), journal.as_json(), mode=0o644, durable=True, nofollow=True)


class JournalFile:
    """The journal of one running drill: `current` is what is on disk; each
    `record` writes the new whole record before the drill makes what it adds."""

    def __init__(self, ns: str, journal: Journal) -> None:
        self.ns = ns
        self.record(journal)

    def record(self, journal: Journal) -> None:
        write(self.ns, journal)
        self.current = journal


def read(ns: str) -> Journal | None:
    """The journal in namespace `ns`; None when there is none or it cannot be
    read (a drill killed before its first write); BadValueError naming the
    field when it is not one a drill wrote."""
    path = os.path.join(ns, FILE)
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    return parse(data, where=path)


def parse(data, *, where: str = FILE) -> Journal:
    """A journal from its JSON; BadValueError naming the first wrong field."""
    def bad(key: str, value, why: str) -> BadValueError:
        # As jobdir names a wrong field of a per-job file.
        return BadValueError(what=f"{FILE} field {key!r}", value=value if value is None or isinstance(value, (int, str)) else
                             repr(value)[:200], why=f"{why} (in {where})")

    def field_of(obj: dict, key: str, kind, *, ctx: str, default=dataclasses.MISSING, optional: bool = False):
        if key not in obj:
            if default is not dataclasses.MISSING:
                return default
            raise bad(f"{ctx}{key}", None, "is missing")
        value = obj[key]
        if value is None and optional:
            return None
        # bool is an int to Python, never to a journal.
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise bad(f"{ctx}{key}", value, f"is not {_KIND[kind]}")
        return value

    def strings(obj: dict, key: str, *, ctx: str = "") -> tuple[str, ...]:
        items = field_of(obj, key, list, ctx=ctx, default=[])
        for item in items:
            if not isinstance(item, str):
                raise bad(f"{ctx}{key}", item, "is not a list of strings")
        return tuple(items)

    def entries(key: str) -> list[tuple[str, dict]]:
        items = field_of(data, key, list, ctx="", default=[])
        out = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise bad(f"{key}[{i}]", item, "is not an object")
            out.append((f"{key}[{i}].", item))
        return out

    if not isinstance(data, dict):
        raise bad("(top)", data, "is not a JSON object")
    version = field_of(data, "version", int, ctx="", default=VERSION)
    if version != VERSION:
        raise bad("version", version, f"is not {VERSION}")
    clones = tuple(Clone(snapshot_id=field_of(e, "snapshot_id", int, ctx=c), path=field_of(e, "path", str, ctx=c),
                         ns=field_of(e, "ns", str, ctx=c), live=field_of(e, "live", str, ctx=c, default=""),
                         volume_class=field_of(e, "class", str, ctx=c), node=field_of(e, "node", str, ctx=c, default=""),
                         on=field_of(e, "on", str, ctx=c, default=""))
                   for c, e in entries("clones"))
    copies = tuple(Copy(snapshot_id=field_of(e, "snapshot_id", int, ctx=c), on=field_of(e, "on", str, ctx=c),
                        volume_class=field_of(e, "class", str, ctx=c), backend=field_of(e, "backend", str, ctx=c),
                        volume=field_of(e, "volume", str, ctx=c), name=field_of(e, "name", str, ctx=c),
                        ref=field_of(e, "ref", str, ctx=c),
                        path=field_of(e, "path", str, ctx=c, default=None, optional=True),
                        source=field_of(e, "from", str, ctx=c, default=""))
                   for c, e in entries("copies"))
    return Journal(set_id=field_of(data, "set_id", int, ctx=""), test_id=field_of(data, "test_id", int, ctx=""),
                   host=field_of(data, "host", str, ctx=""), pid=field_of(data, "pid", int, ctx=""),
                   started_at=field_of(data, "started_at", str, ctx=""), clones=clones,
                   namespaces=strings(data, "namespaces"), copies=copies, nodes=strings(data, "nodes"),
                   slurm_job_id=field_of(data, "slurm_job_id", int, ctx="", default=None, optional=True),
                   detached=field_of(data, "detached", bool, ctx="", default=False),
                   deadline=field_of(data, "deadline", float, ctx="", default=None, optional=True),
                   checkpoint_step=field_of(data, "checkpoint_step", int, ctx="", default=None, optional=True))


_KIND = {int: "an integer", str: "a string", float: "a number", bool: "true or false", list: "a list"}
