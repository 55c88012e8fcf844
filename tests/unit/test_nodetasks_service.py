"""The node tasks' operations through a real `slurm-snap serve` (MUNGE, the
service's bounds), as a node's agent calls them (RemoteNodeTasks): pull,
listening, both ends' reports."""
from __future__ import annotations

from slurm_snap import config
from slurm_snap import states as S
from slurm_snap.nodetasks.ops import RemoteNodeTasks
from slurm_snap.protocol import partner
from test_service import munge_socket, service  # noqa: F401  (fixtures)


def test_an_agent_pulls_and_reports_a_transfer_through_the_service(service):  # noqa: F811
    assert len(partner.make_copies(service.cfg, service.inv)) == 2
    ops = RemoteNodeTasks(config.load(service.client))
    (recv,) = [t for t in ops.tasks(node="n2") if t.kind == "receive"]
    assert [t.kind for t in ops.tasks(node="n1")] == ["receive"]      # n1's send waits for n2 to listen
    ops.listening(task_id=recv.id, node="n2", address="127.0.0.1:4242")
    (send,) = [t for t in ops.tasks(node="n1") if t.kind == "send"]
    assert (send.address, send.token, send.peer) == ("127.0.0.1:4242", recv.token, "n2")
    assert ops.finished(task_id=send.id, node="n1", ok=True, method="send", bytes=10, seconds=0.1).startswith(
        "sent part ")
    line = ops.finished(task_id=recv.id, node="n2", ok=True, method="send", bytes=10, seconds=0.1)
    assert "from n1 to n2" in line, line
    with service.inv.session() as repo:
        assert [(c.source_node, c.node, c.state) for c in repo.copies(service.set_id)] == [("n1", "n2", S.COPY_OK)]
