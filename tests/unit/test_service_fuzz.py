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

The readers run in a process of their own (fuzz_reader.py), fed one input
at a time: each must answer within DEADLINE_S (no hang: every read has a
deadline), and that process's peak memory (VmHWM) may not grow by more
than MEMORY_MB from the first tenth of a run's inputs to its end (a length
field claiming 4 GiB allocates nothing). Measured in the reader, not here:
hypothesis' own record of what it tried grows with the inputs (+178 MB over
100,000 frames). Inputs per target: SLURM_SNAP_FUZZ_EXAMPLES (100 here and
in CI, so the unit suite stays short; 100,000 in the long run, a command
outside CI: README "Fuzzing the service"). Each target counts the inputs it
ran and fails if fewer ran than asked.
"""
from __future__ import annotations

import json
import os
import select
import struct
import subprocess
import sys
import time

# Not skipped when missing: hypothesis is in the [test] extras scripts/test installs.
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from slurm_snap.protocol.recorder import LocalRecorder, OPS_METHODS
from slurm_snap.service import server

# One knob: SLURM_SNAP_LONG is the fault suite's (scripts/test --long), not this.
EXAMPLES = int(os.environ.get("SLURM_SNAP_FUZZ_EXAMPLES") or 100)
DEADLINE_S = 5.0
MEMORY_MB = 16
# A socketpair holds this much without a reader: inputs stay below it, so
# the reader's own writer never waits on it.
MAX_INPUT = 48 * 1024
READER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_reader.py")
_LEN = struct.Struct(">I")

# hypothesis' deadline is off: the reader's answer has its own (DEADLINE_S),
# and a loaded machine must not make a slow example a failure of the service.
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Reader:
    """fuzz_reader.py in its own process: one input in, one answer out."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        self.n = 0
        self.mark: int | None = None

    def _read(self, n: int, deadline: float) -> bytes:
        fd, got = self.proc.stdout.fileno(), b""
        while len(got) < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.proc.kill()
                raise AssertionError(f"the reader gave no answer within {DEADLINE_S} s (a hang)")
            chunk = os.read(fd, n - len(got))
            if not chunk:
                raise AssertionError(f"the reader died (status {self.proc.wait()})")
            got += chunk
        return got

    def ask(self, target: str, data: bytes) -> str:
        self.proc.stdin.write(target.encode() + _LEN.pack(len(data)) + data)
        self.proc.stdin.flush()
        deadline = time.monotonic() + DEADLINE_S
        (n,) = _LEN.unpack(self._read(_LEN.size, deadline))
        return self._read(n, deadline).decode()

    def peak_kb(self) -> int:
        return int(self.ask("m", b"").split()[1])

    def run(self, target: str, data: bytes) -> None:
        self.n += 1
        answer = self.ask(target, data)
        assert answer.startswith("ok"), f"{answer}\ninput: {data[:300]!r}"
        if self.n == max(1, EXAMPLES // 10):
            self.mark = self.peak_kb()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


@pytest.fixture
def reader():
    r = Reader()
    yield r
    peak = r.peak_kb()
    grown = (peak - (r.mark or peak)) / 1024
    print(f"{r.n} inputs; the reader's peak memory {peak / 1024:.0f} MB, +{grown:.1f} MB after the first tenth")
    r.close()
    assert r.n >= EXAMPLES
    assert grown < MEMORY_MB, f"the reader's peak memory grew by {grown:.1f} MB over the last nine tenths"


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=40)


def _containers(inner):
    return st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)


json_values = st.recursive(json_scalars, _containers, max_leaves=12)


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


def test_frames_as_the_service_reads_them(reader):
    @FUZZ
    @given(streams())
    def one(data):
        reader.run("f", data)

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


def test_request_payloads(reader):
    @FUZZ
    @given(payloads())
    def one(payload):
        reader.run("r", payload)

    one()


OPS = sorted(OPS_METHODS)


def _op_args(method):
    """Arguments for `method`: its own names with any JSON values, or any names."""
    import typing

    names = [n for n in typing.get_type_hints(method) if n != "return"]
    return st.dictionaries(st.sampled_from(names) if names else st.text(max_size=8), json_values, max_size=8) \
        | st.dictionaries(st.text(max_size=8), json_values, max_size=3)


def test_hook_operation_arguments(reader):
    @FUZZ
    @given(st.sampled_from(OPS).flatmap(lambda op: st.tuples(st.just(op),
                                                             _op_args(getattr(LocalRecorder, OPS_METHODS[op])))))
    def one(case):
        reader.run("o", json.dumps(case).encode())

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


def test_replies_as_the_client_reads_them(reader):
    @FUZZ
    @given(replies())
    def one(data):
        reader.run("c", data)

    one()


def test_the_harness_sees_a_crash_in_the_reader():
    """An exception the readers must not raise is an answer the fuzz fails on."""
    r = Reader()
    try:
        answer = r.ask("o", json.dumps(["no-such-op", {}]).encode())
        assert answer.startswith("crash") and "KeyError" in answer
        assert r.ask("o", json.dumps(["resume-point", {"job_id": "x"}]).encode()).startswith("ok refused")
    finally:
        r.close()
