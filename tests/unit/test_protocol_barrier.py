"""Collecting acknowledgements from a real ack directory: validation,
per-node completeness, prompt wake-up (inotify) and the polling fallback."""
from __future__ import annotations

import os
import threading
import time

import pytest

from protocol_fixtures import make_env
from slurm_snap.jobrecords import MAX_ACK_BYTES
from slurm_snap.protocol.barrier import AckCollector, wait_for_barrier
from slurm_snap.watch import Watcher

EPOCH = "sdeadbeef"


@pytest.fixture
def env(tmp_path):
    e = make_env(tmp_path, nodes=("n1", "n2"))
    os.makedirs(e.ack_dir, exist_ok=True)
    return e


def collector(env, **kw):
    return AckCollector(env.ack_dir, job_id=env.job_id, epoch=EPOCH, nodes=env.nodes, **kw)


def test_complete_when_every_local_rank_of_every_node_acked(env):
    c = collector(env)
    env.ack("n1", 0, EPOCH, local_rank=0, local_size=2)
    env.ack("n1", 1, EPOCH, local_rank=1, local_size=2)
    env.ack("n2", 2, EPOCH, local_rank=0, local_size=2)
    c.rescan()
    assert c.state.complete == {"n1"} and c.state.missing_nodes == ["n2"]
    env.ack("n2", 3, EPOCH, local_rank=1, local_size=2)
    c.rescan()
    assert c.state.all_complete and set(c.state.complete_at) == {"n1", "n2"}
    assert c.state.rejected == {}


def test_bad_acknowledgements_are_rejected_with_their_reason(env):
    c = collector(env)
    env.ack("n1", 0, "sotherepoch")
    env.ack("n2", 1, EPOCH, job_id=999)
    env.ack("n2", 5, EPOCH, name="n2.6.json")           # name does not match the content
    env.ack("n9", 7, EPOCH)                              # not a node of the job
    with open(os.path.join(env.ack_dir, "n1.3.json"), "wb") as f:
        f.write(b"\x00garbage")
    with open(os.path.join(env.ack_dir, "n1.4.json"), "wb") as f:
        f.write(b" " * (MAX_ACK_BYTES + 1))
    os.symlink("/etc/passwd", os.path.join(env.ack_dir, "n2.8.json"))
    os.mkfifo(os.path.join(env.ack_dir, "n2.9.json"))   # must not block the coordinator
    with open(os.path.join(env.ack_dir, ".n1.0.json.tmp"), "wb") as f:
        f.write(b"half-written")                         # the client's temporary: ignored
    c.rescan()
    r = c.state.rejected
    assert "stale or foreign epoch" in r["n1.0.json"]
    assert "belongs to another job" in r["n2.1.json"]
    assert "does not match its content" in r["n2.6.json"]
    assert "not one of the job's nodes" in r["n9.7.json"]
    assert "not valid JSON" in r["n1.3.json"]
    assert "larger than the limit" in r["n1.4.json"]
    assert r["n2.8.json"] == "is a symbolic link"
    assert r["n2.9.json"] == "is not a regular file"
    assert ".n1.0.json.tmp" not in r
    assert c.state.acks == {} and not c.state.complete


def test_hard_link_and_foreign_owner_are_rejected(env):
    c = collector(env, owner_uid=12345)
    p = env.ack("n1", 0, EPOCH)  # written by root: allowed (root may write for the user)
    os.link(p, os.path.join(env.tmp, "elsewhere"))
    c.rescan()
    assert "several hard links" in c.state.rejected["n1.0.json"]
    os.unlink(os.path.join(env.tmp, "elsewhere"))
    p2 = env.ack("n2", 1, EPOCH)
    os.chown(p2, 4321, 4321)
    c.rescan()
    assert "owned by uid 4321" in c.state.rejected["n2.1.json"]
    assert c.state.complete == {"n1"}  # the link is gone, so the same file is now accepted


def test_a_stale_file_replaced_by_a_fresh_one_is_reread(env):
    c = collector(env)
    env.ack("n1", 0, "soldepoch")
    c.rescan()
    assert "n1.0.json" in c.state.rejected
    env.ack("n1", 0, EPOCH)
    c.rescan()
    assert "n1.0.json" not in c.state.rejected and c.state.complete == {"n1"}


@pytest.mark.parametrize("use_inotify", [True, False])
def test_wait_returns_promptly_after_the_last_ack(env, use_inotify):
    c = collector(env)
    landed = {}

    def ranks():
        time.sleep(0.05)
        env.ack("n1", 0, EPOCH)
        time.sleep(0.1)
        env.ack("n2", 1, EPOCH)
        landed["t"] = time.monotonic()

    th = threading.Thread(target=ranks)
    th.start()
    ok = wait_for_barrier(c, timeout=5, use_inotify=use_inotify)
    done = time.monotonic()
    th.join()
    assert ok and c.state.all_complete
    # inotify: woken by the rename itself; polling: at most one capped backoff (50 ms) late
    assert done - landed["t"] < (0.02 if use_inotify else 0.08)


def test_wait_gives_up_at_the_deadline_and_reports_who_is_missing(env):
    c = collector(env)
    env.ack("n1", 0, EPOCH)
    t = time.monotonic()
    assert wait_for_barrier(c, timeout=0.3) is False
    assert 0.29 <= time.monotonic() - t < 1.0
    assert c.state.missing_nodes == ["n2"]


def test_watcher_reports_names_from_inotify(env):
    with Watcher([env.ack_dir]) as w:
        from realcomponents import require

        require(bool(w.inotify), "inotify unavailable on this kernel")
        env.ack("n1", 0, EPOCH)
        names = w.wait(1.0)
    assert names is not None and "n1.0.json" in names
