"""A drill job on its nodes: the Prolog clones this node's node-local parts
before the owner's program starts, the Epilog removes them after it ends.

Both run as root on the node, started by slurmd (Prolog, Epilog), for a job
submitted with `--snapshot-drill=TEST` (restore/submit.py). What to clone
comes from the controller (restore/nodeops.py `work`, through the service on
a node), and is checked here again before root acts on it: a known
node-local class with the same backend, a snapshot inside the class's tree
on this node, a clone exactly at `<snapshot dir>/.slurm-snap-restore-<set>-<test>/<class>`,
made without following a link.

Crash safety as the controller's drills have it: `drill-node.json` in that
directory lists each clone before it is made, so an Epilog that cannot reach
the service, or the node agent's sweep after an Epilog that never ran
(`leftovers`), finds and removes what a Prolog made.

The Prolog tells the program and the user how it went the way every
slurm-snap Prolog does (jobdir.write_prolog_done): an empty file when the
clones are there; otherwise the failure, which the SPANK plugin prints in
the drill job's output and the in-job runner (injob.py) reads, so the
program never starts without a rank's state.
"""
from __future__ import annotations

import json
import logging
import os
import time

from .. import errors
from ..backends.base import SnapshotRef
from ..fsio import write_json
from ..jobdir import JobDir
from ..paths import open_dirs_nofollow
from .guard import relation
from .namespace import ALT_PREFIX, remove_clone
from .nodeops import NO_POSITION, NodeClone, NodeWork, drill_nodes_for

log = logging.getLogger(__name__)

JOURNAL = "drill-node.json"
# Errors that say nothing about the set (as restore/drill.py's NOT_THE_SETS_FAULT).
NOT_THE_SETS_FAULT = (errors.ConfigError, errors.ToolMissing, errors.Unsupported, errors.TransportError,
                      errors.PathError, errors.BadValueError)


def _check(cfg, node: str, work: NodeWork, c: NodeClone):
    """The class's backend on this node, once the clone is one root may make here."""
    vc = cfg.volume_class(c.volume_class)
    if vc is None or vc.scope != "node-local" or vc.backend != c.backend:
        raise errors.BadValueError(what="drill clone class", value=c.volume_class,
                                   why=f"is not a node-local {c.backend} class on {node}")
    prefix = vc.prefix_for(node)
    for what, path in (("snapshot", c.ref), ("clone", c.clone)):
        if not os.path.isabs(path) or os.path.normpath(path) != path or relation(path, prefix) != "is inside":
            raise errors.BadValueError(what=f"drill {what} path", value=path, why=f"is not inside {prefix}")
    want = os.path.join(os.path.dirname(c.ref), f"{ALT_PREFIX}{work.set_id}-{work.test_id}", c.volume_class)
    if c.clone != want:
        raise errors.BadValueError(what="drill clone path", value=c.clone, why=f"is not {want}")
    from ..backends.factory import backend_for_class

    return backend_for_class(cfg, vc, node, local=True)


def _journal(alt: str, work: NodeWork, job_id: int, clones: list[NodeClone]) -> None:
    write_json(os.path.join(alt, JOURNAL),
               {"test_id": work.test_id, "set_id": work.set_id, "job_id": job_id,
                "clones": [{"class": c.volume_class, "clone": c.clone, "snapshot_id": c.snapshot_id} for c in clones]},
               mode=0o644, durable=True, nofollow=True)


def prepare(cfg, inventory, job) -> str:
    """The drill job's Prolog on this node: make its clones, say how it went."""
    ops = drill_nodes_for(cfg, inventory)
    jobdir = JobDir(cfg.paths.barrier_dir, job.job_id).prepare(job.uid, job.gid)
    told: list[str] = []
    why, blames, t0 = "", False, time.monotonic()
    work = None
    try:
        # Refused (PermissionDenied) for a job that is not the drill's: then
        # nothing is made and nothing reported on the drill's behalf.
        work = ops.work(test_id=job.drill, job_id=job.job_id, uid=job.uid, node=job.node)
        if work.position == NO_POSITION:
            return f"drill {job.drill}: nothing node-local to prepare on {job.node}"
        made: dict[str, list[NodeClone]] = {}
        for c in work.clones:
            try:
                backend = _check(cfg, job.node, work, c)
                alt = os.path.dirname(c.clone)
                fd, _ = open_dirs_nofollow(alt, 0o755)
                os.close(fd)
                made.setdefault(alt, []).append(c)
                _journal(alt, work, job.job_id, made[alt])   # before the clone exists
                backend.clone(SnapshotRef(backend=c.backend, volume=c.volume, name=c.name, ref=c.ref,
                                          path=c.path or None), c.clone)
            except errors.SnapError as exc:
                blames = not isinstance(exc, NOT_THE_SETS_FAULT)
                why = f"clone of {c.volume} from snapshot {c.ref} on {job.node} failed: {exc}"
                raise
        return f"drill {job.drill}: {len(work.clones)} clone(s) made on {job.node}"
    except BaseException as exc:
        why = why or f"the Prolog on {job.node} failed: {exc}"
        told = [f"restore drill {job.drill}: {why}; the drilled program does not run"]
        raise
    finally:
        if work is not None and work.position != NO_POSITION:
            try:
                ops.report(test_id=job.drill, node=job.node, state="FAILED" if told else "READY", error=why,
                           blames_set=blames, seconds=round(time.monotonic() - t0, 6))
            except errors.SnapError as exc:
                log.error("drill %s: the Prolog's report did not reach the inventory: %s", job.drill, exc)
        try:
            jobdir.write_prolog_done(job.node, job.restart_count, told)
        except (OSError, errors.SnapError) as exc:
            log.error("drill job %s: prolog file for %s not written: %s", job.job_id, job.node, exc)


def cleanup(cfg, inventory, job) -> str:
    """The drill job's Epilog on this node: remove what its Prolog made."""
    ops = drill_nodes_for(cfg, inventory)
    try:
        work = ops.work(test_id=job.drill, job_id=job.job_id, uid=job.uid, node=job.node, cleanup=True)
        if work.position == NO_POSITION:
            return f"drill {job.drill}: nothing node-local on {job.node}"
        clones, asked = [c.clone for c in work.clones], True
    except (errors.ServiceUnavailable, errors.InventoryError) as exc:
        # The inventory is out of reach: what this node's journals list for
        # the drill (a refusal is not: a job that is not the drill's removes nothing).
        log.warning("drill %s: asking for the node's clones failed (%s); removing what the journals list",
                    job.drill, exc)
        clones, asked = [c for ns in leftovers(cfg, job.node) if (ns.test_id, ns.job_id) == (job.drill, job.job_id)
                          for c in ns.clones], False
    errs = remove(cfg, job.node, clones)
    try:
        ops.report(test_id=job.drill, node=job.node, cleanup="LEFT" if errs else "CLEANED", error="; ".join(errs))
    except errors.SnapError as exc:
        if asked:
            log.error("drill %s: the Epilog's report did not reach the inventory: %s", job.drill, exc)
    if errs:
        raise errors.BackendError(backend="restore drill", why="clones left on the node: " + "; ".join(errs))
    return f"drill {job.drill}: {len(clones)} clone(s) removed on {job.node}"


def remove(cfg, node: str, clones: list[str]) -> list[str]:
    """Remove clones (idempotent) and then their directories; errors, one a line."""
    errs: list[str] = []
    dirs: list[str] = []
    for clone in clones:
        alt = os.path.dirname(clone)
        try:
            if not os.path.basename(alt).startswith(ALT_PREFIX):
                raise errors.BadValueError(what="drill clone path", value=clone, why="is not in a drill's directory")
            vc = _class_of(cfg, node, clone)
            from ..backends.factory import backend_for_class

            remove_clone(backend_for_class(cfg, vc, node, local=True), clone, alt)
            if alt not in dirs:
                dirs.append(alt)
        except Exception as exc:  # one stuck clone must not leave the others
            errs.append(f"{clone}: {exc}")
    for alt in dirs:
        try:
            for name in os.listdir(alt):
                if name != JOURNAL and not name.startswith(f".{JOURNAL}"):
                    raise errors.BackendError(backend="restore drill", why=f"{alt} still holds {name}")
            for name in os.listdir(alt):
                os.unlink(os.path.join(alt, name))
            os.rmdir(alt)
        except FileNotFoundError:
            pass
        except (OSError, errors.SnapError) as exc:
            errs.append(f"{alt}: {exc}")
    return errs


def _class_of(cfg, node: str, clone: str):
    for vc in cfg.volume_classes:
        if vc.scope == "node-local" and relation(clone, vc.prefix_for(node)) == "is inside":
            return vc
    raise errors.BadValueError(what="drill clone path", value=clone, why=f"is in no node-local class on {node}")


class Leftover:
    """A drill directory on this node, from its journal."""

    def __init__(self, path: str, test_id: int, job_id: int | None, clones: list[str]):
        self.path, self.test_id, self.job_id, self.clones = path, test_id, job_id, clones


def leftovers(cfg, node: str) -> list[Leftover]:
    """Drill directories this node's Prologs made in the per-job classes'
    snapshot directories (`<prefix>/jobs/.snapshots`), from their journals;
    one without a readable journal is left alone (nothing to trust)."""
    out = []
    for vc in cfg.volume_classes:
        if vc.scope != "node-local" or not vc.per_job:
            continue
        snapdir = os.path.join(vc.prefix_for(node), "jobs", ".snapshots")
        try:
            names = sorted(os.listdir(snapdir))
        except OSError:
            continue
        for name in names:
            if not name.startswith(ALT_PREFIX):
                continue
            alt = os.path.join(snapdir, name)
            try:
                fd = os.open(os.path.join(alt, JOURNAL), os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    data = json.loads(f.read(1 << 20))
                clones = [e["clone"] for e in data["clones"]]
                test_id = data["test_id"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if not isinstance(test_id, int) or not all(isinstance(c, str) and os.path.dirname(c) == alt
                                                       for c in clones):
                continue
            job_id = data.get("job_id")
            out.append(Leftover(alt, test_id, job_id if isinstance(job_id, int) else None, clones))
    return out


def sweep_leftovers(cfg, inventory, node: str) -> list[str]:
    """The node agent's drill pass: drill directories on this node whose
    drill has ended (an Epilog that could not remove them, or never ran)."""
    left = leftovers(cfg, node)
    if not left:
        return []
    try:
        running = set(drill_nodes_for(cfg, inventory).running(test_ids=sorted({x.test_id for x in left})))
    except errors.SnapError as exc:
        return [f"drill leftovers not swept: {exc}"]
    out = []
    for x in left:
        if x.test_id in running:
            continue
        errs = remove(cfg, node, x.clones)
        out.append(f"drill {x.test_id}: {x.path} " + (f"not removed: {'; '.join(errs)}" if errs else "removed"))
    return out
