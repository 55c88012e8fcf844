"""A node's spool (slurm_snap/spool) and its delivery agent
(slurm_snap/nodeagent): entries written whole and durable, kept in the order
written, bounded, landing on a full disk through the reserve; delivered
oldest first, a pass stopping where the service is away and backing off,
refused entries kept and damaged ones set aside; the passes are the
agent's extension point."""
from __future__ import annotations

import datetime as dt
import errno
import json
import os

import pytest

from slurm_snap import errors
from slurm_snap.jobrecords import Ack, CutPart, EarlyDecision, ManifestEntry
from slurm_snap.nodeagent import agent
from slurm_snap.nodeagent.agent import Pass, PassResult, backoff, run_once
from slurm_snap.protocol.delivery import Delivered
from slurm_snap.spool import outbox as outbox_mod
from slurm_snap.spool import has_entries
from slurm_snap.spool.outbox import Outbox
from slurm_snap.spool.records import AgentState, SpoolEntry

T0 = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.timezone.utc)
ACK = Ack(node="n1", rank=0, local_rank=0, local_size=1, step=5, written_at=T0,
          manifest=(ManifestEntry("/pfs/c/rank-0.pt", 9),), world_size=1, job_id="7", epoch="preempt-0",
          seen_at=T0 + dt.timedelta(seconds=1))
PART = CutPart(volume_class="scratch", scope="node-local", node="n1", path="/s/jobs/7", backend="btrfs",
               name="slurm-snap-7-r0-abc", ref="/s/.snap/x", snapshot_path="/s/.snap/x", cut_started_at=T0, cut_at=T0)


def entry(job_id=7, node="n1", restart=0, **kw) -> SpoolEntry:
    return SpoolEntry(job_id=job_id, restart_count=restart, node=node, nodes=("n1", "n2"), uid=1000, written_at=T0,
                      parts=(PART,), acks=(ACK,) if job_id == 7 else (), **kw)


@pytest.fixture
def cfg(tmp_path):
    from slurm_snap import config

    path = tmp_path / "c.toml"
    path.write_text(f'[inventory]\nurl = "slurm-snap://127.0.0.1:1"\n[spool]\ndirectory = "{tmp_path}/spool"\n'
                    f'reserve_bytes = 65536\nmax_bytes = 1048576\n')
    return config.load(str(path))


# --- records ----------------------------------------------------------------------------------
def test_an_entry_parses_back_to_the_same_record():
    e = entry(set_id=None, preempt_time=1.5e9, killed_at=1.5e9 + 12,
              early=EarlyDecision(epoch="preempt-0", decision="requeued", at=1.5e9, why="x"),
              offline="cannot reach the slurm-snap service at ctl:6830: timed out after 5 s")
    assert SpoolEntry.parse(json.loads(json.dumps(e.to_json()))) == e
    assert e.epoch == "preempt-0" and e.acks[0].seen_at == ACK.seen_at


def test_a_time_limit_entry_says_so_and_a_preemptions_is_written_as_before():
    """The trigger travels with the entry (a time-limit set delivered late
    is still one); a preemption's entry carries no key an older service
    would refuse."""
    e = entry(trigger="timelimit")
    assert SpoolEntry.parse(json.loads(json.dumps(e.to_json()))).trigger == "timelimit"
    assert "trigger" not in entry().to_json() and SpoolEntry.parse(entry().to_json()).trigger == "preempt"


@pytest.mark.parametrize("change,field", [
    ({"version": 2}, "version"),
    ({"job_id": "seven"}, "job_id"),
    ({"nodes": []}, "nodes"),
    ({"nodes": ["../n1"]}, "nodes"),
    ({"acks": [{"ack": {}}]}, "acks[0]"),
    ({"parts": [{"state": "CUT"}]}, "scope"),
    ({"written_at": "2026-12-03T10:00:00"}, "written_at"),
    ({"colour": 1}, "colour"),
    ({"trigger": "manual"}, "trigger"),
])
def test_a_bad_entry_names_its_field(change, field):
    doc = {**entry().to_json(), **change}
    with pytest.raises(errors.BadValueError) as info:
        SpoolEntry.parse(doc, "/spool/x.json")
    assert f"{field!r}" in str(info.value) and "/spool/x.json" in str(info.value), str(info.value)


def test_an_acknowledgement_of_another_job_is_refused():
    doc = entry().to_json()
    doc["job_id"] = 8
    with pytest.raises(errors.BadValueError, match="another job"):
        SpoolEntry.parse(doc)


# --- the directory ----------------------------------------------------------------------------
def test_entries_are_kept_root_only_durable_and_in_the_order_written(cfg):
    box = Outbox.of(cfg)
    assert not has_entries(cfg.spool.directory)
    first = box.put(entry(job_id=9))
    second = box.put(entry(job_id=7))
    assert box.names() == [first, second] and has_entries(cfg.spool.directory)
    assert os.stat(cfg.spool.directory).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(box.entries_dir, first)).st_mode & 0o777 == 0o600
    assert [e.job_id for _n, e in box.pending()] == [9, 7]
    # Slurm may run a hook twice: the same share replaces its entry in place.
    again = box.put(entry(job_id=9, offline="again"))
    assert again == first and box.names() == [first, second] and box.read(first).offline == "again"
    box.remove(first)
    assert box.names() == [second]


def test_the_spool_is_bounded_and_says_so(cfg, monkeypatch):
    box = Outbox.of(cfg)
    box.put(entry(job_id=1))
    monkeypatch.setattr(box, "max_bytes", box.used_bytes() + 10)
    with pytest.raises(errors.SpoolError) as info:
        box.put(entry(job_id=2))
    assert "its bound is" in str(info.value) and cfg.spool.directory in str(info.value)
    assert info.value.exit_code == errors.INVENTORY
    box.put(entry(job_id=1, offline="rerun"))   # a rerun of a kept share still lands


def test_a_full_disk_gives_up_the_reserve_for_the_entry(cfg, monkeypatch):
    box = Outbox.of(cfg).prepare()
    assert box.ensure_reserve() and os.path.getsize(os.path.join(cfg.spool.directory, "reserve")) == 65536
    real = outbox_mod.atomic_write
    calls = []

    def full_until_the_reserve_is_gone(path, data, **kw):
        calls.append(os.path.exists(os.path.join(cfg.spool.directory, "reserve")))
        if calls[-1]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, **kw)

    monkeypatch.setattr(outbox_mod, "atomic_write", full_until_the_reserve_is_gone)
    name = box.put(entry())
    assert calls == [True, False] and box.read(name).job_id == 7
    # with no reserve left, a full disk is a SpoolError naming the spool
    monkeypatch.setattr(outbox_mod, "atomic_write",
                        lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(errors.SpoolError, match="No space left"):
        box.put(entry(job_id=8))


def test_a_reserve_the_disk_cannot_hold_leaves_no_file(cfg, monkeypatch):
    """No short reserve: a full disk's Epilog would give up a file that frees nothing."""
    box = Outbox.of(cfg).prepare()

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(outbox_mod.os, "posix_fallocate", no_space)
    assert box.ensure_reserve() is False
    assert not os.path.exists(os.path.join(cfg.spool.directory, "reserve"))
    monkeypatch.undo()
    assert box.ensure_reserve() and os.path.getsize(os.path.join(cfg.spool.directory, "reserve")) == 65536


# --- the agent --------------------------------------------------------------------------------
class FakeRecorder:
    def __init__(self, away_after: int | None = None, refuse: set[int] = frozenset()):
        self.delivered: list[int] = []
        self.away_after, self.refuse = away_after, refuse

    def deliver(self, *, entry):
        if self.away_after is not None and len(self.delivered) >= self.away_after:
            raise errors.ServiceUnavailable(why="cannot reach the slurm-snap service at ctl:6830: connection refused")
        if entry.job_id in self.refuse:
            raise errors.NotFound(what="job run", value=f"{entry.job_id}.0")
        self.delivered.append(entry.job_id)
        return Delivered(set_id=entry.job_id, state="COMPLETE", summary=f"set {entry.job_id} COMPLETE")


def test_delivery_is_oldest_first_and_stops_where_the_service_is_away(cfg):
    box = Outbox.of(cfg)
    for j in (1, 2, 3):
        box.put(entry(job_id=j))
    rec = FakeRecorder(away_after=1)
    t = [1000.0]
    report = run_once(cfg, recorder=rec, clock=lambda: t[0])
    assert rec.delivered == [1] and report.away and "connection refused" in report.away
    (r,) = report.results
    assert (r.done, r.left) == (1, 2)
    assert [e.job_id for _n, e in box.pending()] == [2, 3]
    state = box.read_state()
    assert state.failures == 1 and 1000 + 4 <= state.next_try <= 1000 + 6
    # backing off: nothing is tried before next_try, unless forced
    rec.away_after = None
    assert "backing off" in run_once(cfg, recorder=rec, clock=lambda: t[0] + 1).skipped and rec.delivered == [1]
    report = run_once(cfg, recorder=rec, clock=lambda: t[0] + 1, force=True)
    assert rec.delivered == [1, 2, 3] and not report.away and box.names() == []
    assert box.read_state() == AgentState(failures=0, next_try=0.0, last_error="", last_delivered=t[0] + 1)


def test_a_refused_entry_is_kept_and_the_later_ones_go_on(cfg):
    box = Outbox.of(cfg)
    for j in (1, 2):
        box.put(entry(job_id=j))
    rec = FakeRecorder(refuse={1})
    (r,) = run_once(cfg, recorder=rec).results
    assert rec.delivered == [2] and r.errors and "job run" in r.errors[0] and not r.away
    assert [e.job_id for _n, e in box.pending()] == [1]


def test_a_damaged_entry_is_set_aside_with_why(cfg):
    box = Outbox.of(cfg).prepare()
    bad = os.path.join(box.entries_dir, "00000000000000000001-7-preempt-0-n1.json")
    with open(bad, "w") as f:
        f.write('{"version": 1, "job_id": "x"}')
    box.put(entry(job_id=2))
    rec = FakeRecorder()
    (r,) = run_once(cfg, recorder=rec).results
    assert rec.delivered == [2] and box.names() == []
    kept = os.path.join(box.rejected_dir, os.path.basename(bad))
    assert os.path.exists(kept) and "'job_id'" in open(kept + ".why").read() and "set aside" in r.errors[0]


def test_backoff_doubles_to_a_minute_with_jitter():
    assert [round(backoff(n, rand=lambda: 0.5)) for n in (1, 2, 3, 4, 5, 6)] == [5, 10, 20, 40, 60, 60]
    assert backoff(1, rand=lambda: 0.0) == pytest.approx(4.0) and backoff(1, rand=lambda: 1.0) == pytest.approx(6.0)


def test_passes_are_the_extension_point_and_skip_after_the_service_is_away(cfg):
    ran = []

    def first(ctx):
        ran.append("first")
        return PassResult("first", away="timed out after 5 s")

    def needs(ctx):
        ran.append("needs")
        return PassResult("needs")

    def local(ctx):
        ran.append("local")
        return PassResult("local", done=1)

    report = run_once(cfg, recorder=FakeRecorder(),
                      passes=(Pass("first", first), Pass("needs", needs), Pass("local", local, needs_service=False)))
    assert ran == ["first", "local"] and report.results[1].away.startswith("skipped")
    assert [p.name for p in agent.PASSES] == ["deliver-spool"]


def test_one_pass_at_a_time(cfg):
    box = Outbox.of(cfg)
    fd = box.lock()
    try:
        assert run_once(cfg, recorder=FakeRecorder()).skipped == "another node-agent pass is running"
    finally:
        os.close(fd)


def test_a_hook_starts_a_pass_only_when_the_spool_holds_something(cfg, monkeypatch):
    started = []
    monkeypatch.setattr(agent.subprocess, "Popen", lambda argv, **kw: started.append((argv, kw)))
    assert agent.kick(cfg) is False and started == []
    Outbox.of(cfg).put(entry())
    assert agent.kick(cfg, reached_service=True) is True
    (argv, kw), = started
    assert argv[-3:] == ["node-agent", "--quiet", "--now"] and argv[argv.index("--config") + 1] == cfg.path
    assert kw["start_new_session"] and kw["stdin"] == agent.subprocess.DEVNULL
