"""nodetasks/ops.py against the server databases: the two ends of a
transfer reporting at the same moment.

Found on the dev cluster: two nodes' agents finished partner copies at once
and PostgreSQL aborted one report ("deadlock detected"): the sender's report
locked its send row and then the receive row, the receiver's its receive row
and then the send row. Here both reports are held, each after its first row
lock, until the other has taken its first too (or 3 s passed): with the two
locks taken in opposite orders that is a lock cycle every time; in one order
the second report waits for the first and both land."""
from __future__ import annotations

import threading

import pytest

import dbtemplates
from protocol_fixtures import make_env
from realcomponents import mariadb_url, pg_url, require
from slurm_snap import states as S
from slurm_snap.inventory.repository import Repository
from slurm_snap.nodetasks.ops import LocalNodeTasks
from slurm_snap.protocol import partner
from test_protocol_nodeloss import complete_set

HOLD = 3.0


@pytest.fixture(params=[pytest.param("postgresql", marks=pytest.mark.postgres),
                        pytest.param("mariadb", marks=pytest.mark.mariadb)])
def env(request, tmp_path):
    from sqlalchemy.exc import DBAPIError

    server = pg_url() if request.param == "postgresql" else mariadb_url()
    require(bool(server), f"no {request.param} server: scripts/test starts one")
    try:
        url = (dbtemplates.postgresql if request.param == "postgresql" else dbtemplates.mariadb)(server)
    except DBAPIError as exc:  # server down
        require(False, f"{request.param} at {server} unreachable: {exc}")
    e = make_env(tmp_path, nodes=("n1", "n2"), extra={"inventory": {"url": url}})
    assert not e.inv.url.startswith("sqlite")
    yield e
    e.inv.dispose()


def test_both_ends_of_a_transfer_report_at_once_and_both_land(env, monkeypatch):
    set_id = complete_set(env)
    assert len(partner.make_copies(env.cfg, env.inv)) == 2     # n1 -> n2 and n2 -> n1
    ops = LocalNodeTasks(env.cfg, env.inv)
    (recv,) = [t for t in ops.tasks(node="n2") if t.kind == "receive" and t.peer == "n1"]
    ops.listening(task_id=recv.id, node="n2", address="127.0.0.1:4242")
    (send,) = [t for t in ops.tasks(node="n1") if t.kind == "send" and t.peer == "n2"]
    assert send.token == recv.token and send.id != recv.id

    # Each report stops after its first row lock until the other took its first.
    held = threading.Barrier(2, timeout=HOLD)
    waited = threading.local()
    first_locks: list[int] = []
    node_task = Repository.node_task

    def holding(self, task_id, *, lock=False):
        row = node_task(self, task_id, lock=lock)
        if lock and not getattr(waited, "done", False):
            waited.done = True
            first_locks.append(task_id)
            try:
                held.wait()
            except threading.BrokenBarrierError:
                pass   # the other report waits for this one's lock: go on
        return row

    monkeypatch.setattr(Repository, "node_task", holding)
    results: dict[str, object] = {}

    def report(name, **kw):
        try:
            results[name] = ops.finished(**kw)
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            results[name] = exc

    threads = [threading.Thread(target=report, args=("send",),
                                kwargs=dict(task_id=send.id, node="n1", ok=True, method="send", bytes=10_000,
                                            seconds=0.1)),
               threading.Thread(target=report, args=("receive",),
                                kwargs=dict(task_id=recv.id, node="n2", ok=True, method="send", bytes=10_000,
                                            seconds=0.1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    failed = {k: v for k, v in results.items() if isinstance(v, Exception)}
    assert failed == {}, f"a report was lost: {failed}"
    # Both reports locked the lower id first: the other end's id never came first.
    assert first_locks == [min(send.id, recv.id)] * 2
    # Whichever report takes the lock first: a receive that lands first marks its
    # send DONE too (the part is there), so the send's own report then finds it done.
    sent = str(results["send"])
    assert (sent.startswith("sent part ") and sent.endswith(" to n2")) or sent == f"node task {send.id} was already DONE", sent
    assert "copy of scratch part" in str(results["receive"]) and "from n1 to n2" in str(results["receive"])
    with env.inv.session() as repo:
        assert {repo.node_task(i).state for i in (send.id, recv.id)} == {S.TASK_DONE}
        assert [(c.source_node, c.node, c.state) for c in repo.copies(set_id)] == [("n1", "n2", S.COPY_OK)]
