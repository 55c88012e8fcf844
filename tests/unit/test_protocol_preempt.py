"""The preemption path: EpilogSlurmctld opens the set, each node's Epilog
cuts its share, the last one finalizes; the requeued run's Prolog gets
resume.json. Real SQLite inventory, real barrier directory, copying backend."""
from __future__ import annotations

import datetime as dt
import os
import threading
from dataclasses import dataclass

import pytest

from protocol_fixtures import make_env
from slurm_snap.jobdir import JobDir
from slurm_snap.errors import NotFound
from slurm_snap.protocol import preempt
from slurm_snap import states as S
from slurm_snap.protocol.cutter import part_name
from slurm_snap.protocol.recorder import LocalRecorder
from slurm_snap.spool.records import SpoolEntry
from slurm_snap.protocol.repair import repair
from testkit.inventory_helpers import sets_of_job


@dataclass(frozen=True)
class Job:
    job_id: int
    restart_count: int
    node: str
    nodes: tuple
    uid: int = 1000
    user: str = "alice"


def now():
    return dt.datetime.now(dt.timezone.utc)


@pytest.fixture
def env(tmp_path):
    return make_env(tmp_path, nodes=("n1", "n2"))


def ranks_ack_at_preemption(env, epoch="preempt-0", step=11):
    for i, node in enumerate(env.nodes):
        env.ack(node, i, epoch, step=step, manifest=[env.write_checkpoint(node, i, step=step)])


def job(env, node, restart_count=1):
    # In the epilogs of a preempted run SLURM_JOB_RESTART_COUNT is already incremented.
    return Job(env.job_id, restart_count, node, env.nodes)


def the_set(env):
    with env.inv.session() as repo:
        (st,) = sets_of_job(repo, env.job_id)
        return st, repo.snapshots(st.id), repo.acks(st.id), repo.events(set_id=st.id)


def test_mark_then_every_epilog_gives_one_app_consistent_set(env):
    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    set_id = preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp()).set_id
    st, _p, _a, _e = the_set(env)
    assert (st.id, st.state, st.epoch, st.trigger) == (set_id, S.QUIESCING, "preempt-0", "preempt")
    assert abs((st.requested_at - t_pre).total_seconds()) < 1e-3 and st.signalled_at == st.requested_at
    with env.inv.session() as repo:  # the run that was preempted, not the incremented count
        assert repo.get_set(set_id).job_run.restart_count == 0

    r2 = preempt.epilog_cut(env.cfg, env.inv, job(env, "n2"), preempt_time=t_pre.timestamp())
    assert "n2 cut 1/1 volumes; 1/3 parts in" in r2
    assert the_set(env)[0].state == S.CUTTING
    r1 = preempt.epilog_cut(env.cfg, env.inv, job(env, "n1"), preempt_time=t_pre.timestamp())
    assert r1 == f"set {set_id} COMPLETE app-consistent"
    st, parts, acks, events = the_set(env)
    assert (st.state, st.consistency, st.checkpoint_step, st.reason) == (S.COMPLETE, S.APP, 11, "")
    assert sorted((p.node, p.state) for p in parts) == [("", "CUT"), ("n1", "CUT"), ("n2", "CUT")]
    assert len(acks) == 2 and sum("finalized by" in e.message for e in events) == 1
    assert os.path.exists(os.path.join(env.job_dir, "release", "preempt-0"))
    # What GraceTime is tuned with: the last acknowledgement, and the nodes
    # given back when Slurm killed the job (no early release here).
    assert st.barrier_at == max(a.written_at for a in acks)
    assert (st.release, abs((st.released_at - t_pre).total_seconds()) < 1e-3) == ("grace", True)

    # a repeated Epilog (Slurm may run a hook twice) changes nothing
    assert "already COMPLETE" in preempt.epilog_cut(env.cfg, env.inv, job(env, "n1"))
    assert len(the_set(env)[1]) == 3


def test_resume_json_points_into_the_snapshot(env):
    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp())
    for n in ("n1", "n2"):
        preempt.epilog_cut(env.cfg, env.inv, job(env, n), preempt_time=t_pre.timestamp())
    # the requeued run: its Prolog records run 1 and prepares resume.json
    with env.inv.session() as repo:
        repo.record_job_run(job_id=env.job_id, restart_count=1, user_name="alice", uid=1000, nodes=["n1", "n2"])
    data = preempt.prepare_resume(env.cfg, env.inv, job(env, "n1")).to_json()
    resume = JobDir(os.path.dirname(env.job_dir), env.job_id).read_resume().to_json()
    assert resume == {"set_id": data["set_id"], "step": 11, "checkpoint": data["checkpoint"],
                      "ranks": data["ranks"], "missing": []}
    # Same nodes again: each rank's own checkpoint, in its own node's snapshot.
    assert {r: (e["node"], e["from"], e["missing"]) for r, e in resume["ranks"].items()} == \
        {"0": ("n1", "n1", ""), "1": ("n2", "n2", "")}
    assert resume["ranks"]["1"]["checkpoint"].endswith("/ckpt-rank1.pt")
    live, snap = resume["checkpoint"]["live"], resume["checkpoint"]["snapshot"]
    assert live == os.path.join(env.local_paths["n1"], "ckpt-rank0.pt")
    # Named by what the node knows alone (job, preempted run, node, path).
    assert snap.endswith("/.snapshots/" + part_name(env.job_id, 0, "n1", env.local_paths["n1"]) + "/ckpt-rank0.pt")
    with open(live, "wb") as f:
        f.write(b"training went on and overwrote it")
    assert os.path.getsize(snap) == 100  # the snapshot kept the acknowledged checkpoint


def test_requeued_onto_other_nodes_brings_each_ranks_part_and_names_what_is_missing(env, monkeypatch):
    """Ranks are mapped by position: rank 0 (n1) -> n3, rank 1 (n2) -> n4.
    The move to n3 succeeds, the one to n4 does not: resume.json, the
    inventory's copies and the events say so, and the run is not refused."""
    from slurm_snap.inventory.records import CopyRecord
    from slurm_snap.protocol import nodelocal

    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp())
    for n in ("n1", "n2"):
        preempt.epilog_cut(env.cfg, env.inv, job(env, n), preempt_time=t_pre.timestamp())
    asked = {}

    def fake_execute(cfg, moves, *, budget, for_restart, purpose="restore", backend_on=None):
        asked["moves"] = sorted((m.part.node, m.to_node, m.ranks, m.source_node) for m in moves)
        asked["budget"] = budget
        return [CopyRecord(snapshot_id=m.part.snapshot_id, node=m.to_node, ref=m.part.ref, path=m.part.path,
                           purpose=purpose, source_node=m.source_node, ranks=m.ranks, for_restart=for_restart,
                           **({"method": "send", "bytes": 4096, "seconds": 0.5} if m.to_node == "n3" else
                              {"state": "FAILED", "error": "btrfs receive exited with status 1: No space left"}))
                for m in moves]

    monkeypatch.setattr(nodelocal, "execute", fake_execute)
    moved = Job(env.job_id, 1, "n3", ("n3", "n4"))
    data = preempt.prepare_resume(env.cfg, env.inv, moved, budget=7.0).to_json()
    assert asked["moves"] == [("n1", "n3", (0,), "n1"), ("n2", "n4", (1,), "n2")]
    assert asked["budget"] == 7.0   # the hook's remaining time, under restore.move_budget
    resume = JobDir(os.path.dirname(env.job_dir), env.job_id).read_resume().to_json()
    r0, r1 = resume["ranks"]["0"], resume["ranks"]["1"]
    assert (r0["node"], r0["from"], r0["missing"]) == ("n3", "n1", "")
    assert r0["checkpoint"].endswith("/ckpt-rank0.pt") and "/.snapshots/" in r0["checkpoint"]
    assert (r1["node"], r1["from"], r1["checkpoint"]) == ("n4", "n2", None)
    assert "not on n4" in r1["missing"]
    assert len(resume["missing"]) == 1 and "No space left" in resume["missing"][0] and "n4" in resume["missing"][0]
    assert data["missing"] == resume["missing"]
    with env.inv.session() as repo:
        copies = repo.copies(data["set_id"])
        events = [e.message for e in repo.events(set_id=data["set_id"]) if "brought" in e.message
                  or "is not on" in e.message]
    assert sorted((c.node, c.state, c.for_restart, list(c.ranks)) for c in copies) == \
        [("n3", "OK", 1, [0]), ("n4", "FAILED", 1, [1])]
    assert len(events) == 2
    # Asked again (Slurm may run a Prolog twice): the copy on n3 counts as there.
    asked.clear()
    preempt.prepare_resume(env.cfg, env.inv, moved)
    assert asked["moves"] == [("n2", "n4", (1,), "n2")]


def test_no_app_consistent_set_no_resume_file(env):
    assert preempt.prepare_resume(env.cfg, env.inv, job(env, "n1")) is None
    assert not os.path.exists(os.path.join(env.job_dir, "resume.json"))


def test_concurrent_epilogs_finalize_exactly_once(env):
    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    results = {}
    barrier = threading.Barrier(2)

    def run(node):
        barrier.wait()
        results[node] = preempt.epilog_cut(env.cfg, env.inv, job(env, node), preempt_time=t_pre.timestamp())

    threads = [threading.Thread(target=run, args=(n,)) for n in env.nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st, parts, _a, events = the_set(env)
    assert st.state == S.COMPLETE and st.consistency == S.APP and len(parts) == 3
    assert sum("COMPLETE" in r for r in results.values()) == 1
    assert sum("finalized by" in e.message for e in events) == 1


def test_node_whose_epilog_never_ran_is_partial_after_repair(env):
    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp())
    preempt.epilog_cut(env.cfg, env.inv, job(env, "n1"), preempt_time=t_pre.timestamp())
    assert the_set(env)[0].state == S.CUTTING
    assert repair(env.cfg, env.inv) == []  # deadline not reached: n2 may still come
    later = lambda: now() + dt.timedelta(hours=1)  # noqa: E731
    (a,) = repair(env.cfg, env.inv, clock=later)
    st, parts, _a, _e = the_set(env)
    assert a.new_state == st.state == S.PARTIAL
    assert "scratch@n2 (not cut)" in st.reason and st.failed_nodes == ["n2"] and "deadline" in st.reason
    assert len(parts) == 2


def test_set_whose_epilogs_never_ran_is_failed_by_repair(env):
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), (now() - dt.timedelta(seconds=5)).timestamp())
    (a,) = repair(env.cfg, env.inv, clock=lambda: now() + dt.timedelta(hours=1))
    assert (a.old_state, a.new_state) == (S.QUIESCING, S.FAILED) and "no node delivered a part" in a.reason


def test_missing_acks_at_preemption_give_crash_consistent(env):
    t_pre = now() - dt.timedelta(seconds=2)
    env.ack("n1", 0, "preempt-0", manifest=[env.write_checkpoint("n1", 0)])  # n2's rank died first
    for n in ("n2", "n1"):
        preempt.epilog_cut(env.cfg, env.inv, job(env, n), preempt_time=t_pre.timestamp())
    st = the_set(env)[0]
    assert (st.state, st.consistency) == (S.COMPLETE, S.CRASH)
    assert "barrier incomplete on 1 of 2 nodes (n2)" in st.reason and st.failed_nodes == ["n2"]


def test_stale_ack_from_before_the_preemption_is_not_trusted(env):
    t_pre = now()
    old = t_pre - dt.timedelta(minutes=10)
    for i, n in enumerate(env.nodes):  # acks of an earlier signal, never refreshed
        env.ack(n, i, "preempt-0", written_at=old)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp())
    for n in ("n1", "n2"):
        preempt.epilog_cut(env.cfg, env.inv, job(env, n))
    st = the_set(env)[0]
    assert st.consistency == S.CRASH and "written before the request" in st.reason


def test_unknown_job_is_not_found(env):
    with pytest.raises(NotFound):
        preempt.epilog_cut(env.cfg, env.inv, Job(999, 1, "n1", ("n1",)))


def test_late_epilog_after_the_requeued_runs_prolog_finishes_the_open_set(env):
    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    set_id = preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp()).set_id
    preempt.epilog_cut(env.cfg, env.inv, job(env, "n1"), preempt_time=t_pre.timestamp())
    with env.inv.session() as repo:  # the requeued run starts before n2's Epilog ran
        repo.record_job_run(job_id=env.job_id, restart_count=1, user_name="alice", uid=1000, nodes=list(env.nodes))
    r = preempt.epilog_cut(env.cfg, env.inv, job(env, "n2"), preempt_time=t_pre.timestamp())
    assert r == f"set {set_id} COMPLETE app-consistent"
    with env.inv.session() as repo:
        assert [s.id for s in sets_of_job(repo, env.job_id)] == [set_id]
    # a duplicate Epilog after completion finds the finished set, not a new run's
    assert "already COMPLETE" in preempt.epilog_cut(env.cfg, env.inv, job(env, "n2"),
                                                    preempt_time=t_pre.timestamp())


def test_slow_backend_gives_a_partial_set_the_epilog_itself_finalizes(tmp_path):
    """Issue 19's budget defect: the cut used to get the hook's whole budget,
    so a slow backend ran into the hook's alarm and nothing was recorded.
    Now the cut gets what is left less a recording reserve: the slow part is
    MISSING, recorded, and the set finalized PARTIAL by the same Epilog."""
    import time

    from slurm_snap.backends.factory import backend_for_volume
    from slurm_snap.hooks.policy import remaining, run_hook

    env = make_env(tmp_path, nodes=("n1", "n2"),
                   extra={"timeouts": {"barrier": 5.0, "backend_call": 5.0, "hook_budget": 4.0}})
    t_pre = now() - dt.timedelta(seconds=2)
    ranks_ack_at_preemption(env)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), t_pre.timestamp())
    preempt.epilog_cut(env.cfg, env.inv, job(env, "n2"), preempt_time=t_pre.timestamp())

    class Slow:
        """The shared volume's backend takes longer than the whole hook."""

        def __init__(self, real):
            self._real = real

        def __getattr__(self, name):
            return getattr(self._real, name)

        def create(self, *a, **kw):
            time.sleep(8)
            return self._real.create(*a, **kw)

    def backend_for(v):
        real = backend_for_volume(env.cfg, v, local=True)
        return Slow(real) if v.scope == "shared" else real

    out = {}

    def body():
        out["summary"] = preempt.epilog_cut(env.cfg, env.inv, job(env, "n1"), preempt_time=t_pre.timestamp(),
                                            backend_for=backend_for, remaining=remaining())
        return out["summary"]

    t0 = time.monotonic()
    assert run_hook("epilog", body, cfg=env.cfg, job_id=env.job_id, node="n1") == 0
    assert time.monotonic() - t0 < 4.0   # inside the hook's budget, with the record done
    st, parts, _acks, events = the_set(env)
    # No point to restore from, whatever its parts are: the set says none,
    # and what was cut keeps its own label.
    assert out["summary"] == f"set {st.id} PARTIAL none"
    assert (st.consistency, st.parts_consistency) == (S.NONE, S.APP)
    assert st.state == S.PARTIAL and "pfs (did not finish within" in st.reason, st.reason
    assert sorted((p.node, p.state) for p in parts) == [("", "MISSING"), ("n1", "CUT"), ("n2", "CUT")]
    assert sum("finalized by n1" in e.message for e in events) == 1
    log = open(os.path.join(env.cfg.paths.log_dir, "hooks.log")).read()
    assert '"status": "ok"' in log and '"failed"' not in log


def test_cut_budget_keeps_a_reserve_for_recording():
    assert preempt.cut_budget(20.0) == 17.0
    assert preempt.cut_budget(4.0) == 3.0
    assert preempt.cut_budget(0.2) == 0.5   # never zero: a cut that cannot start still records why


def test_the_request_time_is_what_the_ranks_observed_and_early_release_is_recorded(env):
    """Issue 16: Slurm's PreemptTime is the kill's time in the Epilogs; the
    set's request time is when the first rank's signal came (acks'
    signalled_at), and rank 0's early-release decision lands in its events."""
    import json

    guess = now() - dt.timedelta(seconds=40)         # PreemptTime - GraceTime - slack
    first, second = now() - dt.timedelta(seconds=5), now() - dt.timedelta(seconds=4)
    for i, (node, seen) in enumerate(zip(env.nodes, (second, first))):
        env.ack(node, i, "preempt-0", step=11, manifest=[env.write_checkpoint(node, i, step=11)],
                signalled_at=seen)
    decided = {"epoch": "preempt-0", "decision": "requeued", "at": first.timestamp() + 2.0,
               "all_acknowledged_at": first.timestamp() + 1.5, "why": "preempted at 2026-12-01T10:05:00"}
    with open(JobDir(env.cfg.paths.barrier_dir, env.job_id).early_path("preempt-0"), "w") as f:
        json.dump(decided, f)
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), guess.timestamp())
    preempt.epilog_cut(env.cfg, env.inv, job(env, "n2"), preempt_time=guess.timestamp())
    preempt.epilog_cut(env.cfg, env.inv, job(env, "n1"), preempt_time=guess.timestamp())
    st, _parts, acks, events = the_set(env)
    assert (st.state, st.consistency) == (S.COMPLETE, S.APP), st.reason
    assert abs((st.requested_at - first).total_seconds()) < 1e-3 and st.signalled_at == st.requested_at
    assert sorted(a.signalled_at for a in acks) == [first, second]
    early = [e.message for e in events if e.message.startswith("released early")]
    assert early == ["released early: every rank acknowledged 1.5 s after the first signal, rank 0 requeued "
                     "the job 2.0 s after the first signal (preempted at 2026-12-01T10:05:00)"], events
    # n2 recorded Slurm's kill first; the head node's early decision replaces it.
    assert (st.release, abs((st.released_at - first).total_seconds() - 2.0) < 1e-3) == ("early", True)
    assert st.barrier_at == max(a.written_at for a in acks)
    # A repeated non-head Epilog does not turn the early release back into the kill.
    LocalRecorder(env.cfg, env.inv).deliver(entry=SpoolEntry(
        job_id=env.job_id, restart_count=0, node="n2", nodes=tuple(env.nodes), uid=env.uid, written_at=now(),
        set_id=st.id, preempt_time=guess.timestamp(), killed_at=guess.timestamp()))
    assert the_set(env)[0].release == "early"
    # A later hook with Slurm's guess does not move the observed time back.
    preempt.epilogslurmctld_mark(env.cfg, env.inv, job(env, ""), guess.timestamp())
    assert abs((the_set(env)[0].requested_at - first).total_seconds()) < 1e-3


def test_a_grace_release_is_slurms_kill_not_the_request_bound(env):
    """Without rank 0's requeue the nodes came back at Slurm's kill, which the
    Epilogs see as PreemptTime (killed_at), never at the request's lower
    bound (PreemptTime less GraceTime and a slack) they also get."""
    bound = now() - dt.timedelta(seconds=40)
    kill = now() - dt.timedelta(seconds=2)
    first = now() - dt.timedelta(seconds=20)
    for i, node in enumerate(env.nodes):
        env.ack(node, i, "preempt-0", step=11, manifest=[env.write_checkpoint(node, i, step=11)],
                signalled_at=first)
    for n in env.nodes:
        preempt.epilog_cut(env.cfg, env.inv, job(env, n), preempt_time=bound.timestamp(),
                           killed_at=kill.timestamp())
    st = the_set(env)[0]
    assert st.release == "grace" and abs((st.released_at - kill).total_seconds()) < 1e-3
    assert st.requested_at <= st.released_at
