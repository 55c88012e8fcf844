"""The schedule runner (issue 17): which periodic runs are due, one query per
pass, jobs with a set in flight skipped, starts spread and bounded, drills
newest first and one per job; the interval rule of [schedule]; the
--snapshot-every check at submit. On SQLite, PostgreSQL and MariaDB (the
`inventory` fixture). The whole flow on a real cluster is
tests/integration/test_schedule_cluster.py."""
from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from sqlalchemy import event

from slurm_snap import config as config_mod
from slurm_snap import errors
from slurm_snap import states as S
from slurm_snap.cli import main
from slurm_snap.schedule import Drilled, Runner, plan
from slurm_snap.slurm.commands import running_from_json

T0 = dt.datetime(2026, 12, 2, 8, 0, 0, tzinfo=dt.timezone.utc)


pytestmark = pytest.mark.slow(10)   # seconds idle: the unit run starts this file early (tests/conftest.py)


def cfg_with(**schedule):
    restore = schedule.pop("restore", {})
    return config_mod.from_dict({"schedule": schedule, "restore": restore})


def add_run(repo, job_id, *, every=60, restart=0, options=None, at=T0):
    run = repo.record_job_run(job_id=job_id, restart_count=restart, user_name="alice", uid=1000,
                              options=options or {"consistency": "app"}, snapshot_every=every)
    run.created_at = at
    repo.s.flush()
    return run


def add_set(repo, run, *, at, state=S.COMPLETE, consistency=S.APP, epoch=None):
    st, _ = repo.create_set(run, epoch=epoch or f"e{run.job_id}-{at:%H%M%S}", trigger="periodic", requested_at=at)
    if state in S.ACTIVE:
        return st.id
    repo.transition(st.id, S.CUTTING, at=at)
    repo.transition(st.id, S.CUT, at=at + dt.timedelta(seconds=1))
    repo.transition(st.id, state, consistency=consistency, checkpoint_step=5)
    return st.id


def abandon(repo, set_id, times, reason):
    """`times` drills of the set that ended without a verdict (restore/drill.py's _abandon)."""
    for _ in range(times):
        rt = repo.start_restore_test(set_id, "x", "/tmp/abandoned")
        repo.finish_restore_test(rt.id, passed=False, first_step=None, time_to_first_step=None, reason=reason)


class Fake:
    """Slurm and the coordinator, recorded."""

    def __init__(self, running):
        self._running = running
        self.snapshots: list[tuple[int, str]] = []
        self.drills: list[int] = []
        self.sleeps: list[float] = []
        self.active = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()

    def running(self):
        return dict(self._running)

    def snapshot(self, job_id, consistency):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.snapshots.append((job_id, consistency))
        self.release.wait(5)
        with self.lock:
            self.active -= 1
        return 1000 + job_id, S.COMPLETE, S.APP

    def drill(self, c):
        self.drills.append(c.set_id)
        return Drilled(set_id=c.set_id, job_id=c.job_id, passed=True)


def runner(cfg, inventory, fake, now):
    return Runner(cfg, inventory, running=fake.running, snapshot=fake.snapshot, drill=fake.drill,
                  clock=lambda: now, sleep=fake.sleeps.append)


def test_due_runs_are_taken_most_overdue_first_and_in_flight_ones_skipped(inventory):
    with inventory.session() as repo:
        never = add_run(repo, 1, every=60, at=T0)                      # started 5 min ago, no set yet
        fresh = add_run(repo, 2, every=600, at=T0)
        add_set(repo, fresh, at=T0 + dt.timedelta(minutes=4))          # its newest set is 1 min old
        busy = add_run(repo, 3, every=60, at=T0)
        add_set(repo, busy, at=T0 + dt.timedelta(minutes=4), state=S.QUIESCING)
        stale = add_run(repo, 4, every=120, options={"consistency": "crash"}, at=T0)
        add_set(repo, stale, at=T0 + dt.timedelta(minutes=1))          # due at +3 min
        add_run(repo, 5, every=60, at=T0)                              # not running any more
        add_run(repo, 6, every=None, at=T0)                            # no periodic snapshots
        old = add_run(repo, 7, every=60, at=T0)                        # run 0 of a requeued job
        add_run(repo, 7, every=60, restart=1, at=T0 + dt.timedelta(minutes=4, seconds=30))
        assert never.id and old.id
    now = T0 + dt.timedelta(minutes=5)
    fake = Fake({1: 0, 2: 0, 3: 0, 4: 0, 6: 0, 7: 1, 99: 0})
    report = runner(cfg_with(), inventory, fake, now).pass_once()
    assert report.running == 7 and report.periodic == 5 and report.in_flight == [3]
    # job 4 was due at +3 min, job 1 at +1 min; job 7's run 1 is 30 s old; job 2's set 1 min old
    assert [d.job_id for d in report.due] == [1, 4]
    assert fake.snapshots == [(1, "app"), (4, "crash")]
    assert [(t.job_id, t.set_id, t.state, t.late_seconds) for t in report.taken] == [
        (1, 1001, S.COMPLETE, 240.0), (4, 1004, S.COMPLETE, 120.0)]
    assert fake.sleeps == [0.5]    # one gap between the two signals


def test_a_pass_reads_the_inventory_once_whatever_the_number_of_jobs(inventory):
    from testkit.inventory_helpers import bulk_seed

    with inventory.session() as repo:
        # The rows add_run makes, in one executemany: the pass is under test,
        # not 1,200 hooks' record_job_run (a SELECT, an INSERT, an UPDATE each).
        bulk_seed(repo, "job_run", [dict(job_id=j, restart_count=0, user_name="alice", uid=1000, partition="",
                                         nodes=[], options={"consistency": "app"}, created_at=T0,
                                         snapshot_every=3600) for j in range(1, 1201)])
        assert add_run(repo, 1200, every=3600).id == 1200     # the same row as add_run's
    statements = []
    listen = event.listens_for(inventory.engine, "before_cursor_execute")
    listen(lambda *a, **k: statements.append(a[2]))
    fake = Fake({j: 0 for j in range(1, 1201)})
    report = runner(cfg_with(), inventory, fake, T0 + dt.timedelta(minutes=1)).pass_once()
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert report.periodic == 1200 and report.due == [] and fake.snapshots == []
    # 1,200 running jobs in chunks of 500, two queries each: six, not 1,200
    assert len(selects) == 6, selects


def test_concurrency_bounds_the_sets_in_flight_and_the_gap_separates_starts(inventory):
    with inventory.session() as repo:
        for j in range(1, 8):
            add_run(repo, j, every=60, at=T0)
    fake = Fake({j: 0 for j in range(1, 8)})
    fake.release.clear()
    cfg = cfg_with(concurrency=2, signal_gap=0.25)
    r = runner(cfg, inventory, fake, T0 + dt.timedelta(minutes=2))
    done = threading.Event()
    out = {}

    def go():
        out["report"] = r.pass_once()
        done.set()

    t = threading.Thread(target=go)
    t.start()
    # Two start as soon as the pass has read the inventory (slow on a loaded
    # machine: wait for them, not a fixed time), then the third waits.
    deadline = time.monotonic() + 10
    while fake.active < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.active == 2
    assert not done.wait(0.3)
    assert fake.active == 2            # the third waits for a free slot
    fake.release.set()
    assert done.wait(10)
    t.join()
    assert fake.peak == 2 and len(out["report"].taken) == 7 and fake.sleeps == [0.25] * 6


def test_a_busy_or_failing_job_does_not_end_the_pass(inventory):
    with inventory.session() as repo:
        for j in (1, 2, 3):
            add_run(repo, j, every=60, at=T0)
    fake = Fake({1: 0, 2: 0, 3: 0})

    def snapshot(job_id, consistency):
        if job_id == 1:
            raise errors.Busy(what="job", value="1", why="set 9 is in flight")
        if job_id == 2:
            raise RuntimeError("boom")
        return 77, S.COMPLETE, S.APP

    r = Runner(cfg_with(), inventory, running=fake.running, snapshot=snapshot, drill=fake.drill,
               clock=lambda: T0 + dt.timedelta(minutes=2), sleep=lambda s: None)
    taken = {t.job_id: t for t in r.pass_once().taken}
    assert taken[1].error.startswith("busy: ") and "set 9 is in flight" in taken[1].error
    assert taken[2].error == "internal error: RuntimeError: boom"
    assert taken[3].set_id == 77 and taken[3].error == ""


def test_drills_take_the_newest_never_drilled_sets_one_per_job(inventory):
    with inventory.session() as repo:
        a = add_run(repo, 1, every=None, options={"resume_cmd": "python train.py"}, at=T0)
        a_old = add_set(repo, a, at=T0 + dt.timedelta(minutes=1))
        a_new = add_set(repo, a, at=T0 + dt.timedelta(minutes=2))
        b = add_run(repo, 2, every=None, options={"resume_cmd": "python train.py"}, at=T0)
        b_set = add_set(repo, b, at=T0 + dt.timedelta(minutes=3))
        drilled = add_set(repo, b, at=T0 + dt.timedelta(minutes=4))
        repo.start_restore_test(drilled, "python train.py", "/tmp/x")
        c = add_run(repo, 3, every=None, options={}, at=T0)                   # no resume command
        add_set(repo, c, at=T0 + dt.timedelta(minutes=5))
        d = add_run(repo, 4, every=None, options={"resume_cmd": "x"}, at=T0)
        add_set(repo, d, at=T0 + dt.timedelta(minutes=6), state=S.PARTIAL)    # not drillable
        e = add_run(repo, 5, every=None, options={"resume_cmd": "x"}, at=T0)
        add_set(repo, e, at=T0 + dt.timedelta(minutes=7), consistency=S.NONE)
        # an abandoned drill (our side failed) is retried, three attempts in all
        f = add_run(repo, 6, every=None, options={"resume_cmd": "x"}, at=T0)
        f_set = add_set(repo, f, at=T0 + dt.timedelta(seconds=30))
        abandon(repo, f_set, 2, "drill aborted: ssh n1: connection refused")
        g = add_run(repo, 7, every=None, options={"resume_cmd": "x"}, at=T0)
        g_set = add_set(repo, g, at=T0 + dt.timedelta(seconds=20))
        abandon(repo, g_set, 3, "interrupted: KeyboardInterrupt: ")
    fake = Fake({})
    cfg = cfg_with(drills=3, restore={"verify_within": "1h"})
    report = runner(cfg, inventory, fake, T0 + dt.timedelta(minutes=10)).pass_once()
    assert sorted(fake.drills) == sorted([b_set, a_new, f_set])
    assert a_old not in fake.drills and g_set not in fake.drills and [d.passed for d in report.drills] == [True] * 3
    # off without restore.verify_within
    fake2 = Fake({})
    runner(cfg_with(drills=3), inventory, fake2, T0).pass_once()
    assert fake2.drills == []
    with inventory.session() as repo:
        # Owed past verify_within: jobs 1 (a_new; a_old is superseded by it), 6 (f_set) and 7 (g_set,
        # abandoned three times: still owed). Not job 3: no resume command, nothing the runner can drill.
        assert repo.overdue_drills(before=T0 + dt.timedelta(minutes=2, seconds=30)) == 3
        assert repo.overdue_drills(before=T0 + dt.timedelta(minutes=6)) == 4     # and job 2's b_set


def test_dry_run_signals_nothing(inventory):
    with inventory.session() as repo:
        add_run(repo, 1, every=60, at=T0)
    fake = Fake({1: 0})
    report = runner(cfg_with(), inventory, fake, T0 + dt.timedelta(minutes=2)).pass_once(dry_run=True)
    assert [d.job_id for d in report.due] == [1] and fake.snapshots == [] and report.taken == []


def test_plan_counts_from_the_newest_set_of_any_trigger():
    from slurm_snap.inventory.schedule import PeriodicRun

    r = PeriodicRun(run_id=1, job_id=1, restart_count=0, user_name="a", every=60, created_at=T0,
                    last_requested_at=T0 + dt.timedelta(seconds=50), in_flight=False, consistency="app")
    assert plan([r], T0 + dt.timedelta(seconds=109))[0] == []
    due, _ = plan([r], T0 + dt.timedelta(seconds=110))
    assert due[0].due_at == T0 + dt.timedelta(seconds=110)


def test_a_requeued_run_counts_from_its_own_start_not_from_the_set_its_preemption_cut():
    """The rule README, design.md and `schedule --help` state (issue 35 item
    7): due DURATION after the later of the run's start and its newest set."""
    from slurm_snap.inventory.schedule import PeriodicRun

    # Run 1 was recorded at T0+300 s; the job's newest set (run 0's, at its
    # preemption) is older than that and is not the run's.
    r = PeriodicRun(run_id=2, job_id=1, restart_count=1, user_name="a", every=60,
                    created_at=T0 + dt.timedelta(seconds=300), last_requested_at=None, in_flight=False,
                    consistency="app")
    assert plan([r], T0 + dt.timedelta(seconds=359))[0] == []
    assert plan([r], T0 + dt.timedelta(seconds=360))[0][0].due_at == T0 + dt.timedelta(seconds=360)


def _normalized(text: str) -> str:
    return " ".join(text.split())


def test_the_due_rule_reads_the_same_in_readme_design_and_help(capsys):
    import re
    from pathlib import Path

    from slurm_snap.cli import main

    assert main(["schedule", "--help"]) == 0
    help_text = _normalized(capsys.readouterr().out)
    rule = re.search(r"A run is due when .*?\)\.", help_text).group(0)
    assert "later of its start and its newest set of any kind" in rule
    root = Path(__file__).resolve().parents[2]
    for doc in ("README.md", "docs/design.md"):
        assert rule in _normalized((root / doc).read_text()), doc
    import slurm_snap.schedule

    assert rule in _normalized(slurm_snap.schedule.__doc__)


def test_the_interval_rule_default_and_minimum_per_partition():
    cfg = cfg_with(every={"gpu": "2h", "*": "6h"}, min_every={"gpu": "30m"})
    assert cfg.snapshot_every("gpu", None) == (7200, "the default of partition gpu")
    assert cfg.snapshot_every("cpu", None) == (21600, "the default of partition cpu")
    assert cfg.snapshot_every("gpu", 60) == (1800, "raised to partition gpu's minimum")
    assert cfg.snapshot_every("cpu", 60) == (60, "")
    assert cfg_with().snapshot_every("cpu", None) == (None, "")


@pytest.mark.parametrize("table, value, why", [
    ("every", "5s", "is under 10 s"), ("min_every", "soon", "not a duration; accepted: 90s"), ("every", 30, "expected a duration"),
])
def test_bad_schedule_tables_name_the_key(table, value, why):
    with pytest.raises(errors.ConfigError) as exc:
        cfg_with(**{table: {"gpu": value}})
    assert f"schedule.{table}.gpu" in str(exc.value) and why in str(exc.value)


def test_running_jobs_reads_both_squeue_state_shapes():
    text = ('{"jobs": [{"job_id": 1, "job_state": "RUNNING", "restart_cnt": 2},'
            ' {"job_id": 2, "job_state": "PENDING"}, {"job_id": 3, "job_state": ["RUNNING"]},'
            ' {"job_id": 4, "job_state": ["COMPLETING"]}]}')
    assert running_from_json(text) == {1: 2, 3: 0}


def test_snapshot_every_is_checked_at_submit(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nbarrier_dir = "{tmp_path}/b"\n')
    assert main(["--config", str(cfg), "hook", "validate-options", "--every", "1min"]) == 0
    assert main(["--config", str(cfg), "hook", "validate-options", "--every", "5s"]) == 2
    assert "--snapshot-every '5s': under 10 s" in capsys.readouterr().err
    assert main(["--config", str(cfg), "hook", "validate-options", "--every", "often"]) == 2
    assert "--snapshot-every 'often'" in capsys.readouterr().err


def test_schedule_is_for_operators(tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[inventory]\nurl = "sqlite:///{tmp_path}/i.db"\n[access]\noperator_users = ["root"]\n')
    monkeypatch.setenv("SUDO_UID", "1")          # an ordinary user through sudo: not an operator
    assert main(["--config", str(cfg), "schedule", "--dry-run"]) == 4
    assert "operators only" in capsys.readouterr().err


def test_with_partner_copies_drills_start_after_the_copies_and_are_placed(inventory, monkeypatch):
    """[restore] partner_copies: the pass's partner copies are queued before
    its drills start, a set whose copies are still under way waits for them,
    and the runner's own drill asks for the nodes holding the copies, for
    sets with node-local parts only, as a Slurm job it does not wait for."""
    with inventory.session() as repo:
        a = add_run(repo, 1, every=None, options={"resume_cmd": "python train.py"}, at=T0)
        set_id = add_set(repo, a, at=T0 + dt.timedelta(minutes=1))
    order: list[str] = []
    copying = threading.Event()

    def partners(self):
        copying.set()
        order.append("partners")
        return ["a partner copy"]

    monkeypatch.setattr(Runner, "_partners", partners)
    fake = Fake({})

    def drill(c):
        assert copying.is_set()
        order.append(f"drill {c.set_id}")
        return fake.drill(c)

    cfg = cfg_with(drills=2, restore={"verify_within": "1h", "partner_copies": True})
    r = Runner(cfg, inventory, running=fake.running, snapshot=fake.snapshot, drill=drill,
               clock=lambda: T0 + dt.timedelta(minutes=10), sleep=fake.sleeps.append)
    report = r.pass_once()
    assert order == ["partners", f"drill {set_id}"] and report.partners == ["a partner copy"]

    # The runner's own drill: placed on other nodes, from partner copies, node-local sets only.
    from slurm_snap.restore import drill as drill_mod
    from slurm_snap.restore.outcome import Outcome
    from slurm_snap.restore.placement import Placement

    asked = {}

    class Recording:
        def __init__(self, cfg, inv, **kw):
            asked["submitter"] = kw.get("submitter")

        def run(self, selector, **kw):
            asked.update(selector=selector, **kw)
            return Outcome(set_id=set_id, job_id=1, test_id=1, passed=True, reason="")

    monkeypatch.setattr(drill_mod, "Drill", Recording)
    from slurm_snap.schedule import DrillCandidate

    Runner(cfg, inventory)._drill(DrillCandidate(set_id=set_id, job_id=1, user_name="alice", cut_at=T0,
                                                 resume_cmd="x"))
    assert asked["selector"] == f"set:{set_id}" and asked["submitter"] is not None
    assert asked["placement"] == Placement(prefer_copies=True, only_node_local=True)
    assert (asked["wait"], asked["sweep"]) == (False, False)   # submitted; the next pass collects it

    # A set with a partner copy under way is not drilled this pass.
    with inventory.session() as repo:
        repo.add_node_task(node="n2", kind="receive", purpose="partner", set_id=set_id,
                           snapshot_id=_a_part(repo, set_id), peer="n1")
    order.clear()
    report = Runner(cfg, inventory, running=fake.running, snapshot=fake.snapshot, drill=drill, collect=list,
                    clock=lambda: T0 + dt.timedelta(minutes=10), sleep=fake.sleeps.append).pass_once()
    assert order == ["partners"] and report.drills == []


def _a_part(repo, set_id: int) -> int:
    """A snapshot row of the set (add_set records none): one made for the test."""
    from slurm_snap.inventory.records import SnapshotRecord
    from slurm_snap.jobrecords import VolumeRecord

    st = repo.get_set(set_id)
    (vol,) = repo.add_volumes(st.job_run, [VolumeRecord(path="/scratch/jobs/1", scope="node-local",
                                                        volume_class="scratch", backend="btrfs", node="n1")])
    repo.record_parts(set_id, [SnapshotRecord(volume_id=vol.id, backend="btrfs", name="s", ref="/s/s", path="/s/s",
                                              node="n1", cut_started_at=T0, cut_at=T0)])
    return repo.snapshots(set_id)[0].id
