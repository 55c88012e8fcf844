"""From what the user declared (`--snapshot-volumes`) to the volumes of the job,
one per node for node-local classes: a snapshot of only the head node is not a
snapshot of the job."""
from __future__ import annotations

import os

from .. import paths
from .. import states as S
from ..config import Config, VolumeClass
from ..errors import BadValueError, PathError
from ..jobrecords import VolumeRecord
from ..record import record

MAX_VOLUMES = 256


@record
class Declared:
    """One declared item: a whole class (per-job volume) or a path inside one."""

    vc: VolumeClass
    rel: str | None  # None: the class's per-job volume; else a path relative to the class prefix


def _prefix_regex(vc: VolumeClass):
    import re  # only for a declared path: a Prolog declaring classes need not pay for it

    parts = vc.prefix.split("{node}")
    return re.compile("^" + "[^/]+".join(re.escape(p) for p in parts) + "(?P<rel>(/.*)?)$")


def parse_declaration(cfg: Config, items) -> list[Declared]:
    """Syntax and class checks only: valid anywhere, no filesystem access."""
    items = list(items)
    if not items:
        return [Declared(vc, None) for vc in cfg.volume_classes if vc.default]
    if len(items) > MAX_VOLUMES:
        raise BadValueError(what="--snapshot-volumes", value=f"{len(items)} volumes",
                            why=f"at most {MAX_VOLUMES} volumes per job")
    out: list[Declared] = []
    seen = set()
    for item in items:
        if item == "":
            raise BadValueError(what="--snapshot-volumes", value=",".join(items), why="empty item in the list")
        if not item.startswith("/") and "/" not in item and not item.startswith("."):
            vc = cfg.volume_class(item)
            if vc is None:
                known = ", ".join(v.name for v in cfg.volume_classes) or "none configured"
                raise BadValueError(what="volume class", value=item, why=f"unknown (known: {known})")
            d = Declared(vc, None)
        else:
            path = paths.check_syntax(item)
            if paths.root_for(path, cfg.paths.allowed_roots) is None:
                raise PathError(path, "outside the allowed roots "
                                      f"({', '.join(cfg.paths.allowed_roots) or 'none configured'})")
            d = None
            for vc in sorted(cfg.volume_classes, key=lambda v: -len(v.prefix)):
                m = _prefix_regex(vc).match(path)
                if m:
                    d = Declared(vc, m.group("rel").lstrip("/"))
                    break
            if d is None:
                raise PathError(path, "not inside any volume class's prefix")
            if d.rel == "":
                raise PathError(path, f"is the whole {d.vc.name!r} area; declare a directory inside it "
                                      f"or the class name {d.vc.name!r}")
        key = (d.vc.name, d.rel)
        if key not in seen:
            seen.add(key)
            out.append(d)
    if not out:
        raise BadValueError(what="--snapshot-volumes", value=",".join(items), why="no volume declared")
    return out


def path_on(d: Declared, node: str | None, job_id: int) -> str:
    if d.rel is None:
        return d.vc.job_path(node if d.vc.scope == "node-local" else None, job_id)
    return f"{d.vc.prefix_for(node if d.vc.scope == 'node-local' else None)}/{d.rel}"


def specs_for_job(cfg: Config, declared: list[Declared], nodes, job_id: int) -> list[VolumeRecord]:
    """Every volume of the job: node-local ones once per node, shared ones once."""
    out = []
    for d in declared:
        targets = list(nodes) if d.vc.scope == "node-local" else [""]
        for node in targets:
            out.append(VolumeRecord(path=path_on(d, node or None, job_id), scope=d.vc.scope,
                                    volume_class=d.vc.name, backend=d.vc.backend, node=node,
                                    site=d.vc.site, region=d.vc.region))
    return out


def validate_submit(cfg: Config, items, consistency: str, *, uid: int | None = None) -> list[Declared]:
    """What the SPANK plugin asks at sbatch time, as the submitting user.

    Explicit shared paths must exist now, stay inside the roots without
    symlinks, and belong to the submitter: root will snapshot them later.
    """
    if consistency not in S.WANTED:
        raise BadValueError(what="--snapshot-consistency", value=consistency,
                            why=f"must be one of {', '.join(S.WANTED)}")
    declared = parse_declaration(cfg, items)
    uid = os.getuid() if uid is None else uid
    for d in declared:
        if d.rel is None or d.vc.scope != "shared":
            # Node-local: the node's disk is not visible here; parse_declaration
            # checked the syntax, the class and its prefix, the Prolog does the rest.
            continue
        path = path_on(d, None, 0)
        r = paths.resolve(path, cfg.paths.allowed_roots, must_exist=True)
        if uid != 0 and r.uid != uid:
            raise PathError(path, f"owned by uid {r.uid}, not by the submitting user (uid {uid})")
        check_snapshottable(d.vc, path, r.ino)
    return declared


def check_snapshottable(vc: VolumeClass, path: str, inode: int) -> None:
    """Refuse a declared directory the class's backend cannot cut on its own,
    saying what to do instead: at submit for shared paths (visible there),
    in the Prolog for node-local ones."""
    from ..backends.registry import default_registry

    problem = default_registry().backend_class(vc.backend).volume_problem(path, inode)
    if problem:
        where = vc.job_path(None if vc.scope == "shared" else "<node>", "<job id>")
        raise PathError(path, f"{problem}; or declare the class {vc.name!r} for a per-job volume {where}")
