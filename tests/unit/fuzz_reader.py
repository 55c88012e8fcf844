"""The readers test_service_fuzz.py fuzzes, in a process of their own, so that
its peak memory (VmHWM) is theirs and not hypothesis' (whose record of the
inputs it tried grows with their number).

Protocol on stdin/stdout: each input is a target's letter, a 4-byte length
and the input's bytes; each answer a 4-byte length and a line: "ok ...",
"bad ..." (the reader returned something it must not) or "crash ..." (it
raised what it must not). Target "m" answers the peak memory in kB so far.

  f  a byte stream read as the service reads a request frame
  r  a credential's payload parsed as a request
  o  a hook operation's name and JSON arguments decoded by its type hints
  c  a byte stream read as the client reads a reply
"""
from __future__ import annotations

import json
import socket
import struct
import sys
import traceback

from slurm_snap import errors
from slurm_snap.protocol.recorder import LocalRecorder, OPS_METHODS
from slurm_snap.service import client, records, server, wire

_LEN = struct.Struct(">I")


def _feed(data: bytes) -> socket.socket:
    a, b = socket.socketpair()
    b.sendall(data)
    b.close()
    return a


def frames(data: bytes) -> str:
    with _feed(data) as sock:
        try:
            obj, raw = wire.recv(sock, limit=server.MAX_REQUEST, timeout=1.0)
        except (wire.FrameError, ConnectionError) as exc:
            return f"ok refused: {type(exc).__name__}"
    if not isinstance(obj, dict) or len(raw) > server.MAX_REQUEST:
        return "bad frame accepted"
    return "ok frame"


def requests(data: bytes) -> str:
    try:
        req = server.parse_request(data)
    except errors.UsageError as exc:
        return "ok refused" if str(exc) and len(str(exc)) < 300 else "bad message"
    if type(req["v"]) is not int or req["v"] != 1 or req["kind"] not in server.KINDS:
        return "bad request accepted"
    if req["kind"] == "cli" and not (req["argv"] and all(isinstance(a, str) for a in req["argv"])):
        return "bad argv accepted"
    if req["kind"] == "op" and not (isinstance(req["op"], str) and isinstance(req["args"], dict)):
        return "bad op accepted"
    return "ok request"


def op_args(data: bytes) -> str:
    op, args = json.loads(data)
    try:
        records.decode_call(getattr(LocalRecorder, OPS_METHODS[op]), args, op)
    except errors.BadValueError as exc:
        return "ok refused" if str(exc) else "bad message"
    return "ok decoded"


def replies(data: bytes) -> str:
    seen: list[dict] = []
    with _feed(data) as sock:
        sock.settimeout(1.0)
        try:
            got = client.receive(sock, seen.append)
        except (wire.FrameError, ConnectionError):
            got = None
    for f in seen:   # what a user's terminal could be handed: text, or a result
        if not (len(f) == 1 and (isinstance(f.get("out"), str) or isinstance(f.get("err"), str) or "result" in f)):
            return f"bad frame handed on: {sorted(f)}"
    if isinstance(got, client.Busy):
        return "ok busy" if seen == [] and isinstance(got.why, str) else "bad busy"
    if got is not None:
        final, kept = got
        if type(final["exit"]) is not int or not isinstance(final["seal"], str) or len(kept) != len(seen):
            return "bad final frame"
        return "ok reply"
    return "ok refused"


TARGETS = {"f": frames, "r": requests, "o": op_args, "c": replies}


def peak_kb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return -1


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = inp.read(1 + _LEN.size)
        if len(head) < 1 + _LEN.size:
            return
        target = head[:1].decode()
        (n,) = _LEN.unpack(head[1:])
        data = inp.read(n)
        if target == "m":
            answer = f"ok {peak_kb()}"
        else:
            try:
                answer = TARGETS[target](data)
            except Exception:   # noqa: BLE001 - what the fuzz is looking for
                answer = "crash " + traceback.format_exc()[-1500:]
        body = answer.encode()
        out.write(_LEN.pack(len(body)) + body)
        out.flush()


if __name__ == "__main__":
    main()
