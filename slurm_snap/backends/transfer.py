"""A snapshot from one host to another: the source's tool's stdout into the
target's tool's stdin, through this process (no shell pipe, no temporary file).

    source host   btrfs send [-p PARENT] SNAP      (or tar of the snapshot's files)
        |  Transport.open(reads=True)              local subprocess or SSH channel
    this process  read 1 MiB, write it on, count it
        |  Transport.open(writes=True)
    target host   btrfs receive SNAPDIR            (or tar into a partial, then rename)

The bytes pass through the host that runs this (the controller, the only one
with the SSH key): twice the network of a node-to-node stream, in exchange for
nodes that hold no key to each other. Which means is used is decided from the
backends' capabilities (data), never their class: `send` when both ends are
the same kind of backend and it can send, else `copy` when both can copy.
"""
from __future__ import annotations

import posixpath
import threading
import time
from dataclasses import dataclass, replace

from slurm_snap import errors
from slurm_snap.backends.base import Backend, SnapshotRef, check_abs_path

CHUNK = 1 << 20


@dataclass(frozen=True)
class Transferred:
    ref: SnapshotRef      # the copy, as the target backend names it
    method: str           # "send", "send-incremental", "copy", or "present" (already there)
    bytes: int            # stream bytes moved (0 when present)
    seconds: float


def method_for(source: Backend, target: Backend) -> str | None:
    """The cheapest real means between these two backends, or None."""
    if source.name == target.name and source.capabilities.can_send and target.capabilities.can_send:
        return "send"
    if source.capabilities.can_copy and target.capabilities.can_copy:
        return "copy"
    return None


def placed(ref: SnapshotRef, into: str | None = None) -> SnapshotRef:
    """The ref a copy of `ref` has on the other host: the same name in `into`
    (default: the same directory, which on a node-local class is the same path
    on every node)."""
    if into is None:
        return ref
    path = posixpath.join(check_abs_path("transfer target", into), posixpath.basename(ref.ref))
    return replace(ref, ref=path, path=path)


def transfer(source: Backend, ref: SnapshotRef, target: Backend, *, timeout: float,
             parent: SnapshotRef | None = None, into: str | None = None) -> Transferred:
    """Make `ref` (a snapshot `source` holds) exist on `target`'s host, under
    the same name in directory `into` (default: the same path). Idempotent: a complete copy already there is left as it is
    ("present"). `parent` (send only) is a snapshot of the same volume both
    hosts hold; the stream then carries only what changed since it. On any
    failure what the target received is discarded, and the error propagates:
    errors.Timeout past `timeout`, errors.CommandFailed naming the failing
    end, errors.Unsupported when no means fits."""
    t0 = time.monotonic()
    dest = placed(ref, into)
    if target.exists(dest):
        return Transferred(dest, "present", 0, 0.0)
    method = method_for(source, target)
    if method is None:
        raise errors.Unsupported(backend=f"{source.name} -> {target.name}", verb="transfer")
    if method == "send":
        out_argv = source.send_argv(ref, parent)
        in_argv = target.receive_argv(dest)
    else:
        parent = None
        out_argv = source.copy_out_argv(ref)
        in_argv = target.copy_in_argv(dest)
    moved = 0
    try:
        moved = _pipe(source, out_argv, target, in_argv, timeout)
        if method == "copy":
            target.finish_copy_in(dest)
        if not target.exists(dest):
            raise errors.BackendError(backend=target.name,
                                      why=f"{dest.ref} is not complete on {target.transport.where} after the transfer")
    except BaseException:
        try:
            target.discard_partial(dest)
        except errors.SnapError:
            pass  # the original failure is the one to report
        raise
    label = "send-incremental" if method == "send" and parent is not None else method
    return Transferred(dest, label, moved, time.monotonic() - t0)


def _pipe(source: Backend, out_argv: list[str], target: Backend, in_argv: list[str], timeout: float) -> int:
    deadline = time.monotonic() + timeout
    sink = target.transport.open(in_argv, timeout, reads=False, writes=True)
    try:
        src = source.transport.open(out_argv, timeout, reads=True, writes=False)
    except BaseException:
        sink.kill()
        raise
    fired = threading.Event()

    def expire() -> None:
        # Reads and writes block; killing both ends is what unblocks them.
        fired.set()
        src.kill()
        sink.kill()

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    moved = 0
    try:
        try:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                sink.write(chunk)
                moved += len(chunk)
        except (OSError, errors.SnapError) as exc:
            if fired.is_set():
                raise errors.Timeout(what=f"transfer {source.transport.where} -> {target.transport.where}",
                                     seconds=timeout) from None
            # The receiving tool died (e.g. no space): its status below says why.
            src.kill()
            broken = exc
        else:
            broken = None
        sink.close_input()
        left = max(0.1, deadline - time.monotonic())
        got_in = sink.wait(left)
        got_out = src.wait(max(0.1, deadline - time.monotonic()))
    finally:
        watchdog.cancel()
    if fired.is_set():
        raise errors.Timeout(what=f"transfer {source.transport.where} -> {target.transport.where}", seconds=timeout)
    # The receiving end first: when it fails, the sender's broken pipe is only a consequence.
    for argv, res, where in ((in_argv, got_in, target.transport.where), (out_argv, got_out, source.transport.where)):
        if res.status != 0:
            lines = [ln.strip() for ln in res.stderr.decode(errors="replace").splitlines() if ln.strip()]
            tool = " ".join([argv[0].rsplit("/", 1)[-1], *argv[1:2]])   # e.g. "btrfs receive"
            raise errors.CommandFailed(argv0=f"{tool} (on {where})", status=res.status,
                                       stderr=" / ".join(lines)[:2000] or "(no stderr)", argv=argv, host=where)
    if broken is not None:
        raise errors.TransportError(host=target.transport.where, why=f"stream broken: {broken}")
    return moved
