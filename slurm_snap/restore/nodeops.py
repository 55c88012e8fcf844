"""A drill job's nodes and the controller: what each node's Prolog clones,
and what the node reports back.

A drill runs as a Slurm job of the owner (submit.py). The node-local parts
are cloned on the nodes that hold them, by root there, started by Slurm: the
drill job's Prolog (restore/onnode.py) asks `work` which clones are its
node's, makes them, and reports READY or FAILED; its Epilog removes them and
reports CLEANED or LEFT. The controller never reaches the node.

Who may ask: root on a node (the service runs these for root only, as it
runs the preemption hooks' operations). A drill job is any job submitted
with `--snapshot-drill=TEST`, so `work` trusts nothing of it but what the
inventory says: the test must be RUNNING (or, for the Epilog's cleanup, have
been), the job's uid must be the set's owner's, the node one the drill
listed, and the job the one the test is bound to. The first drill job to ask
binds a test whose sbatch answer is not recorded yet; the drill's own job,
if it is not that one, is then refused by set_restore_test_job, and the
drill fails. A user can thus only make the Prolog clone their own set onto
their own job's nodes, which is what they could ask a drill to do anyway.

Here (LocalDrillNodes) on a host with the inventory, or through the service
(RemoteDrillNodes) on a node; the OPS table is what `slurm-snap serve` runs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .. import errors
from .. import states as S
from ..service import hostops
from .namespace import alt_namespace


@dataclass(frozen=True)
class NodeClone:
    """One node-local part to clone on the asking node, and where."""

    snapshot_id: int
    volume_class: str
    backend: str
    volume: str          # the live path it was cut from (the same on every node)
    name: str
    ref: str             # the snapshot's path: its own, or the copy's (the same path) on this node
    path: str
    clone: str           # <dirname(ref)>/.slurm-snap-restore-<set>-<test>/<class>


NO_POSITION = -1


@dataclass(frozen=True)
class NodeWork:
    """What a drill job's Prolog does on its node (and its Epilog undoes)."""

    test_id: int
    set_id: int
    node: str
    position: int        # NO_POSITION: the drill planned no nodes (nothing node-local), nothing to report
    clones: tuple[NodeClone, ...] = ()


def clone_path(ref: str, namespace: str, volume_class: str) -> str:
    """Where a node-local part's clone goes: next to its snapshot on the
    node's own disk, the same path on every node (as live scratch is), so
    SLURM_SNAP_RESTORE_<CLASS> names each rank's own part wherever it runs."""
    return os.path.join(alt_namespace(ref, namespace), volume_class)


class LocalDrillNodes:
    """The operations, against this host's inventory; their type hints are
    the wire's schema (service.records)."""

    def __init__(self, cfg, inventory):
        self.cfg = cfg
        self.inv = inventory

    def work(self, *, test_id: int, job_id: int, uid: int, node: str, cleanup: bool = False) -> NodeWork:
        """The clones `node` makes for drill job `job_id` (PermissionDenied if
        that job is not the drill's, NotFound if the node is not one of its)."""
        with self.inv.session() as repo:
            rt = repo.restore_test(test_id)
            run = rt.set.job_run
            if run.uid != uid:
                raise errors.PermissionDenied(why=f"Slurm job {job_id} of uid {uid} asked for restore test "
                                                  f"{test_id} of {run.user_name}'s job {run.label}")
            if cleanup:
                if rt.slurm_job_id not in (None, job_id):
                    raise errors.PermissionDenied(why=f"restore test {test_id} is Slurm job {rt.slurm_job_id}'s, "
                                                      f"not {job_id}'s")
            else:
                if rt.result != "RUNNING":
                    raise errors.Conflict(f"restore test {test_id} is {rt.result}, not running")
                if not repo.bind_restore_job(test_id, job_id):
                    raise errors.PermissionDenied(why=f"restore test {test_id} is Slurm job {rt.slurm_job_id}'s, "
                                                      f"not {job_id}'s")
            row = repo.restore_node(test_id, node)
            if row is None:
                if not repo.restore_nodes(test_id):
                    # A set without node-local parts: the job may run anywhere, nothing to clone.
                    return NodeWork(test_id=test_id, set_id=rt.set_id, node=node, position=NO_POSITION)
                raise errors.NotFound(what="drill node", value=f"{node} of restore test {test_id}")
            snaps = {s.id: s for s in repo.snapshots(rt.set_id, include_deleted=True)}
            clones = []
            for sid in row.snapshot_ids:
                s = snaps.get(sid)
                if s is None or s.volume.scope != "node-local":
                    raise errors.Conflict(f"restore test {test_id}: part {sid} listed for {node} is not a "
                                          "node-local part of the set")
                clones.append(NodeClone(snapshot_id=s.id, volume_class=s.volume.volume_class, backend=s.backend,
                                        volume=s.volume.path, name=s.name, ref=s.ref, path=s.path or "",
                                        clone=clone_path(s.ref, rt.target, s.volume.volume_class)))
            return NodeWork(test_id=test_id, set_id=rt.set_id, node=node, position=row.position,
                            clones=tuple(clones))

    def report(self, *, test_id: int, node: str, state: str = "", cleanup: str = "", error: str = "",
               blames_set: bool = False, seconds: float | None = None) -> None:
        """A Prolog's (state) or an Epilog's (cleanup) word about its node."""
        if (state and state not in (S.NODE_READY, S.NODE_FAILED)) or (cleanup and cleanup not in S.NODE_CLEANUPS) \
                or bool(state) == bool(cleanup):
            raise errors.BadValueError(what="drill node report", value=f"state={state!r} cleanup={cleanup!r}",
                                       why="one of state READY/FAILED or cleanup CLEANED/LEFT")
        with self.inv.session() as repo:
            rt = repo.restore_test(test_id)
            repo.report_restore_node(test_id, node, state=state, cleanup=cleanup, error=error,
                                     blames_set=blames_set, seconds=seconds)
            what = (f"clones on {node} " + ("made" if state == S.NODE_READY else "not made") if state
                    else f"clones on {node} " + ("removed" if cleanup == S.NODE_CLEANED else "not all removed"))
            level = "info" if state == S.NODE_READY or cleanup == S.NODE_CLEANED else "error"
            repo.event("restore_test", f"restore test {test_id}: {what}" + (f": {error}" if error else ""),
                       job_id=rt.set.job_id, set_id=rt.set_id, node=node, level=level)

    def running(self, *, test_ids: list[int]) -> list[int]:
        """Which of these tests still run (the node agent's sweep of leftover clones)."""
        with self.inv.session(readonly=True) as repo:
            return sorted(t.id for t in repo.running_restore_tests() if t.id in set(test_ids))


class RemoteDrillNodes:
    """The same operations through the controller's slurm-snap service."""

    def __init__(self, cfg):
        self.cfg = cfg

    def _call(self, op: str, **args):
        return hostops.call(self.cfg, LocalDrillNodes, OPS_METHODS, op, args)

    def work(self, **kw) -> NodeWork:
        return self._call("drill-node-work", **kw)

    def report(self, **kw) -> None:
        self._call("drill-node-report", **kw)

    def running(self, **kw) -> list[int]:
        return self._call("drill-running", **kw)


def drill_nodes_for(cfg, inventory):
    """This host's way to the drill records: the service when the config names it."""
    return RemoteDrillNodes(cfg) if cfg.via_service else LocalDrillNodes(cfg, inventory)


OPS_METHODS = {"drill-node-work": "work", "drill-node-report": "report", "drill-running": "running"}


# What `serve` runs for them (root only).
OPS = hostops.served(LocalDrillNodes, OPS_METHODS)
