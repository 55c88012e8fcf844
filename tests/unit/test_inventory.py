"""Repository tests, run on SQLite and on a real PostgreSQL (the `inventory` fixture)."""
import datetime as dt
import os
import stat
import threading

import pytest

from slurm_snap import errors
from slurm_snap.inventory.models import JobRun
from slurm_snap.inventory.repository import Inventory, SetFilter, SnapshotRecord
from slurm_snap.jobrecords import Ack, ManifestEntry, VolumeRecord
from slurm_snap import states as S
from testkit.inventory_helpers import sets_of_job

T0 = dt.datetime(2026, 11, 30, 10, 0, tzinfo=dt.timezone.utc)


pytestmark = pytest.mark.slow(18)   # seconds idle: the unit run starts this file early (tests/conftest.py)


def _job(repo, job_id=100, restart=0, user="alice"):
    run = repo.record_job_run(job_id=job_id, restart_count=restart, user_name=user, uid=1000,
                              partition="low", nodes=["n1", "n2", "n3"], options={"on_preempt": True})
    vols = repo.add_volumes(run, [VolumeRecord(f"/scratch/{n}/jobs/{job_id}", "node-local", "scratch", "btrfs", n)
                                  for n in ("n1", "n2", "n3")]
                            + [VolumeRecord(f"/pfs/jobs/{job_id}", "shared", "pfs", "btrfs")])
    return run, vols


def test_job_run_and_volumes_idempotent(inventory):
    with inventory.session() as repo:
        run, vols = _job(repo)
        assert len(vols) == 4
    with inventory.session() as repo:
        run2, vols2 = _job(repo)  # Slurm may run a hook twice
        assert run2.id == run.id
        assert [v.id for v in vols2] == [v.id for v in vols]
        assert repo.job_run(100).label == "100"
        with pytest.raises(errors.NotFound):
            repo.job_run(999)


def test_every_allowed_transition_and_a_forbidden_one(inventory):
    path = [S.PENDING, S.QUIESCING, S.CUTTING, S.CUT, S.COMPLETE, S.VERIFIED, S.FAILED_RESTORE, S.VERIFIED,
            S.DELETING, S.DELETED]
    with inventory.session() as repo:
        run, _ = _job(repo)
        st, created = repo.create_set(run, epoch="e1", trigger="manual", requested_at=T0)
        assert created and st.state == S.PENDING and st.expected_parts == 4
        for new in path[1:]:
            repo.transition(st.id, new)
        st = repo.get_set(st.id)
        assert st.state == S.DELETED
        for stamp in ("signalled_at", "cut_started_at", "cut_done_at", "finished_at", "verified_at"):
            assert getattr(st, stamp) is not None, stamp
        assert st.requested_at == T0


@pytest.mark.parametrize("old,new", [(S.PENDING, S.COMPLETE), (S.QUIESCING, S.COMPLETE), (S.FAILED, S.COMPLETE),
                                     (S.DELETED, S.PENDING), (S.PARTIAL, S.VERIFIED), (S.COMPLETE, S.PENDING)])
def test_forbidden_transitions(inventory, old, new):
    route = {S.PENDING: [], S.QUIESCING: [S.QUIESCING], S.FAILED: [S.FAILED],
             S.DELETED: [S.FAILED, S.DELETING, S.DELETED], S.PARTIAL: [S.CUTTING, S.PARTIAL],
             S.COMPLETE: [S.CUTTING, S.CUT, S.COMPLETE]}[old]
    with inventory.session() as repo:
        run, _ = _job(repo)
        st, _ = repo.create_set(run, epoch="e", trigger="manual")
        for step in route:
            repo.transition(st.id, step)
        with pytest.raises(errors.InvalidTransition) as ei:
            repo.transition(st.id, new)
        assert f"{old} -> {new}" in str(ei.value)
        assert ei.value.exit_code == errors.CONFLICT
    with inventory.session() as repo:
        assert repo.get_set(st.id).state == old  # nothing changed


@pytest.mark.parametrize("old,new", sorted(S.LATE_JOIN))
def test_late_part_edges_are_a_late_deliverys_alone(inventory, old, new):
    """states.LATE_JOIN: a finalized set moves again only when a late part is
    delivered (transition(..., late=True)); every other caller is refused."""
    route = {S.PARTIAL: [S.CUTTING, S.PARTIAL], S.FAILED: [S.FAILED],
             S.DELETED: [S.FAILED, S.DELETING, S.DELETED]}[old]
    with inventory.session() as repo:
        run, _ = _job(repo)
        st, _ = repo.create_set(run, epoch="e", trigger="preempt")
        for step in route:
            repo.transition(st.id, step)
        with pytest.raises(errors.InvalidTransition):
            repo.transition(st.id, new)
        repo.transition(st.id, new, late=True, consistency=S.APP if new == S.COMPLETE else None)
        assert repo.get_set(st.id).state == new


def test_a_set_that_is_no_point_never_carries_a_points_label(inventory):
    """states.labels_for in the repository: PARTIAL (or FAILED) keeps what its
    parts earned as parts_consistency, its own label is none."""
    with inventory.session() as repo:
        run, _ = _job(repo)
        st, _ = repo.create_set(run, epoch="e", trigger="manual")
        repo.transition(st.id, S.CUTTING)
        repo.transition(st.id, S.PARTIAL, consistency=S.APP)
        got = repo.get_set(st.id)
        assert (got.consistency, got.parts_consistency) == (S.NONE, S.APP)
        repo.transition(st.id, S.COMPLETE, late=True, consistency=S.APP)
        got = repo.get_set(st.id)
        assert (got.consistency, got.parts_consistency) == (S.APP, S.APP)


def test_all_transitions_in_table_are_accepted(inventory):
    """Walk every edge of the state machine from a fresh set."""
    def route_to(state):
        routes = {S.PENDING: [], S.QUIESCING: [S.QUIESCING], S.CUTTING: [S.CUTTING], S.CUT: [S.CUTTING, S.CUT],
                  S.COMPLETE: [S.CUTTING, S.CUT, S.COMPLETE], S.VERIFIED: [S.CUTTING, S.CUT, S.COMPLETE, S.VERIFIED],
                  S.FAILED_RESTORE: [S.CUTTING, S.CUT, S.COMPLETE, S.FAILED_RESTORE],
                  S.PARTIAL: [S.CUTTING, S.PARTIAL], S.FAILED: [S.FAILED], S.ROLLED_BACK: [S.ROLLED_BACK],
                  S.DELETING: [S.FAILED, S.DELETING], S.DELETED: [S.FAILED, S.DELETING, S.DELETED]}
        return routes[state]

    n = 0
    with inventory.session() as repo:
        run, _ = _job(repo)
        for old, news in S.TRANSITIONS.items():
            for new in news:
                n += 1
                st, _ = repo.create_set(run, epoch=f"e{n}", trigger="manual")
                for step in route_to(old):
                    repo.transition(st.id, step)
                assert repo.transition(st.id, new).state == new
    assert n == sum(len(v) for v in S.TRANSITIONS.values())


def test_create_set_idempotent_per_epoch(inventory):
    with inventory.session() as repo:
        run, _ = _job(repo)
        a, c1 = repo.create_set(run, epoch="preempt-0", trigger="preempt")
        b, c2 = repo.create_set(run, epoch="preempt-0", trigger="preempt")
        assert c1 and not c2 and a.id == b.id


def test_create_set_finds_the_set_another_transaction_committed_meanwhile(inventory):
    """EpilogSlurmctld and the node Epilogs open one preemption set at once.
    A transaction that read before the winner committed must still land in
    the winner's set (MariaDB's REPEATABLE READ kept it reading its first
    snapshot: the loser's re-select found nothing)."""
    with inventory.session() as repo:
        run_id = _job(repo)[0].id
    looked, committed, out = threading.Event(), threading.Event(), {}

    def loser():
        try:
            with inventory.session() as repo:
                repo.acks(0)                 # the transaction has read: its snapshot exists
                looked.set()
                committed.wait(10)
                st, created = repo.create_set(repo.s.get(JobRun, run_id), epoch="preempt-0", trigger="preempt")
                out["got"] = (st.id, created)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            out["error"] = repr(exc)
        finally:
            looked.set()

    t = threading.Thread(target=loser)
    with inventory.session() as repo:
        won, created = repo.create_set(repo.s.get(JobRun, run_id), epoch="preempt-0", trigger="preempt")
        won_id = won.id
        t.start()
        # SQLite serializes writers (the loser waits to begin): nothing to wait for there.
        looked.wait(2)
    committed.set()
    t.join(30)
    assert created and out == {"got": (won_id, False)}, out


def test_acks_snapshots_and_queries(inventory):
    with inventory.session() as repo:
        run, vols = _job(repo)
        st, _ = repo.create_set(run, epoch="e1", trigger="manual", requested_at=T0)
        acks = [Ack(node=f"n{i}", rank=i - 1, local_rank=0, local_size=1, step=7,
                    written_at=T0 + dt.timedelta(seconds=i), manifest=(ManifestEntry("/x", 3),), world_size=3,
                    agreement="collective")
                for i in (1, 2, 3)]
        assert repo.record_acks(st.id, acks) == 3
        assert repo.record_acks(st.id, acks) == 0  # re-read barrier files: no duplicates
        parts = [SnapshotRecord(volume_id=v.id, backend="btrfs", name=f"s-{v.id}", ref=f"/snap/{v.id}",
                                path=f"/snap/{v.id}", node=v.node, cut_started_at=T0, cut_at=T0) for v in vols]
        assert repo.record_parts(st.id, parts) == 4
        assert repo.record_parts(st.id, parts) == 0  # a rerun keeps what was recorded
        repo.transition(st.id, S.CUTTING)
        repo.transition(st.id, S.CUT)
        repo.transition(st.id, S.COMPLETE, consistency=S.APP, checkpoint_step=7)
        repo.transition(st.id, S.VERIFIED)
    with inventory.session() as repo:
        assert [a.node for a in repo.acks(st.id)] == ["n1", "n2", "n3"]
        back = repo.ack_records(st.id)
        assert [(a.world_size, a.agreement, a.independent, a.manifest) for a in back] == \
            [(3, "collective", False, (ManifestEntry("/x", 3),))] * 3
        assert all(a.seen_at is not None for a in back)
        assert len(repo.snapshots(st.id)) == 4
        assert repo.newest_set(100).id == st.id
        assert 100 in repo.newest_verified_by_job([100])
        # an aggregate's time (SQLite hands it back as text) is aware UTC again
        newest = {user: t for _job, user, t in repo.report_job_rpo(T0 - dt.timedelta(hours=1))}
        assert newest["alice"].tzinfo is not None
        rows = repo.report_set_rows(SetFilter(users=["alice"], start=T0 - dt.timedelta(hours=1)))
        assert [r["set_id"] for r in rows] == [st.id]
        assert list(repo.report_set_rows(SetFilter(users=["bob"]))) == []
        assert list(repo.report_set_rows(SetFilter(job_runs=[(100, 1)]))) == []
        assert (S.VERIFIED, S.APP, 1) in repo.count_sets_by()


def test_utc_roundtrip_and_naive_refused(inventory):
    with inventory.session() as repo:
        run, _ = _job(repo)
        st, _ = repo.create_set(run, epoch="e", trigger="manual",
                                requested_at=dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2))))
    with inventory.session() as repo:
        got = repo.get_set(st.id).requested_at
        assert got == dt.datetime(2026, 1, 1, 10, tzinfo=dt.timezone.utc) and got.utcoffset() == dt.timedelta(0)
    with pytest.raises(Exception, match="naive"):
        with inventory.session() as repo:
            run = repo.job_run(100)
            repo.create_set(run, epoch="naive", trigger="manual", requested_at=dt.datetime(2026, 1, 1))
    with inventory.session() as repo:  # the failed transaction left nothing behind
        assert [s.epoch for s in sets_of_job(repo, 100)] == ["e"]


def test_concurrent_writers_no_lock_errors(inventory):
    """Many threads registering at once: nothing lost, no 'database is locked'."""
    errs = []

    def worker(i):
        try:
            inv = Inventory(inventory.url)
            for k in range(5):
                with inv.session() as repo:
                    run = repo.record_job_run(job_id=1000 + i, restart_count=k, user_name="u", uid=1)
                    repo.add_volumes(run, [VolumeRecord(f"/v/{i}/{k}", "shared", "pfs", "btrfs")])
            inv.dispose()
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errs.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errs == []
    with inventory.session() as repo:
        assert sum(len(repo.volumes(repo.job_run(1000 + i, k))) for i in range(8) for k in range(5)) == 40


def test_sqlite_file_not_world_readable(tmp_path):
    inv = Inventory(f"sqlite:///{tmp_path}/inv.db")
    inv.upgrade()
    with inv.session() as repo:
        repo.event("test", "x")
    mode = stat.S_IMODE(os.stat(tmp_path / "inv.db").st_mode)
    assert mode & 0o077 == 0, oct(mode)


def test_unreachable_inventory_is_inventory_error(tmp_path):
    inv = Inventory("postgresql+psycopg2://nobody@127.0.0.1:1/none")
    with pytest.raises(errors.InventoryError) as ei:
        with inv.session() as repo:
            repo.event("x", "y")
    assert ei.value.exit_code == errors.INVENTORY


def test_db_upgrade_cli(tmp_path, write_config, capsys):
    from slurm_snap.cli import main

    path = write_config(f"[inventory]\nurl = 'sqlite:///{tmp_path}/cli.db'\n")
    assert main(["--config", path, "db", "upgrade"]) == 0
    from slurm_snap.inventory.db import head_revision
    assert f"revision {head_revision()}" in capsys.readouterr().out
    assert main(["--config", path, "db", "status"]) == 0


def test_readonly_session_does_not_wait_behind_a_writer(tmp_path):
    """report/show read beside a writer holding the lock (SQLite WAL)."""
    import time as _time

    inv = Inventory(f"sqlite:///{tmp_path}/inv.db", busy_timeout=0.5)
    inv.upgrade()
    with inv.session() as repo:
        _job(repo)
    other = Inventory(inv.url, busy_timeout=0.5)
    with other.session() as writer:  # holds BEGIN IMMEDIATE until the block ends
        writer.event("x", "holding the write lock")
        t0 = _time.monotonic()
        with inv.session(readonly=True) as reader:
            assert reader.job_run(100).user_name == "alice"
        assert _time.monotonic() - t0 < 0.4
        with pytest.raises(errors.InventoryError, match="locked"):
            with inv.session() as blocked_writer:
                blocked_writer.event("y", "must wait and give up")
    other.dispose()
    inv.dispose()
