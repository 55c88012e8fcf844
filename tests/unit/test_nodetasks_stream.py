"""nodetasks/stream.py on loopback with a real munged: a part goes from the
sending agent to the receiving one whole and counted, only between two ends
that prove themselves root and this transfer's with MUNGE; a stranger's
connection is refused while the receiver goes on waiting; a receiving tool
that fails is the sender's error too, and leaves no partial copy."""
from __future__ import annotations

import json
import os
import socket
import threading

import pytest

from slurm_snap import errors
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef
from slurm_snap.backends.transport import LocalTransport
from slurm_snap.nodetasks import stream
from slurm_snap.service import wire
from test_service import munge_socket  # noqa: F401  (fixture: a private munged)


class RootedBackend(Backend):
    """A 'snapshot' is a file at ref.ref under this stand-in node's root; it is
    copied with cat into a partial file, then renamed."""

    name = "rooted"
    UTILS = ("cat", "tee", "mv", "false")

    def __init__(self, root, *, into=None):
        self.root, self.into = str(root), into
        super().__init__({}, LocalTransport())

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=True, read_only=False, instant=False, per_file_cost=False, scope="volume",
                            needs_root=False, can_clone=False, can_copy=True)

    def at(self, ref):
        return self.root + ref.ref

    def create(self, volume, name):
        raise NotImplementedError

    def list(self, volume):
        return []

    def exists(self, ref):
        return os.path.exists(self.at(ref))

    def delete(self, ref):
        return False

    def copy_out_argv(self, ref):
        return [self.tools["cat"], self.at(ref)]

    def copy_in_argv(self, ref):
        return self.into or [self.tools["tee"], self.at(ref) + ".partial"]

    def finish_copy_in(self, ref):
        self.run("mv", self.at(ref) + ".partial", self.at(ref))
        return ref

    def discard_partial(self, ref):
        if os.path.exists(self.at(ref) + ".partial"):
            os.unlink(self.at(ref) + ".partial")


REF = SnapshotRef("rooted", "/scratch/jobs/7", "s1", "/snaps/s1", "/snaps/s1")


@pytest.fixture
def nodes(tmp_path):
    for n in ("n1", "n2"):
        (tmp_path / n / "snaps").mkdir(parents=True)
    data = os.urandom(3 << 20) + b"tail"
    (tmp_path / "n1" / "snaps" / "s1").write_bytes(data)
    return tmp_path, data


def _receiver(backend, sock, token, *, wait=20.0):
    out, ready = {}, threading.Event()

    def listening(addr):
        out["address"] = addr
        ready.set()

    def run():
        try:
            out["moved"] = stream.receive(backend, REF, node="n2", token=token, address="127.0.0.1",
                                          munge_socket=sock, on_listening=listening, wait=wait, timeout=30)
        except Exception as exc:  # noqa: BLE001 -- the test reads it
            out["error"] = exc
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    return t, out


def test_a_part_goes_whole_between_two_ends_that_prove_themselves(nodes, munge_socket):  # noqa: F811
    root, data = nodes
    t, got = _receiver(RootedBackend(root / "n2"), munge_socket, "tok-1")
    sent = stream.send(RootedBackend(root / "n1"), REF, address=got["address"], token="tok-1", to_node="n2",
                       munge_socket=munge_socket, parent=None, timeout=30)
    t.join(30)
    assert "error" not in got, got
    assert (sent.method, sent.bytes) == ("copy", len(data)) and got["moved"].bytes == len(data)
    assert (root / "n2" / "snaps" / "s1").read_bytes() == data
    again = stream.receive(RootedBackend(root / "n2"), REF, node="n2", token="t", address="127.0.0.1",
                           munge_socket=munge_socket, on_listening=lambda a: None, wait=1, timeout=5)
    assert again.method == "present"


def test_a_stranger_is_refused_and_the_receiver_waits_on(nodes, munge_socket):  # noqa: F811
    root, data = nodes
    t, got = _receiver(RootedBackend(root / "n2"), munge_socket, "tok-2")
    host, port = got["address"].rsplit(":", 1)
    # Someone who knows the address but not the token, then no credential at all.
    for frame in ({"credential": wire.encode(json.dumps({"token": "guess", "role": "sender"}).encode(),
                                            socket_path=munge_socket)}, {"hello": 1}):
        with socket.create_connection((host, int(port)), timeout=5) as c:
            wire.send(c, frame)
            with pytest.raises((ConnectionError, OSError)):
                wire.recv(c)
    # The real sender still gets through.
    stream.send(RootedBackend(root / "n1"), REF, address=got["address"], token="tok-2", to_node="n2",
                munge_socket=munge_socket, parent=None, timeout=30)
    t.join(30)
    assert (root / "n2" / "snaps" / "s1").read_bytes() == data


def test_a_sender_checks_who_listens(nodes, munge_socket):  # noqa: F811
    root, _ = nodes
    t, got = _receiver(RootedBackend(root / "n2"), munge_socket, "tok-3", wait=3)
    with pytest.raises(errors.PermissionDenied, match="not n3"):
        stream.send(RootedBackend(root / "n1"), REF, address=got["address"], token="tok-3", to_node="n3",
                    munge_socket=munge_socket, parent=None, timeout=30)
    t.join(30)
    assert not (root / "n2" / "snaps" / "s1").exists()


def test_a_failing_receiver_fails_the_sender_and_leaves_no_partial(nodes, munge_socket):  # noqa: F811
    root, _ = nodes
    t, got = _receiver(RootedBackend(root / "n2", into=["/bin/false"]), munge_socket, "tok-4")
    with pytest.raises(errors.BackendError, match="the receiver on n2"):
        stream.send(RootedBackend(root / "n1"), REF, address=got["address"], token="tok-4", to_node="n2",
                    munge_socket=munge_socket, parent=None, timeout=30)
    t.join(30)
    assert isinstance(got.get("error"), errors.BackendError)
    assert os.listdir(root / "n2" / "snaps") == []


def test_no_sender_within_the_wait_is_a_timeout(nodes, munge_socket):  # noqa: F811
    root, _ = nodes
    t, got = _receiver(RootedBackend(root / "n2"), munge_socket, "tok-5", wait=1)
    t.join(10)
    assert isinstance(got.get("error"), errors.Timeout)


def test_two_partners_agents_copy_to_each_other_at_once(tmp_path, munge_socket):  # noqa: F811
    """A 2-node job's partners: n1 sends to n2 and n2 to n1, both agents'
    passes at once, the real stream between them. Each listens first (its
    send waits for the other to listen), then sends while it listens. When a
    listener's sends blocked its accept loop, each send waited for a
    handshake the other, itself sending, never gave: every copy failed
    (the dev cluster's partner copies, 2026-12-03)."""
    from protocol_fixtures import make_env
    from slurm_snap import states as S
    from slurm_snap.nodetasks import agent
    from slurm_snap.protocol import partner
    from test_protocol_nodeloss import complete_set

    env = make_env(tmp_path, nodes=("n1", "n2"), extra={"service": {"munge_socket": munge_socket}})
    set_id = complete_set(env)
    with env.inv.session() as repo:
        parts = {p.node: p.ref for p in repo.snapshots(set_id) if p.node}
    data = {}
    for node, ref in parts.items():
        for holder in parts:      # the directory of the part on both nodes (the copy keeps its path)
            (tmp_path / "root" / holder / ref.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        src = tmp_path / "root" / node / ref.lstrip("/")
        data[node] = os.urandom(1 << 20) + node.encode()
        src.write_bytes(data[node])
    backends = {n: RootedBackend(tmp_path / "root" / n) for n in parts}
    mp = pytest.MonkeyPatch()
    mp.setattr(agent, "_backend", lambda cfg, node, t: backends[node])
    try:
        assert len(partner.make_copies(env.cfg, env.inv)) == 2
        reports = {}
        threads = [threading.Thread(target=lambda n=n: reports.__setitem__(n, agent.run_pass(env.cfg, env.inv,
                                                                                            node=n)))
                   for n in ("n1", "n2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    finally:
        mp.undo()
    assert {n: r.errors for n, r in reports.items()} == {"n1": [], "n2": []}, reports
    with env.inv.session() as repo:
        copies = sorted((c.source_node, c.node, c.state, c.error) for c in repo.copies(set_id))
        assert copies == [("n1", "n2", S.COPY_OK, ""), ("n2", "n1", S.COPY_OK, "")], copies
        assert repo.open_node_tasks(set_id=set_id) == []
    # Each node holds the other's part, at its original's path, whole.
    assert (tmp_path / "root" / "n2" / parts["n1"].lstrip("/")).read_bytes() == data["n1"]
    assert (tmp_path / "root" / "n1" / parts["n2"].lstrip("/")).read_bytes() == data["n2"]
