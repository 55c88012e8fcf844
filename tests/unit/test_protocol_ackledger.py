"""Acknowledgements recorded while the barrier is open: batches, not rows one
by one; a rewritten acknowledgement replaces its row; a failed batch is
redone from scratch before the cut; the inventory ends with what the
collector judged, on SQLite and PostgreSQL."""
from __future__ import annotations

import os
import threading
import time

import pytest

from protocol_fixtures import ROOT, make_env
from slurm_snap.inventory.repository import Inventory
from slurm_snap import states as S
from slurm_snap.protocol.ackledger import AckLedger
from slurm_snap.protocol.barrier import AckCollector, wait_for_barrier
from slurm_snap.protocol.coordinator import Coordinator
from testkit.inventory_helpers import sets_of_job

NODES = tuple(f"n{i}" for i in range(1, 9))


def _rows(inv, set_id):
    with inv.session() as repo:
        return sorted((a.node, a.rank, a.step) for a in repo.acks(set_id))


@pytest.fixture
def world(tmp_path, inventory):
    """An Env for the barrier directory and config, but the set lives in the
    parametrised `inventory` (SQLite or a real PostgreSQL)."""
    env = make_env(tmp_path, nodes=NODES, record=False)
    inv: Inventory = inventory
    from slurm_snap.jobrecords import VolumeRecord

    with inv.session() as repo:
        run = repo.record_job_run(job_id=env.job_id, restart_count=0, user_name="alice", uid=1000,
                                  nodes=list(NODES))
        repo.add_volumes(run, [VolumeRecord(path=f"/v/{n}", scope="node-local", volume_class="scratch",
                                          backend="test-copy", node=n) for n in NODES])
        st, _ = repo.create_set(run, epoch="e1", trigger="manual")
        set_id = st.id
    os.makedirs(env.ack_dir, exist_ok=True)
    collector = AckCollector(env.ack_dir, job_id=env.job_id, epoch="e1", nodes=NODES)
    yield env, inv, set_id, collector
    collector.close()


def test_flush_records_new_acks_then_only_what_changed(world):
    env, inv, set_id, collector = world
    ledger = AckLedger(inv, set_id, interval=0)
    for i, n in enumerate(NODES[:3]):
        env.ack(n, i, "e1", step=5)
    collector.rescan()
    with inv.session() as repo:
        assert ledger.flush(repo, collector) == 3
    assert _rows(inv, set_id) == [("n1", 0, 5), ("n2", 1, 5), ("n3", 2, 5)]
    with inv.session() as repo:
        assert ledger.flush(repo, collector) == 0          # nothing new: no statement at all
    # n2's rank rewrites its acknowledgement (a later step) and n4 arrives
    time.sleep(0.01)
    env.ack("n2", 1, "e1", step=6)
    env.ack("n4", 3, "e1", step=5)
    collector.rescan()
    with inv.session() as repo:
        assert ledger.flush(repo, collector) == 2
    assert _rows(inv, set_id) == [("n1", 0, 5), ("n2", 1, 6), ("n3", 2, 5), ("n4", 3, 5)]
    assert ledger.flushes == 2


def test_maybe_flush_waits_for_its_interval(world):
    env, inv, set_id, collector = world
    ledger = AckLedger(inv, set_id, interval=3600)
    env.ack("n1", 0, "e1")
    collector.rescan()
    ledger.maybe_flush(collector)
    assert _rows(inv, set_id) == []                        # too soon
    ledger.interval = 0
    ledger.maybe_flush(collector)
    assert _rows(inv, set_id) == [("n1", 0, 7)]


def test_a_failed_batch_is_redone_from_scratch(world, monkeypatch, caplog):
    env, inv, set_id, collector = world
    ledger = AckLedger(inv, set_id, interval=0)
    env.ack("n1", 0, "e1", step=5)
    collector.rescan()
    ledger.maybe_flush(collector)                           # committed
    time.sleep(0.01)
    env.ack("n1", 0, "e1", step=6)                          # rewritten ...
    env.ack("n2", 1, "e1", step=5)
    collector.rescan()
    real = inv.session

    def broken(*a, **k):
        raise RuntimeError("database went away")
    monkeypatch.setattr(inv, "session", broken)
    ledger.maybe_flush(collector)                           # ... but this batch fails: logged, not raised
    assert "recorded again before the cut" in caplog.text
    monkeypatch.setattr(inv, "session", real)
    with inv.session() as repo:
        ledger.flush(repo, collector)
    assert _rows(inv, set_id) == [("n1", 0, 6), ("n2", 1, 5)]


def test_wait_for_barrier_reports_progress_but_not_after_the_last_ack(world):
    env, _inv, _set_id, collector = world
    calls = []

    def progress():
        calls.append(len(collector.state.complete))

    def writer():
        for i, n in enumerate(NODES):
            time.sleep(0.02)
            env.ack(n, i, "e1")
    th = threading.Thread(target=writer)
    th.start()
    assert wait_for_barrier(collector, timeout=10, on_progress=progress)
    th.join()
    assert calls and max(calls) < len(NODES)              # never called once the barrier is complete


def test_coordinator_records_acks_before_the_cut(tmp_path):
    """Ranks acknowledge over 0.4 s: most rows are in the inventory before the
    barrier closes, and all of them, once each, when the set is done."""
    env = make_env(tmp_path, nodes=NODES)
    seen_at_barrier = []

    def signal(job_id):
        def run():
            epoch = env.request_epoch()
            for i, n in enumerate(NODES):
                time.sleep(0.05)
                env.ack(n, i, epoch, step=9)
        threading.Thread(target=run).start()

    def hook(phase):
        if phase == "barrier":
            with env.inv.session() as repo:
                st = sets_of_job(repo, env.job_id)[-1]
                seen_at_barrier.append(len(repo.acks(st.id)))

    out = Coordinator(env.cfg, env.inv, signaller=signal, caller=ROOT, hook=hook).snapshot(env.job_id, deadline=10)
    assert (out.state, out.consistency) == (S.COMPLETE, S.APP), out.reason
    assert seen_at_barrier and seen_at_barrier[0] >= len(NODES) // 2, seen_at_barrier
    rows = _rows(env.inv, out.set_id)
    assert rows == sorted((n, i, 9) for i, n in enumerate(NODES))
