"""Issue 30 on the protocol's side: a node cuts its own parts when the
service (or the database) does not answer, keeps them in its spool and the
set completes when the spool is delivered; the sweeper finalizes a set left
in flight past its deadline, and a part delivered after that joins the set
(states.LATE_JOIN); a requeued run resumes from the shared files when the
service cannot be asked. Real SQLite inventory, real barrier directory, the
copying test backend."""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import threading
import time

import pytest

from protocol_fixtures import make_env
from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.jobdir import JobDir
from slurm_snap.jobrecords import JobRecord, VolumeRecord
from slurm_snap.nodeagent.agent import run_once
from slurm_snap.protocol import preempt
from slurm_snap.protocol.cutter import part_name
from slurm_snap.protocol.recorder import LocalRecorder
from slurm_snap.protocol.repair import repair, sweep
from slurm_snap.spool.outbox import Outbox
from testkit.inventory_helpers import sets_of_job

AWAY = "cannot reach the slurm-snap service at ctl:6830: timed out after 5 s (check the network path)"


@dataclasses.dataclass(frozen=True)
class Job:
    job_id: int
    restart_count: int
    node: str
    nodes: tuple
    uid: int = 0
    user: str = "root"

    def options(self) -> dict:
        return {"consistency": "app"}


class Away:
    """The service as a node sees it with its network cut: every operation
    fails to connect."""

    reply_timeout = None

    def __getattr__(self, name):
        def fail(**kw):
            raise errors.ServiceUnavailable(why=AWAY)
        return fail


def now():
    return dt.datetime.now(dt.timezone.utc)


@pytest.fixture
def env(tmp_path):
    env = make_env(tmp_path, nodes=("n1", "n2"), uid=0, user="root")
    vols = [VolumeRecord(path=env.local_paths[n], scope="node-local", volume_class="scratch", node=n)
            for n in env.nodes] + [VolumeRecord(path=env.shared_path, scope="shared", volume_class="pfs")]
    # What each node's Prolog wrote: the only description a node has without the inventory.
    JobDir(env.cfg.paths.barrier_dir, env.job_id).ensure(0).write_job(
        JobRecord(job_id=env.job_id, restart_count=0, user="root", nodes=env.nodes, volumes=tuple(vols)))
    return env


def on(env, node):
    """The configuration as `node` has it: its own spool, on its own disk."""
    return dataclasses.replace(env.cfg, spool=dataclasses.replace(env.cfg.spool,
                                                                  directory=f"{env.tmp}/spool-{node or 'ctl'}"))


def job(env, node):
    return Job(env.job_id, 1, node, env.nodes)   # the epilogs see the restart count already incremented


def ack_all(env, step=11):
    for i, node in enumerate(env.nodes):
        env.ack(node, i, "preempt-0", step=step, manifest=[env.write_checkpoint(node, i, step=step)],
                signalled_at=now() - dt.timedelta(seconds=3))


def the_set(env):
    with env.inv.session() as repo:
        (st,) = sets_of_job(repo, env.job_id)
        return st, repo.snapshots(st.id), repo.events(set_id=st.id)


def resume_while(env, later):
    """The requeued run's head Prolog asks for its resume point while
    `later` runs 1.5 s after: the answer, which must have waited for it."""
    def run():
        time.sleep(1.5)
        later()
    t = threading.Thread(target=run)
    t0 = time.monotonic()
    t.start()
    try:
        resume = preempt.prepare_resume(env.cfg, env.inv, job(env, "n1"), budget=20)
    finally:
        t.join()
    assert 1.5 <= time.monotonic() - t0 < 10
    return resume


def test_a_node_cut_off_cuts_its_parts_and_the_set_completes_when_its_spool_is_delivered(env):
    ack_all(env)
    t_pre = (now() - dt.timedelta(seconds=5)).timestamp()
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre)
    out = preempt.epilog_cut(on(env, "n1"), Away(), job(env, "n1"), preempt_time=t_pre)
    assert "without the inventory" in out and AWAY in out and "kept in its spool" in out, out
    # cut under names the node computes alone, the snapshots on disk
    for path in (env.local_paths["n1"], env.shared_path):
        name = part_name(env.job_id, 0, "n1" if path != env.shared_path else "", path)
        assert os.path.exists(os.path.join(os.path.dirname(path), ".snapshots", name, "ckpt-rank0.pt")) or \
            os.path.isdir(os.path.join(os.path.dirname(path), ".snapshots", name))
    jd = JobDir(env.cfg.paths.barrier_dir, env.job_id)
    assert os.path.exists(jd.release_path("preempt-0"))          # the ranks were not left waiting
    assert set(jd.read_cuts("preempt-0")) == {"n1"}
    box = Outbox.of(on(env, "n1"))
    (name,) = box.names()
    spooled = box.read(name)
    assert spooled.set_id is None and spooled.offline == AWAY and len(spooled.parts) == 2 and len(spooled.acks) == 2
    # n2 reaches the inventory: its part is recorded, the set waits for n1's
    assert "1/3 parts in" in preempt.epilog_cut(on(env, "n2"), env.inv, job(env, "n2"), preempt_time=t_pre)
    assert the_set(env)[0].state == S.CUTTING
    # n1's agent, once the service answers: the set is complete, nothing was lost
    report = run_once(on(env, "n1"), recorder=LocalRecorder(env.cfg, env.inv))
    assert not report.away and report.results[0].done == 1 and box.names() == []
    st, parts, events = the_set(env)
    assert (st.state, st.consistency, st.parts_consistency) == (S.COMPLETE, S.APP, S.APP), st.reason
    assert sorted((p.node, p.state) for p in parts) == [("", "CUT"), ("n1", "CUT"), ("n2", "CUT")]
    assert any("without the inventory" in e.message and AWAY in e.message for e in events)
    # delivered again (a crash between delivery and removal): nothing changes
    again = LocalRecorder(env.cfg, env.inv).deliver(entry=spooled)
    assert again.state == S.COMPLETE and len(the_set(env)[1]) == 3


def test_the_sweeper_finalizes_past_its_bound_and_a_late_part_joins_the_set(env):
    ack_all(env)
    t_pre = (now() - dt.timedelta(seconds=5)).timestamp()
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre)
    preempt.epilog_cut(on(env, "n2"), env.inv, job(env, "n2"), preempt_time=t_pre)
    preempt.epilog_cut(on(env, "n1"), Away(), job(env, "n1"), preempt_time=t_pre)
    deadline = the_set(env)[0].deadline
    # not before deadline + sweep_after
    assert sweep(env.cfg, env.inv, clock=lambda: deadline + dt.timedelta(seconds=env.cfg.service.sweep_after - 1)) == []
    (a,) = sweep(env.cfg, env.inv, clock=lambda: deadline + dt.timedelta(seconds=env.cfg.service.sweep_after + 1))
    st, _parts, _e = the_set(env)
    assert (a.new_state, st.state) == (S.PARTIAL, S.PARTIAL) and a.orphans == [] and a.undelivered == []
    # No restore point (issue 30 item 3); of its parts, only what the
    # recorded facts show: n1's acknowledgements wait in n1's spool too.
    assert (st.consistency, st.parts_consistency) == (S.NONE, S.CRASH) and not S.resumable(st.state, st.consistency)
    assert "barrier incomplete on 1 of 2 nodes (n1)" in st.reason
    # the late part, from n1's spool
    run_once(on(env, "n1"), recorder=LocalRecorder(env.cfg, env.inv))
    st, parts, events = the_set(env)
    assert (st.state, st.consistency) == (S.COMPLETE, S.APP), st.reason
    assert len(parts) == 3 and S.resumable(st.state, st.consistency)
    assert any("delivered late; PARTIAL -> COMPLETE" in e.message for e in events), [e.message for e in events]


def test_a_set_nobody_delivered_to_is_failed_then_completed_by_late_parts(env):
    ack_all(env)
    t_pre = (now() - dt.timedelta(seconds=5)).timestamp()
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre)
    for n in env.nodes:
        preempt.epilog_cut(on(env, n), Away(), job(env, n), preempt_time=t_pre)
    later = the_set(env)[0].deadline + dt.timedelta(hours=1)
    (a,) = sweep(env.cfg, env.inv, clock=lambda: later)
    assert a.new_state == S.FAILED and "a part a node delivers later joins the set" in a.reason
    for n in env.nodes:
        run_once(on(env, n), recorder=LocalRecorder(env.cfg, env.inv))
    st, parts, _e = the_set(env)
    assert (st.state, st.consistency, len(parts)) == (S.COMPLETE, S.APP, 3), st.reason


def test_a_part_delivered_after_prune_goes_to_prune(env):
    ack_all(env)
    preempt.epilog_cut(on(env, "n2"), env.inv, job(env, "n2"))
    preempt.epilog_cut(on(env, "n1"), Away(), job(env, "n1"))
    later = the_set(env)[0].deadline + dt.timedelta(hours=1)
    sweep(env.cfg, env.inv, clock=lambda: later)
    with env.inv.session() as repo:
        st = sets_of_job(repo, env.job_id)[0]
        repo.transition(st.id, S.DELETING)
        repo.transition(st.id, S.DELETED)
    run_once(on(env, "n1"), recorder=LocalRecorder(env.cfg, env.inv))
    st, parts, events = the_set(env)
    assert st.state == S.DELETING and any("the next prune removes them" in e.message for e in events)


@pytest.mark.parametrize("trigger", ["preempt", "timelimit"])
def test_repair_by_hand_leaves_a_nodes_undelivered_part_alone(env, trigger):
    """A time-limit set's parts are cut under the names a node computes
    alone, as a preemption's: not orphans to remove."""
    ack_all(env)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), (now() - dt.timedelta(seconds=5)).timestamp(),
                                 trigger=trigger)
    preempt.epilog_cut(on(env, "n2"), Away(), job(env, "n2"), trigger=trigger)
    later = the_set(env)[0].deadline + dt.timedelta(hours=1)
    (a,) = repair(env.cfg, env.inv, clock=lambda: later)
    assert a.new_state == S.FAILED and a.orphans == [] and len(a.undelivered) == 1 and "on n2" in a.undelivered[0]
    name = part_name(env.job_id, 0, "n2", env.local_paths["n2"])
    assert os.path.isdir(os.path.join(os.path.dirname(env.local_paths["n2"]), ".snapshots", name))


def test_a_time_limit_set_cut_without_the_inventory_is_one_when_delivered(env):
    """--snapshot-before-timelimit, the service away at the cut and nobody
    having opened the set: the trigger travels in the cut records and the
    spool entries, and the set the delivery opens is a time-limit set whose
    nodes came back at the limit."""
    ack_all(env)
    ended = now() - dt.timedelta(seconds=2)
    t_pre = (ended - dt.timedelta(seconds=180)).timestamp()
    for n in env.nodes:
        out = preempt.epilog_cut(on(env, n), Away(), job(env, n), preempt_time=t_pre, killed_at=ended.timestamp(),
                                 trigger="timelimit")
        assert "kept in its spool" in out, out
    jd = JobDir(env.cfg.paths.barrier_dir, env.job_id)
    assert {r.trigger for r in jd.read_cuts("preempt-0").values()} == {"timelimit"}
    for n in env.nodes:
        box = Outbox.of(on(env, n))
        assert [box.read(name).trigger for name in box.names()] == ["timelimit"]
        run_once(on(env, n), recorder=LocalRecorder(env.cfg, env.inv))
    st, parts, _e = the_set(env)
    assert (st.trigger, st.state, st.consistency, len(parts)) == ("timelimit", S.COMPLETE, S.APP, 3), st.reason
    assert st.release == "limit" and abs((st.released_at - ended).total_seconds()) < 0.01


def test_a_requeued_runs_resume_point_waits_for_a_time_limit_set_in_flight(env):
    ack_all(env)
    t_pre = (now() - dt.timedelta(seconds=5)).timestamp()
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre, trigger="timelimit")

    def cut():
        for n in env.nodes:
            preempt.epilog_cut(on(env, n), env.inv, job(env, n), preempt_time=t_pre, trigger="timelimit")
    resume = resume_while(env, cut)
    st = the_set(env)[0]
    assert st.trigger == "timelimit" and resume is not None and resume.set_id == st.id and resume.step == 11


def test_without_the_inventory_a_path_the_prolog_would_refuse_is_not_cut(env):
    ack_all(env)
    out = preempt.epilog_cut(on(env, "n2"), Away(), job(env, "n2"),
                             refusal=lambda v: "a symbolic link" if v.node == "n2" else "")
    assert "cut 0/1 volumes" in out, out
    box = Outbox.of(on(env, "n2"))
    (name,) = box.names()
    (part,) = box.read(name).parts
    assert part.state == "MISSING" and "the Prolog refused this path (a symbolic link)" in part.error


def test_the_ranks_say_preempted_when_slurm_cannot_be_asked(env):
    assert preempt.ranks_saw_preemption(env.cfg, job(env, "n1")) == ""
    ack_all(env)
    assert preempt.ranks_saw_preemption(env.cfg, job(env, "n1")) == "every local rank of n1 acknowledged preempt-0"


def test_a_requeued_run_resumes_from_the_shared_files_when_the_service_is_away(env):
    ack_all(env)
    for n in env.nodes:
        preempt.epilog_cut(on(env, n), Away(), job(env, n), preempt_time=(now() - dt.timedelta(seconds=5)).timestamp())
    jd = JobDir(env.cfg.paths.barrier_dir, env.job_id)
    # The requeued run's other Prologs may replace job.json before its head
    # node's asks: the preempted run is described by the cut records.
    jd.write_job(dataclasses.replace(jd.read_job(), restart_count=1, nodes=("n9",), volumes=()))
    resume = preempt.prepare_resume(env.cfg, Away(), job(env, "n1"))
    assert resume is not None and resume.set_id == "preempt-0" and resume.step == 11 and resume.missing == ()
    assert jd.read_resume() == resume
    r0 = resume.rank(0)
    name = part_name(env.job_id, 0, "n1", env.local_paths["n1"])
    assert r0.checkpoint.endswith(f"/.snapshots/{name}/ckpt-rank0.pt") and os.path.getsize(r0.checkpoint) == 100
    # on other nodes, a node-local part cannot be moved without the controller: named missing
    moved = preempt.prepare_resume(env.cfg, Away(), Job(env.job_id, 1, "n3", ("n3", "n4")))
    assert moved.rank(0).checkpoint is None and "could not be asked" in moved.rank(0).missing
    # an incomplete barrier is no resume point: the service's error stands
    os.unlink(os.path.join(env.ack_dir, "n2.1.json"))
    with pytest.raises(errors.ServiceUnavailable):
        preempt.prepare_resume(env.cfg, Away(), job(env, "n1"))


def test_a_run_prologslurmctld_never_recorded_is_recorded_from_the_spool(tmp_path):
    """The database was away when the job started (PrologSlurmctld failed)
    and when it was preempted: the nodes' entries carry job.json, and the
    first delivery records the run and its volumes; the set completes."""
    env = make_env(tmp_path, nodes=("n1", "n2"), uid=0, user="root", record=False)
    vols = [VolumeRecord(path=env.local_paths[n], scope="node-local", volume_class="scratch", node=n)
            for n in env.nodes] + [VolumeRecord(path=env.shared_path, scope="shared", volume_class="pfs")]
    JobDir(env.cfg.paths.barrier_dir, env.job_id).ensure(0).write_job(
        JobRecord(job_id=env.job_id, restart_count=0, user="root", nodes=env.nodes, volumes=tuple(vols)))
    ack_all(env)
    for n in env.nodes:
        preempt.epilog_cut(on(env, n), Away(), job(env, n))
    for n in env.nodes:
        run_once(on(env, n), recorder=LocalRecorder(env.cfg, env.inv))
    st, parts, events = the_set(env)
    assert (st.state, st.consistency, len(parts)) == (S.COMPLETE, S.APP, 3), st.reason
    with env.inv.session() as repo:
        run = repo.find_job_run(env.job_id, 0)
        assert run is not None and sorted(run.nodes) == ["n1", "n2"] and len(repo.volumes(run)) == 3
        assert run.options.get("consistency") == "app"
        assert any("PrologSlurmctld had not recorded it" in e.message for e in repo.events(job_id=env.job_id))


def cut_offline_never_recorded(tmp_path):
    """The database away from the job's start (PrologSlurmctld recorded
    nothing) to its cut: every node cut its node-local part into its spool."""
    env = make_env(tmp_path, nodes=("n1", "n2"), uid=0, user="root", record=False)
    vols = [VolumeRecord(path=env.local_paths[n], scope="node-local", volume_class="scratch", node=n)
            for n in env.nodes]
    JobDir(env.cfg.paths.barrier_dir, env.job_id).ensure(0).write_job(
        JobRecord(job_id=env.job_id, restart_count=0, user="root", nodes=env.nodes, volumes=tuple(vols)))
    ack_all(env)
    for n in env.nodes:
        preempt.epilog_cut(on(env, n), Away(), job(env, n))
    return env


def test_a_requeued_runs_resume_point_waits_for_the_parts_still_in_the_spools(tmp_path):
    """The fault suite's MariaDB finding: the database away from the job's
    start to its cut, back before the requeued run's head Prolog asks; the
    nodes' entries are still in their spools (their agents back off), so the
    inventory has no set yet. The resume point waits (within half the
    Prolog's budget) until the cut records' parts are delivered."""
    env = cut_offline_never_recorded(tmp_path)

    def deliver():
        for n in env.nodes:
            run_once(on(env, n), recorder=LocalRecorder(env.cfg, env.inv))
    resume = resume_while(env, deliver)
    st = the_set(env)[0]
    assert resume is not None and resume.set_id == st.id and resume.step == 11 and resume.missing == ()
    # Nothing to wait for when the inventory already holds every part the records name.
    t0 = time.monotonic()
    assert preempt.prepare_resume(env.cfg, env.inv, job(env, "n1"), budget=20).set_id == st.id
    assert time.monotonic() - t0 < 1.5


def test_a_resume_point_waits_no_longer_than_its_limit_for_a_spool_never_delivered(tmp_path):
    env = cut_offline_never_recorded(tmp_path)
    t0 = time.monotonic()
    assert preempt.prepare_resume(env.cfg, env.inv, job(env, "n1"), budget=3) is None
    assert 1.4 <= time.monotonic() - t0 < 4
