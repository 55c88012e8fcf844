"""Node tasks (node_task, migration 0013): work on a node's own disk that
its agent pulls from the service (slurm_snap/nodetasks): deletes of
node-local parts and copies for prune, the two halves of a partner copy."""
from __future__ import annotations

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased, selectinload

from .. import states as S
from ..clock import utcnow
from ..errors import NotFound
from .models import NodeTask, Snapshot


class NodeTaskQueries:
    """Mixed into inventory.repository.Repository; `self.s` is the transaction's session."""

    s: Session

    def add_node_task(self, *, node: str, kind: str, purpose: str, set_id: int, snapshot_id: int,
                      copy_id: int | None = None, parent_id: int | None = None, peer: str = "",
                      token: str = "") -> NodeTask:
        now = utcnow()
        task = NodeTask(node=node, kind=kind, purpose=purpose, set_id=set_id, snapshot_id=snapshot_id,
                        copy_id=copy_id, parent_id=parent_id, peer=peer, token=token, state=S.TASK_PENDING,
                        error="", method="", address="", created_at=now, updated_at=now)
        self.s.add(task)
        self.s.flush()
        return task

    def pair_node_tasks(self, a: NodeTask, b: NodeTask) -> None:
        a.pair_id, b.pair_id = b.id, a.id
        self.s.flush()

    def node_task(self, task_id: int, *, lock: bool = False) -> NodeTask:
        q = select(NodeTask).where(NodeTask.id == task_id)
        task = self.s.scalar(q.with_for_update() if lock else q)
        if task is None:
            raise NotFound(what="node task", value=str(task_id))
        return task

    def lock_node_task_pair(self, task_id: int) -> tuple[NodeTask, NodeTask | None]:
        """A task and its pair (the other end of a transfer; None for a
        delete), both row-locked, the lower id first whichever end asks. The
        two ends of a transfer report at about the same moment (a send and
        its receive; two nodes copying to each other): each locking its own
        row and then the other's made a lock cycle, which PostgreSQL ends by
        aborting one report (deadlock detected)."""
        # pair_id is written once, when the transfer is queued (pair_node_tasks):
        # reading it unlocked gives the row to lock.
        pair_id = self.s.scalar(select(NodeTask.pair_id).where(NodeTask.id == task_id))
        rows = {i: self.node_task(i, lock=True) for i in sorted({task_id, pair_id or task_id})}
        return rows[task_id], rows.get(pair_id) if pair_id else None

    def tasks_for_node(self, node: str) -> list[NodeTask]:
        """What `node`'s agent does now: its pending deletes and receives,
        and the sends whose receiver listens already; oldest first."""
        pair = aliased(NodeTask)
        ready_send = and_(NodeTask.kind == "send", NodeTask.state == S.TASK_PENDING,
                          select(pair.id).where(pair.id == NodeTask.pair_id, pair.state == S.TASK_LISTENING).exists())
        other = and_(NodeTask.kind != "send", NodeTask.state == S.TASK_PENDING)
        q = (select(NodeTask).where(NodeTask.node == node, ready_send | other)
             .options(selectinload(NodeTask.snapshot).selectinload(Snapshot.volume)).order_by(NodeTask.id))
        return list(self.s.scalars(q))

    def open_node_tasks(self, *, set_id: int | None = None, snapshot_id: int | None = None,
                        purpose: str | None = None) -> list[NodeTask]:
        q = select(NodeTask).where(NodeTask.state.in_(S.TASK_OPEN))
        if set_id is not None:
            q = q.where(NodeTask.set_id == set_id)
        if snapshot_id is not None:
            q = q.where(NodeTask.snapshot_id == snapshot_id)
        if purpose is not None:
            q = q.where(NodeTask.purpose == purpose)
        return list(self.s.scalars(q.order_by(NodeTask.id)))

    def failed_node_tasks(self, snapshot_id: int, *, kind: str, purpose: str, copy_id: int | None = None) -> int:
        q = select(func.count(NodeTask.id)).where(NodeTask.snapshot_id == snapshot_id, NodeTask.kind == kind,
                                                  NodeTask.purpose == purpose, NodeTask.state == S.TASK_FAILED)
        if copy_id is not None:
            q = q.where(NodeTask.copy_id == copy_id)
        return int(self.s.scalar(q) or 0)

    def snapshot_row(self, snapshot_id: int) -> Snapshot:
        snap = self.s.get(Snapshot, snapshot_id)
        if snap is None:
            raise NotFound(what="snapshot", value=str(snapshot_id))
        return snap
