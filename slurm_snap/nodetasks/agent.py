"""Node tasks, the node's side: one pass of its agent does what the service
has for this node (ops.py), as root, on the node's own disk, and clears
what drill jobs left behind.

  delete    a node-local part, or the copy of one this node holds (prune)
  receive   listen, take a part from its node's agent (stream.py)
  send      stream a part to the agent that listens for it
(Drill directories a drill job's Epilog could not remove are the drill's
own pass of the agent: restore/onnode.py sweep_leftovers.)

Every path the service names is checked here before root acts on it: the
task's class must be a node-local class of this node with the same backend,
and the part inside that class's tree on this node.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field

from .. import errors
from ..backends.base import SnapshotRef
from . import stream
from .ops import TaskWork, node_tasks_for

log = logging.getLogger(__name__)

# A receiver waits this long for its sender's agent: two passes of the
# shipped timer (30 s), so the sender's next pass finds it listening.
RECEIVE_WAIT = 75.0


@dataclass
class TasksReport:
    done: int = 0
    left: int = 0
    away: str = ""                  # the service did not answer: why
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def node_name(cfg) -> str:
    """This node's Slurm name: [node] name, else the short host name."""
    return cfg.node.name or socket.gethostname().split(".", 1)[0]


def _backend(cfg, node: str, t: TaskWork):
    vc = cfg.volume_class(t.volume_class)
    if vc is None or vc.scope != "node-local" or vc.backend != t.backend:
        raise errors.BadValueError(what="node task class", value=t.volume_class,
                                   why=f"is not a node-local {t.backend} class on {node}")
    # A copy keeps its original's path: the class's tree as the cutting node has it.
    prefix = os.path.normpath(vc.prefix_for(t.origin or node))
    for path in filter(None, (t.ref, t.parent_ref)):
        if not os.path.isabs(path) or os.path.normpath(path) != path or not path.startswith(prefix + "/"):
            raise errors.BadValueError(what="node task path", value=path, why=f"is not inside {prefix}")
    from ..backends.factory import backend_for_class

    return backend_for_class(cfg, vc, node, local=True)


def _ref(t: TaskWork, parent: bool = False) -> SnapshotRef:
    if parent:
        return SnapshotRef(backend=t.backend, volume=t.volume, name=t.parent_name, ref=t.parent_ref,
                           path=t.parent_path or None)
    return SnapshotRef(backend=t.backend, volume=t.volume, name=t.name, ref=t.ref, path=t.path or None)


def run_pass(cfg, inventory=None, *, ops=None, node: str | None = None, rounds: int = 20) -> TasksReport:
    """This node's tasks; a task that fails is reported FAILED with why (its
    part stays as it was); the service away ends the pass.

    Sends and deletes first, then one receive, then ask again: a receive
    waits for its sender, and two nodes copying to each other (partners of
    a 2-node job) would each wait for the other's send forever if neither
    sent before it listened; a send whose receiver started listening while
    this node listened is made meanwhile, beside the receive
    (_SendsMeanwhile)."""
    node = node or node_name(cfg)
    ops = ops or node_tasks_for(cfg, inventory)
    report = TasksReport()
    for _ in range(rounds):
        try:
            tasks = ops.tasks(node=node)
        except (errors.ServiceUnavailable, errors.InventoryError) as exc:
            report.away = str(exc)
            return report
        quick = [t for t in tasks if t.kind != "receive"]
        waits = [t for t in tasks if t.kind == "receive"][:1]
        if not quick and not waits:
            return report
        for i, t in enumerate(quick + waits):
            if not _one(cfg, ops, node, t, report):
                report.left = len(quick) + len(waits) - i
                return report
    return report


def _one(cfg, ops, node: str, t: TaskWork, report: TasksReport) -> bool:
    """One task done and reported; False when the service is away."""
    result: dict = {}
    try:
        backend = _backend(cfg, node, t)
        result = _do(cfg, ops, node, t, backend, report)
        ok, error = True, ""
    except (errors.ServiceUnavailable, errors.InventoryError) as exc:
        report.away = str(exc)
        return False
    except Exception as exc:  # noqa: BLE001 -- one task's failure is reported, never the pass's end
        ok, error = False, str(exc) if isinstance(exc, errors.SnapError) else f"{type(exc).__name__}: {exc}"
    try:
        line = ops.finished(task_id=t.id, node=node, ok=ok, error=error[:4000], **result)
    except (errors.ServiceUnavailable, errors.InventoryError) as exc:
        report.away = str(exc)
        return False
    report.done += 1
    (report.lines if ok else report.errors).append(f"task {t.id} ({t.kind}): {line}")
    return True


class _SendsMeanwhile:
    """The sends others wait for, made while this node waits for its own
    sender, in a thread beside the receiver's accept loop, never in its
    place: two partners (each node of a 2-node job sends its part to the
    other) both listen, then both send; a send waits for its receiver's
    handshake, which a receiver blocked in its own send never gives, so
    each side's send timed out and every partner copy failed (the dev
    cluster's 16:20 run). One thread at a time; start() is the receiver's
    idle call (about every second)."""

    def __init__(self, cfg, ops, node: str, report: TasksReport):
        self.cfg, self.ops, self.node, self.report = cfg, ops, node, report
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.thread = threading.Thread(target=self._run, name=f"sends-of-{self.node}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for other in self.ops.tasks(node=self.node):
                if other.kind == "send":
                    _one(self.cfg, self.ops, self.node, other, self.report)
        except errors.SnapError:
            pass   # the receive goes on; the pass reports what it could
        except Exception as exc:  # noqa: BLE001 -- a thread's error is the pass's line, never lost
            self.report.errors.append(f"sends while receiving: {type(exc).__name__}: {exc}")

    def join(self, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout)


def _do(cfg, ops, node: str, t: TaskWork, backend, report: TasksReport) -> dict:
    budget = cfg.restore.partner_budget
    if t.kind == "delete":
        backend.delete(_ref(t))   # already gone counts as deleted: the contract's idempotence
        return {}
    if t.kind == "receive":
        from ..service.address import service_address

        host = service_address(cfg.inventory.url)[0] if cfg.via_service else "127.0.0.1"
        sends = _SendsMeanwhile(cfg, ops, node, report)
        try:
            moved = stream.receive(backend, _ref(t), node=node, token=t.token, address=stream.own_address(host),
                                   munge_socket=cfg.service.munge_socket, wait=RECEIVE_WAIT, timeout=budget,
                                   on_listening=lambda addr: ops.listening(task_id=t.id, node=node, address=addr),
                                   idle=sends.start)
        finally:
            # A send under way ends (each is bounded by the budget) before the
            # pass asks for its tasks again: none is ever made twice at once.
            sends.join(budget + stream.HANDSHAKE_TIMEOUT)
        # The sender streams against the parent when the task names one.
        method = "send-incremental" if moved.method == "send" and t.parent_ref else moved.method
        return {"method": method, "bytes": moved.bytes, "seconds": round(moved.seconds, 6)}
    if t.kind == "send":
        moved = stream.send(backend, _ref(t), address=t.address, token=t.token, to_node=t.peer,
                            munge_socket=cfg.service.munge_socket, parent=_ref(t, True) if t.parent_ref else None,
                            timeout=budget)
        return {"method": moved.method, "bytes": moved.bytes, "seconds": round(moved.seconds, 6)}
    raise errors.BadValueError(what="node task kind", value=t.kind, why="is not delete, send or receive")
