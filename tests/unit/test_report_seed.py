"""A small inventory at fixed times, shared by the report/show/metrics tests.

NOW is 2026-11-30T12:00:00Z and times print in UTC, so the expected tables in
the tests are exact. Sets go through the repository's own verbs (create_set,
transition, record_parts) so the fixture has the shapes the coordinator
writes; acks, drills and events are added as rows because their verbs stamp
the wall clock, which an exact expected table cannot follow.
"""
from __future__ import annotations

import datetime as dt

import pytest

from slurm_snap import access
from slurm_snap.cli.context import Ctx
from slurm_snap.inventory.models import BarrierAck, Event, RestoreTest
from slurm_snap.inventory.repository import Inventory, SnapshotRecord
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap import states as S

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
ROOT = access.Caller(uid=0, name="root")
ALICE = access.Caller(uid=2001, name="alice")
BOB = access.Caller(uid=2002, name="bob")
OPER = access.Caller(uid=2010, name="oper")


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def secs(t: dt.datetime, s: float) -> dt.datetime:
    return t + dt.timedelta(seconds=s)


def _set(repo, run, vols, *, epoch, trigger, requested, final, consistency, verified=None, reason="",
         parts=None, skew=0.25, step=500, expected=None):
    """One set along the real state machine; phase times are offsets from `requested`."""
    st, _ = repo.create_set(run, epoch=epoch, trigger=trigger, requested_at=requested)
    if final == S.FAILED:
        repo.transition(st.id, S.QUIESCING, at=secs(requested, 1))
        repo.transition(st.id, S.FAILED, at=secs(requested, 61), reason=reason, failed_nodes=["n4"])
        return st
    repo.transition(st.id, S.QUIESCING, at=secs(requested, 1))
    repo.update_set(st.id, barrier_at=secs(requested, 3))
    repo.transition(st.id, S.CUTTING, at=secs(requested, 3.5))
    recs = [SnapshotRecord(volume_id=v.id, backend=v.backend, name=f"{epoch}-{v.id}", ref=f"ref-{epoch}-{v.id}",
                           path=f"{v.path}/.snap/{epoch}", node=v.node, cut_started_at=secs(requested, 3.5),
                           cut_at=secs(requested, 3.75 if v.node else 4), site=v.site, region=v.region,
                           manifest_ok=True)
            for v in (vols if parts is None else vols[:parts])]
    repo.record_parts(st.id, recs)
    repo.transition(st.id, S.CUT, at=secs(requested, 4))
    fields = dict(consistency=consistency, skew_seconds=skew, checkpoint_step=step, manifest_ok=True,
                  reason=reason)
    if expected is not None:
        fields["expected_parts"] = expected
    repo.transition(st.id, final, at=secs(requested, 5), **fields)
    if verified is not None:
        repo.transition(st.id, S.VERIFIED, at=verified)
    return st


def seed(url: str) -> dict[str, int]:
    """Sets (ids in creation order): A 1001 VERIFIED, B 1001 COMPLETE, D 1002.0 VERIFIED yesterday,
    C 1002.1 PARTIAL, E 1003 FAILED two days ago."""
    inv = Inventory(url)
    inv.upgrade()
    ids = {}
    with inv.session() as repo:
        r1 = repo.record_job_run(job_id=1001, restart_count=0, user_name="alice", uid=2001, partition="gpu",
                                 nodes=["n1", "n2"])
        v1 = repo.add_volumes(r1, [
            VolumeRecord(path="/scratch/n1/jobs/1001", scope="node-local", volume_class="scratch",
                       backend="btrfs", node="n1", site="lab", region="eu"),
            VolumeRecord(path="/pfs/jobs/1001", scope="shared", volume_class="pfs", backend="xfs-reflink",
                       site="lab", region="eu"),
        ])
        r20 = repo.record_job_run(job_id=1002, restart_count=0, user_name="bob", uid=2002, partition="gpu",
                                  nodes=["n3"])
        v20 = repo.add_volumes(r20, [VolumeRecord(path="/pfs/jobs/1002", scope="shared", volume_class="pfs",
                                                backend="xfs-reflink", site="lab", region="us")])
        r21 = repo.record_job_run(job_id=1002, restart_count=1, user_name="bob", uid=2002, partition="gpu",
                                  nodes=["n3"])
        v21 = repo.add_volumes(r21, [
            VolumeRecord(path="/pfs/jobs/1002", scope="shared", volume_class="pfs", backend="xfs-reflink",
                       site="lab", region="us"),
            VolumeRecord(path="/tank/jobs/1002", scope="shared", volume_class="tank", backend="zfs",
                       site="lab", region="us"),
        ])
        r3 = repo.record_job_run(job_id=1003, restart_count=0, user_name="carol", uid=2003, partition="cpu",
                                 nodes=["n4"])
        repo.add_volumes(r3, [VolumeRecord(path="/pfs/jobs/1003", scope="shared", volume_class="pfs",
                                         backend="xfs-reflink")])

        a = _set(repo, r1, v1, epoch="m-1", trigger="manual", requested=at("2026-11-30T09:00:00"),
                 final=S.COMPLETE, consistency=S.APP, verified=at("2026-11-30T10:00:00"))
        b = _set(repo, r1, v1, epoch="m-2", trigger="manual", requested=at("2026-11-30T11:00:00"),
                 final=S.COMPLETE, consistency=S.APP, step=600)
        d = _set(repo, r20, v20, epoch="preempt-0", trigger="preempt", requested=at("2026-11-29T20:00:00"),
                 final=S.COMPLETE, consistency=S.APP, verified=at("2026-11-29T21:00:00"), step=100)
        # D's job gave its nodes back 12 s after the signal: rank 0 requeued it.
        repo.update_set(d.id, released_at=secs(at("2026-11-29T20:00:00"), 12), release="early")
        c = _set(repo, r21, v21, epoch="preempt-1", trigger="preempt", requested=at("2026-11-30T10:30:00"),
                 final=S.PARTIAL, consistency=S.CRASH, reason="zfs: snapshot failed: pool busy", parts=1,
                 skew=None, step=None)
        e = _set(repo, r3, [], epoch="m-1", trigger="manual", requested=at("2026-11-28T08:00:00"),
                 final=S.FAILED, consistency=S.NONE, reason="barrier timeout: n4 sent no ack")
        ids.update(A=a.id, B=b.id, C=c.id, D=d.id, E=e.id)

        t = at("2026-11-30T09:00:00")
        repo.s.add_all([
            BarrierAck(set_id=a.id, node=node, rank=rank, local_rank=rank % 2, local_size=2, step=500,
                       written_at=secs(t, w), received_at=secs(t, w + 0.1), manifest=[])
            for node, rank, w in (("n1", 0, 2.0), ("n1", 1, 2.2), ("n2", 2, 2.5), ("n2", 3, 2.9))
        ])
        repo.s.add(RestoreTest(set_id=a.id, command="python train.py --resume", target="/restore/1", result="PASSED",
                               started_at=at("2026-11-30T09:30:00"), finished_at=at("2026-11-30T09:32:00"),
                               first_step=501, time_to_first_step=42.5, reason="", slurm_job_id=5001))
        repo.s.add(RestoreTest(set_id=d.id, command="python train.py --resume", target="/restore/2", result="PASSED",
                               started_at=at("2026-11-29T20:30:00"), finished_at=at("2026-11-29T20:31:00"),
                               first_step=101, time_to_first_step=17.5, reason=""))
        repo.s.add_all([
            Event(at=secs(t, 1), job_id=1001, set_id=a.id, node="", kind="phase", level="info",
                  message="signalled 4 ranks"),
            Event(at=secs(t, 3.5), job_id=1001, set_id=a.id, node="n1", kind="cut", level="info",
                  message="btrfs subvolume snapshot -r"),
            Event(at=at("2026-11-30T08:59:00"), job_id=1001, set_id=None, node="n2", kind="prolog",
                  level="warning", message="scratch quota near limit"),
            Event(at=secs(t, 2), job_id=1002, set_id=None, node="n3", kind="prolog", level="info",
                  message="prolog ran"),
        ])
    inv.dispose()
    return ids


def write_config(tmp_path, url: str, operators=("root",)) -> str:
    path = tmp_path / "slurm-snap.toml"
    ops = ", ".join(f'"{o}"' for o in operators)
    path.write_text(f'[inventory]\nurl = "{url}"\n\n[access]\noperator_users = [{ops}]\n')
    return str(path)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def seeded(request, tmp_path):
    """A copy of the seeded inventory (seeded once per session: dbtemplates)."""
    import dbtemplates

    if request.param == "sqlite":
        url = dbtemplates.sqlite(tmp_path / "inv.db", key="report_seed", build=seed)
    else:
        from realcomponents import pg_url, require
        from sqlalchemy.exc import DBAPIError

        server = pg_url()
        require(bool(server), "no PostgreSQL: run scripts/postgres start /var/tmp/slurm-snap-pg "
                              "or set SLURM_SNAP_TEST_PG_URL")
        try:
            url = dbtemplates.postgresql(server, key="report_seed", build=seed)
        except DBAPIError as exc:  # server down
            require(False, f"PostgreSQL at {server} unreachable: {exc}")
    ids = dict(dbtemplates.built(request.param, "report_seed"))
    return {"url": url, "ids": ids, "config": write_config(tmp_path, url, operators=("root", "oper"))}


def make_ctx(config_path: str, caller: access.Caller) -> Ctx:
    ctx = Ctx(config_path=config_path)
    ctx.caller = caller
    ctx.now = NOW
    ctx.tz = UTC
    return ctx


def invoke(command, args, config_path: str, caller: access.Caller = ROOT):
    """Run one command object the way the group would, with an injected caller and clock."""
    from click.testing import CliRunner

    from slurm_snap import errors

    ctx = make_ctx(config_path, caller)
    result = CliRunner().invoke(command, args, obj=ctx, catch_exceptions=True)
    code = result.exit_code
    if isinstance(result.exception, errors.SnapError):
        code = result.exception.exit_code
    elif result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return code, result.output, result.exception


def test_seed_builds_the_documented_sets(seeded):
    inv = Inventory(seeded["url"])
    with inv.session() as repo:
        states = {k: repo.get_set(v).state for k, v in seeded["ids"].items()}
    inv.dispose()
    assert states == {"A": "VERIFIED", "B": "COMPLETE", "C": "PARTIAL", "D": "VERIFIED", "E": "FAILED"}
