"""Node tasks, the controller's side: what each node's agent pulls, and what
its report does to the inventory.

Work on a node's own disk that no Slurm job rides on is done by root on
that node, by its agent (agent.py, one pass of `slurm-snap node-agent`),
never by the controller over SSH:
  - prune's deletes of node-local parts and of their copies (`delete`);
  - partner copies, a part streamed from its node's agent to its partner's
    (`send` and `receive`, one task each, linked: stream.py).
Prune and the schedule runner queue tasks here; the agent pulls its node's
(`tasks`), does them, and reports (`listening`, `finished`); a report moves
the part, the copy and, once nothing of it is left, a DELETING set.

Root only through the service, as the hooks' operations: an agent runs as
root on a node. Which node asks is what the agent says; root on one node
can only pull another node's tasks, whose paths are checked on the node
that acts (agent.py), and a stream's ends prove themselves with MUNGE.
"""
from __future__ import annotations

import dataclasses
import secrets

from .. import errors
from .. import states as S
from ..inventory.records import CopyRecord
from ..service import hostops

KINDS = ("delete", "send", "receive")


@dataclasses.dataclass(frozen=True)
class TaskWork:
    """One task as the node's agent gets it: the part (a snapshot row's
    backend handle), and for a stream its peer, where the receiver listens,
    and the token both ends' credentials carry."""

    id: int
    kind: str
    purpose: str
    set_id: int
    volume_class: str
    backend: str
    volume: str
    name: str
    ref: str
    path: str = ""
    origin: str = ""                # the node that cut it: a copy keeps its path (inside that node's tree)
    copy: bool = False              # delete: a copy of the part on this node, not the part itself
    parent_name: str = ""           # send: a snapshot of the same volume the receiver holds
    parent_ref: str = ""
    parent_path: str = ""
    peer: str = ""
    address: str = ""
    token: str = ""


def _work(repo, t) -> TaskWork:
    s = t.snapshot
    parent = repo.snapshot_row(t.parent_id) if t.parent_id else None
    pair = repo.node_task(t.pair_id) if t.pair_id else None
    return TaskWork(id=t.id, kind=t.kind, purpose=t.purpose, set_id=t.set_id, volume_class=s.volume.volume_class,
                    backend=s.backend, volume=s.volume.path, name=s.name, ref=s.ref, path=s.path or "",
                    origin=s.node, copy=t.copy_id is not None, parent_name=parent.name if parent else "",
                    parent_ref=parent.ref if parent else "", parent_path=(parent.path or "") if parent else "",
                    peer=t.peer, address=pair.address if (pair is not None and t.kind == "send") else "",
                    token=t.token)


class LocalNodeTasks:
    """The operations against this host's inventory; their type hints are
    the wire's schema (service.records)."""

    def __init__(self, cfg, inventory):
        self.cfg = cfg
        self.inv = inventory

    def tasks(self, *, node: str) -> list[TaskWork]:
        """`node`'s deletes and receives to do, and the sends whose receiver listens."""
        with self.inv.session(readonly=True) as repo:
            return [_work(repo, t) for t in repo.tasks_for_node(node)]

    def listening(self, *, task_id: int, node: str, address: str) -> None:
        """A receive waits for its sender at `address` (host:port)."""
        with self.inv.session() as repo:
            t = self._mine(repo, task_id, node, "receive")
            if t.state != S.TASK_PENDING:
                raise errors.Conflict(f"node task {task_id} is {t.state}, not pending")
            t.state, t.address = S.TASK_LISTENING, address[:255]

    def finished(self, *, task_id: int, node: str, ok: bool, error: str = "", method: str = "",
                 bytes: int | None = None, seconds: float | None = None) -> str:
        """What the agent did; its effect on the part, the copy, the set."""
        with self.inv.session() as repo:
            # Both ends of a transfer locked in one order (lock_node_task_pair).
            t, pair = repo.lock_node_task_pair(task_id)
            self._check_mine(t, node, None)
            if t.state not in S.TASK_OPEN:
                return f"node task {task_id} was already {t.state}"
            t.state, t.error = (S.TASK_DONE, "") if ok else (S.TASK_FAILED, error[:4000])
            t.method, t.bytes, t.seconds = method[:24], bytes, seconds
            job_id = repo.get_set(t.set_id).job_id
            if t.kind == "delete":
                return self._deleted(repo, t, ok, error, job_id)
            receiver = t if t.kind == "receive" else pair
            if not ok and pair is not None and pair.state in S.TASK_OPEN:
                pair.state, pair.error = S.TASK_FAILED, f"its {t.kind} on {t.node} failed: {error}"[:4000]
            elif ok and t.kind == "receive" and pair is not None and pair.state in S.TASK_OPEN:
                pair.state = S.TASK_DONE   # already there ("present"): nothing to send
            if t.kind == "send" and ok:
                return f"sent part {t.snapshot_id} to {t.peer}"
            # The copy's row, once: by the receiver, or by a sender that failed first.
            s = t.snapshot
            copy = CopyRecord(snapshot_id=s.id, node=receiver.node, ref=s.ref, path=s.path or "", purpose=t.purpose,
                              source_node=receiver.peer, ranks=(), for_restart=None,
                              **({"method": method, "bytes": bytes, "seconds": seconds} if ok
                                 else {"state": S.COPY_FAILED, "error": error[:2000]}))
            repo.record_copies(t.set_id, [copy])
            what = (f"{t.purpose} copy of {s.volume.volume_class} part {s.ref} from {receiver.peer} to "
                    f"{receiver.node}: " + (f"{(bytes or 0) / (1 << 20):.1f} MiB in {seconds or 0:.2f} s ({method})"
                                            if ok else f"failed: {error}"))
            repo.event(t.purpose, f"set {t.set_id}: {what}", job_id=job_id, set_id=t.set_id, node=receiver.node,
                       level="info" if ok else "error")
            return what

    def _mine(self, repo, task_id: int, node: str, kind: str | None):
        return self._check_mine(repo.node_task(task_id, lock=True), node, kind)

    @staticmethod
    def _check_mine(t, node: str, kind: str | None):
        if t.node != node or (kind is not None and t.kind != kind):
            raise errors.PermissionDenied(why=f"node task {t.id} is {t.node}'s {t.kind}, not {node}'s")
        return t

    def _deleted(self, repo, t, ok: bool, error: str, job_id: int) -> str:
        s = t.snapshot
        what = f"{'copy' if t.copy_id else 'part'} {s.ref} on {t.node}"
        if not ok:
            if t.copy_id is None:
                repo.set_snapshot_state(s.id, "DELETING", error=error[:4000])
            repo.event("prune", f"set {t.set_id} stays DELETING: {what}: {error}", job_id=job_id, set_id=t.set_id,
                       node=t.node, level="error")
            return f"{what} not deleted: {error}"
        if t.copy_id is not None:
            repo.set_copy_state(t.copy_id, S.COPY_DELETED)
        else:
            repo.set_snapshot_state(s.id, S.PART_DELETED)
        finish_deleting(repo, t.set_id, job_id)
        return f"{what} deleted"


def finish_deleting(repo, set_id: int, job_id: int) -> bool:
    """A DELETING set whose every part is deleted, no copy held and no task
    open is DELETED (prune, or the report of its last node task)."""
    st = repo.get_set(set_id, lock=True)
    if st.state != S.DELETING or repo.open_node_tasks(set_id=set_id):
        return False
    if repo.snapshots(set_id) or repo.copies(set_id, states=(S.COPY_OK,)):
        return False
    repo.transition(set_id, S.DELETED)
    repo.event("prune", f"set {set_id} deleted", job_id=job_id, set_id=set_id)
    return True


def queue_delete(repo, snap, *, node: str, copy_id: int | None = None) -> bool:
    """Have `node`'s agent delete a node-local part (or its copy there), once:
    False when such a task is open already."""
    for t in repo.open_node_tasks(snapshot_id=snap.id, purpose="prune"):
        if t.node == node and t.copy_id == copy_id:
            return False
    repo.add_node_task(node=node, kind="delete", purpose="prune", set_id=snap.set_id, snapshot_id=snap.id,
                       copy_id=copy_id)
    return True


def queue_transfer(repo, snap, *, to_node: str, purpose: str, parent=None) -> bool:
    """Have the part's node's agent stream it to `to_node`'s agent, once:
    False when a transfer of it to that node is open already."""
    for t in repo.open_node_tasks(snapshot_id=snap.id, purpose=purpose):
        if t.kind == "receive" and t.node == to_node:
            return False
    token = secrets.token_hex(16)
    recv = repo.add_node_task(node=to_node, kind="receive", purpose=purpose, set_id=snap.set_id,
                              snapshot_id=snap.id, peer=snap.node, token=token,
                              parent_id=parent.id if parent is not None else None)
    send = repo.add_node_task(node=snap.node, kind="send", purpose=purpose, set_id=snap.set_id, snapshot_id=snap.id,
                              peer=to_node, token=token, parent_id=parent.id if parent is not None else None)
    repo.pair_node_tasks(recv, send)
    return True


class RemoteNodeTasks:
    """The same operations through the controller's slurm-snap service."""

    def __init__(self, cfg):
        self.cfg = cfg

    def _call(self, op: str, **args):
        return hostops.call(self.cfg, LocalNodeTasks, OPS_METHODS, op, args)

    def tasks(self, **kw) -> list[TaskWork]:
        return self._call("node-tasks", **kw)

    def listening(self, **kw) -> None:
        self._call("node-task-listening", **kw)

    def finished(self, **kw) -> str:
        return self._call("node-task-finished", **kw)


def node_tasks_for(cfg, inventory):
    """This host's way to its tasks: the service when the config names it."""
    return RemoteNodeTasks(cfg) if cfg.via_service else LocalNodeTasks(cfg, inventory)


OPS_METHODS = {"node-tasks": "tasks", "node-task-listening": "listening", "node-task-finished": "finished"}


# What `serve` runs for them (root only).
OPS = hostops.served(LocalNodeTasks, OPS_METHODS)
