"""protocol.partner and the node tasks that make and delete copies
(slurm_snap/nodetasks): after the cut every node-local part gets a copy on
the job's next node, streamed by the nodes' agents (the second set's
incrementally against the first's); the set then survives the loss of any
one node (show, report), and repair keeps it COMPLETE when a node goes.
Prune hands node-local parts and copies to their nodes' agents and the set
is DELETED when the last one reports. The stream itself is
test_nodetasks_stream.py; here the agents' passes run for real with the
stream replaced."""
from __future__ import annotations

import threading
import time

import pytest

from protocol_fixtures import make_env
from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.nodetasks import agent, stream
from slurm_snap.nodetasks.ops import LocalNodeTasks
from slurm_snap.protocol import partner
from slurm_snap.protocol.repair import repair
from slurm_snap.report.show import survives_node_loss
from test_protocol_nodeloss import Present, complete_set


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path, nodes=("n1", "n2"))


class FakeStream:
    """The two agents' ends as stream.py's receive/send behave, without the
    wire: the receiver listens (the service hears of it) and waits for its
    sender; the sender's pass finds it and sends; `fail_to` receivers fail
    with no space once their sender came."""

    def __init__(self, monkeypatch, fail_to=()):
        self.sent, self.fail_to, self.came = [], set(fail_to), {}
        monkeypatch.setattr(stream, "receive", self.receive)
        monkeypatch.setattr(stream, "send", self.send)
        monkeypatch.setattr(stream, "own_address", lambda host: "127.0.0.1")

    def receive(self, backend, ref, *, node, token, address, munge_socket, on_listening, wait, timeout, idle):
        came = self.came.setdefault(token, threading.Event())
        on_listening(f"{address}:4242")
        end = time.monotonic() + 10
        while not came.wait(0.2):
            if time.monotonic() > end:
                raise errors.Timeout(what="a sender for the transfer", seconds=wait)
            idle()
        if node in self.fail_to:
            raise errors.CommandFailed(argv0="btrfs receive", status=1, stderr="No space left on device")
        return stream.Moved("send", 10_000, 0.1)

    def send(self, backend, ref, *, address, token, to_node, munge_socket, parent, timeout):
        self.sent.append((ref.ref, to_node, address, parent.ref if parent else None))
        self.came.setdefault(token, threading.Event()).set()
        if to_node in self.fail_to:
            raise errors.BackendError(backend="test", why=f"the receiver on {to_node}: No space left on device")
        return stream.Moved("send-incremental" if parent else "send", 100 if parent else 10_000, 0.1)


def agents(env, nodes=("n1", "n2"), seconds: float = 20.0):
    """Each node's agent passing again and again side by side (the timer's
    passes, faster), until no node has an open task."""
    stop = threading.Event()

    def loop(node):
        while not stop.is_set():
            agent.run_pass(env.cfg, env.inv, node=node)
            time.sleep(0.1)

    threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            with env.inv.session() as repo:
                if not repo.open_node_tasks():
                    return
            time.sleep(0.1)
        raise AssertionError("node tasks still open after the agents' passes")
    finally:
        stop.set()
        for t in threads:
            t.join(30)


def test_partner_is_the_next_node_of_the_job():
    assert partner.partner_of("n1", ["n1", "n2", "n3"]) == "n2"
    assert partner.partner_of("n3", ["n1", "n2", "n3"]) == "n1"
    assert partner.partner_of("n1", ["n1"]) is None


def test_the_agents_make_each_partner_copy_incremental_from_the_second_set(env, monkeypatch):
    from slurm_snap.inventory.repository import SetFilter
    from slurm_snap.report.columns import parse_format
    from slurm_snap.report.load import load_rows

    def survives_in_report():
        with env.inv.session() as repo:
            (row,) = load_rows(repo, SetFilter(job_ids=(env.job_id,)), need_snaps=True)
            return row.survives_node_loss()

    fake = FakeStream(monkeypatch)
    first = complete_set(env)
    assert survives_in_report() is False        # report's Survives column: "no"
    queued = partner.make_copies(env.cfg, env.inv)
    assert len(queued) == 2 and partner.make_copies(env.cfg, env.inv) == []    # queued once
    ops = LocalNodeTasks(env.cfg, env.inv)
    # n1's send waits until n2's agent listens for it.
    assert [t.kind for t in ops.tasks(node="n1")] == ["receive"]
    assert survives_in_report() is False        # queued is not copied
    n2 = threading.Thread(target=agent.run_pass, args=(env.cfg, env.inv), kwargs={"node": "n2"})
    n2.start()                                  # n2 listens for n1's part...
    deadline = time.monotonic() + 10
    while not [t for t in ops.tasks(node="n1") if t.kind == "send"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    (send,) = [t for t in ops.tasks(node="n1") if t.kind == "send"]
    assert send.address == "127.0.0.1:4242" and send.peer == "n2" and len(send.token) == 32
    agents(env, ("n1", "n2"))                   # ...which n1's pass sends
    n2.join(30)
    assert survives_in_report() is True
    assert any(f.column.name == "Survives" for f in parse_format("JobID,Survives"))
    with env.inv.session() as repo:
        st = repo.report_set_detail(first)
        assert survives_node_loss(st, repo.copies(first)) is True
        assert sorted((c.source_node, c.node, c.method, c.state) for c in repo.copies(first)) == \
            [("n1", "n2", "send", "OK"), ("n2", "n1", "send", "OK")]
        assert repo.open_node_tasks(set_id=first) == []
        parent_refs = [p.ref for p in repo.snapshots(first) if p.node]
    # A second set of the same run, its parts on the same volumes: incremental
    # against the first set's parts, which both ends hold.
    from slurm_snap.clock import utcnow
    from slurm_snap.inventory.records import SnapshotRecord

    with env.inv.session() as repo:
        run = repo.get_set(first).job_run
        second = repo.create_set(run, epoch="p-2", trigger="periodic")[0].id
        repo.record_parts(second, [SnapshotRecord(volume_id=p.volume_id, backend=p.backend, name=p.name + "-2",
                                                  ref=p.ref + "-2", path=p.path + "-2", node=p.node,
                                                  cut_started_at=utcnow(), cut_at=utcnow())
                                   for p in repo.snapshots(first)])
        for state in (S.CUTTING, S.CUT, S.COMPLETE):  # PENDING -> CUTTING: crash-consistent path
            repo.transition(second, state)
    fake.sent.clear()
    assert len(partner.make_copies(env.cfg, env.inv)) == 2
    agents(env)
    assert sorted((r, parent) for r, _to, _a, parent in fake.sent) == sorted((p + "-2", p) for p in parent_refs)
    with env.inv.session() as repo:
        assert sorted(c.method for c in repo.copies(second)) == ["send-incremental", "send-incremental"]


def test_a_failed_partner_copy_is_recorded_and_the_set_says_it_would_not_survive(env, monkeypatch):
    FakeStream(monkeypatch, fail_to={"n1"})
    set_id = complete_set(env)
    partner.make_copies(env.cfg, env.inv)
    agents(env)
    with env.inv.session() as repo:
        assert sorted((c.node, c.state) for c in repo.copies(set_id)) == [("n1", "FAILED"), ("n2", "OK")]
        assert repo.open_node_tasks(set_id=set_id) == []      # its send half failed with it
        assert survives_node_loss(repo.report_set_detail(set_id), repo.copies(set_id)) is False
    # n2 lost: its part has a copy on n1? No: that copy failed, so the set is PARTIAL.
    (a,) = repair(env.cfg, env.inv, node_check=True, backend_on=Present(), node_states={"n2": ("down", "disk")})
    assert a.new_state == S.PARTIAL


def test_prune_hands_node_local_parts_and_copies_to_the_nodes_agents(env, monkeypatch):
    import os

    from slurm_snap.retention.prune import NodesPending, Pruner

    FakeStream(monkeypatch)
    set_id = complete_set(env)
    partner.make_copies(env.cfg, env.inv)
    agents(env)
    repair(env.cfg, env.inv, node_check=True, backend_on=Present(), node_states={"n2": ("down", "disk")})
    shared = []

    class SharedBackend:
        def delete(self, ref):
            shared.append(ref.ref)
            return True

    with pytest.raises(NodesPending) as pending:
        Pruner(env.inv, lambda snap: SharedBackend()).delete_set(set_id, why="test")
    # n2 is lost: nothing is asked of it; n1 deletes its own part and n2's copy it holds.
    assert pending.value.nodes == ["n1"]
    with env.inv.session() as repo:
        assert repo.get_set(set_id).state == S.DELETING
        assert sorted((t.node, t.kind, t.copy_id is not None) for t in repo.open_node_tasks(set_id=set_id)) == \
            [("n1", "delete", False), ("n1", "delete", True)]
        own = [p.ref for p in repo.snapshots(set_id) if p.node == "n1"][0]
    with pytest.raises(NodesPending):          # a second prune queues nothing twice
        Pruner(env.inv, lambda snap: SharedBackend()).delete_set(set_id, why="test")
    done = agent.run_pass(env.cfg, env.inv, node="n1")
    assert done.done == 2 and not done.errors, done
    assert not os.path.exists(own)             # deleted by n1's agent, on n1's disk
    with env.inv.session() as repo:
        st = repo.get_set(set_id)
        parts = {p.node: p.state for p in repo.snapshots(set_id, include_deleted=True) if p.node}
        copies = sorted((c.node, c.state) for c in repo.copies(set_id))
    assert st.state == S.DELETED and parts == {"n1": "DELETED", "n2": "DELETED"}
    assert copies == [("n1", "DELETED"), ("n2", "LOST")] and len(shared) == 1   # pfs, by the controller


def test_an_agent_acts_only_inside_a_node_local_class_of_its_node(env):
    from slurm_snap.nodetasks.ops import TaskWork

    ok = TaskWork(id=1, kind="delete", purpose="prune", set_id=1, volume_class="scratch", backend="test-copy",
                  volume="/v", name="s", ref=f"{env.tmp}/scratch/n1/jobs/.snapshots/s", origin="n1")
    assert agent._backend(env.cfg, "n1", ok).name == "test-copy"
    import dataclasses

    for bad in (dataclasses.replace(ok, ref="/etc/passwd"), dataclasses.replace(ok, ref=f"{env.tmp}/scratch/n1/../x"),
                dataclasses.replace(ok, volume_class="pfs"), dataclasses.replace(ok, backend="btrfs")):
        with pytest.raises(errors.BadValueError):
            agent._backend(env.cfg, "n1", bad)


def test_a_node_cannot_report_another_nodes_task(env, monkeypatch):
    FakeStream(monkeypatch)
    complete_set(env)
    partner.make_copies(env.cfg, env.inv)
    ops = LocalNodeTasks(env.cfg, env.inv)
    (recv,) = ops.tasks(node="n2")[:1]
    with pytest.raises(errors.PermissionDenied):
        ops.finished(task_id=recv.id, node="n1", ok=True)
    with pytest.raises(errors.PermissionDenied):
        ops.listening(task_id=recv.id, node="n1", address="10.0.0.9:1")
