"""Fuzzing the service's wire format with hypothesis: everything a peer can
put on the socket, at each place the service or its client reads it.

  frames     a byte stream read as one frame (wire.recv, the service's
             limits): a frame, or FrameError / ConnectionError, nothing else
  requests   a credential's payload (server.parse_request): a request, or
             UsageError
  op args    a hook operation's arguments, decoded by the operation's type
             hints into typed records (records.decode_call): the records,
             or BadValueError naming the field
  replies    a stream of frames read by the client (client.receive): a
             reply, a busy refusal, or FrameError / ConnectionError

Each input must end within DEADLINE_MS (no hang: every read has a
deadline), and the process's peak memory may not grow by more than
MEMORY_MB from the first tenth of a run's inputs to its end (a length
field claiming 4 GiB allocates nothing; the first tenth holds hypothesis'
own warm-up, 200 MB measured). Inputs per target: SLURM_SNAP_FUZZ_EXAMPLES (2,000 here and in
CI; 100,000 in the long run, README "Fuzzing the service"). Each target counts
the inputs it ran and the test fails if fewer ran than asked.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import struct

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the [test] extras")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from slurm_snap import errors  # noqa: E402
from slurm_snap.protocol.recorder import LocalRecorder, OPS_METHODS  # noqa: E402
from slurm_snap.service import client, records, server, wire  # noqa: E402

# The long suite (SLURM_SNAP_LONG=1) runs 100,000 unless told otherwise.
EXAMPLES = int(os.environ.get("SLURM_SNAP_FUZZ_EXAMPLES") or (100_000 if os.environ.get("SLURM_SNAP_LONG") else 500))
DEADLINE_MS = 2000
MEMORY_MB = 64
# A socketpair holds this much without a reader: inputs stay below it, so
# the writer never waits on the reader.
MAX_INPUT = 48 * 1024

FUZZ = settings(max_examples=EXAMPLES, deadline=DEADLINE_MS, database=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=5), max_leaves=12)


def _frame(body: bytes, length: int | None = None) -> bytes:
    return struct.pack(">I", len(body) if length is None else length) + body


def _framed(obj) -> bytes:
    return _frame(json.dumps(obj).encode())


@st.composite
def streams(draw) -> bytes:
    """Raw bytes; a header over a body of any bytes; a length that lies; a
    JSON frame of any value; nesting past the parser's stack."""
    kind = draw(st.sampled_from(("raw", "body", "liar", "json", "deep", "huge")))
    if kind == "raw":
        return draw(st.binary(max_size=512))
    if kind == "body":
        return _frame(draw(st.binary(max_size=512)))
    if kind == "liar":
        body = draw(st.binary(max_size=64))
        return _frame(body, draw(st.integers(0, 0xFFFFFFFF)))
    if kind == "json":
        return _framed(draw(json_values))
    if kind == "deep":
        opener = draw(st.sampled_from((b"[", b'{"a":')))
        return _frame(opener * draw(st.integers(100, MAX_INPUT // len(opener))))
    return _frame(b"{}", draw(st.integers(server.MAX_REQUEST + 1, 0xFFFFFFFF)))


def _feed(data: bytes) -> socket.socket:
    """The reading end of a socket pair whose writer sent `data` and closed."""
    a, b = socket.socketpair()
    b.sendall(data)
    b.close()
    return a


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Counter:
    """Inputs run, and the peak memory once a tenth of them had."""

    def __init__(self):
        self.n = 0
        self.mark: float | None = None

    def __call__(self):
        self.n += 1
        if self.n == max(1, EXAMPLES // 10):
            self.mark = _peak_mb()


@pytest.fixture
def ran():
    counter = Counter()
    yield counter
    grown = _peak_mb() - (counter.mark or 0)
    print(f"{counter.n} inputs; peak memory {_peak_mb():.0f} MB, +{grown:.1f} MB after the first tenth")
    assert counter.n >= EXAMPLES
    assert grown < MEMORY_MB, f"peak memory grew by {grown:.0f} MB over the last nine tenths"


def test_frames_as_the_service_reads_them(ran):

    @FUZZ
    @given(streams())
    def one(data):
        ran()
        sock = _feed(data)
        with sock:
            try:
                obj, raw = wire.recv(sock, limit=server.MAX_REQUEST, timeout=1.0)
            except (wire.FrameError, ConnectionError):
                return
        assert isinstance(obj, dict) and len(raw) <= server.MAX_REQUEST

    one()


@st.composite
def payloads(draw) -> bytes:
    kind = draw(st.sampled_from(("raw", "json", "request")))
    if kind == "raw":
        return draw(st.binary(max_size=512))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    req = {"v": draw(st.sampled_from((1, 1.0, True, "1", 2, None))),
           "kind": draw(st.sampled_from(("cli", "op", "ping", "", None, 5)))}
    req.update(draw(st.dictionaries(st.sampled_from(("argv", "op", "args", "tz", "x")), json_values, max_size=4)))
    return json.dumps(req).encode()


def test_request_payloads(ran):

    @FUZZ
    @given(payloads())
    def one(payload):
        ran()
        try:
            req = server.parse_request(payload)
        except errors.UsageError as exc:
            assert str(exc) and len(str(exc)) < 300
            return
        assert type(req["v"]) is int and req["v"] == 1 and req["kind"] in server.KINDS
        if req["kind"] == "cli":
            assert req["argv"] and all(isinstance(a, str) for a in req["argv"])
        if req["kind"] == "op":
            assert isinstance(req["op"], str) and isinstance(req["args"], dict)

    one()


OPS = sorted(OPS_METHODS)


def _op_args(method):
    """Arguments for `method`: its own names with any JSON values, or any names."""
    import typing

    names = [n for n in typing.get_type_hints(method) if n != "return"]
    return st.dictionaries(st.sampled_from(names) if names else st.text(max_size=8), json_values, max_size=8) \
        | st.dictionaries(st.text(max_size=8), json_values, max_size=3)


def test_hook_operation_arguments(ran):

    @FUZZ
    @given(st.sampled_from(OPS).flatmap(lambda op: st.tuples(st.just(op),
                                                             _op_args(getattr(LocalRecorder, OPS_METHODS[op])))))
    def one(case):
        op, args = case
        ran()
        try:
            records.decode_call(getattr(LocalRecorder, OPS_METHODS[op]), args, op)
        except errors.BadValueError as exc:
            assert str(exc)

    one()


reply_frames = st.one_of(
    st.builds(lambda s: {"out": s}, st.text(max_size=20)), st.builds(lambda s: {"err": s}, st.text(max_size=20)),
    st.builds(lambda v: {"result": v}, json_values), st.builds(lambda s: {"busy": s}, json_values),
    st.builds(lambda e, s: {"exit": e, "seal": s}, json_values, json_values),
    st.dictionaries(st.sampled_from(("out", "err", "result", "exit", "seal", "busy", "x")), json_values, max_size=3))


@st.composite
def replies(draw) -> bytes:
    data = b"".join(_framed(f) for f in draw(st.lists(reply_frames, max_size=6)))
    if draw(st.booleans()):
        data += draw(streams())
    return data


def test_replies_as_the_client_reads_them(ran):

    @FUZZ
    @given(replies())
    def one(data):
        ran()
        seen = []
        sock = _feed(data)
        sock.settimeout(1.0)
        with sock:
            try:
                got = client.receive(sock, seen.append)
            except (wire.FrameError, ConnectionError):
                got = None
        for f in seen:       # what a user's terminal could be handed: text, or a result
            assert len(f) == 1 and (isinstance(f.get("out"), str) or isinstance(f.get("err"), str) or "result" in f)
        if isinstance(got, client.Busy):
            assert seen == [] and isinstance(got.why, str)
        elif got is not None:
            final, frames = got
            assert type(final["exit"]) is int and isinstance(final["seal"], str) and len(frames) == len(seen)

    one()
