#!/usr/bin/python3
"""Issue 23: what it costs to put a node-local part on another node.

    benchmarks/transfer.py [--quick] [--size 1G:10000] [--changed 0.01] [--json OUT]

(benchmarks/run runs it as benchmark 10, "transfer"; --quick: 64M:1000.)

Two btrfs filesystems on loop devices stand for two nodes' scratch disks.
A 1 GiB/10k-file volume is snapshotted (s1) and moved with
slurm_snap.backends.transfer (btrfs send | btrfs receive, the stream passing
through this process as it passes through the controller); then 1% of its
files are rewritten, snapshotted (s2) and moved incrementally (send -p s1).
Reference: a plain copy of the same files through the same pipe (tar | tar,
the copy fallback). Every row ends with the target synced, so no case
leaves its writes in the page cache. Target (issue 23): incremental with
1% changed <= 1/20 of a full copy's time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402
from cut import fill, label, parse_size, sync_fs  # noqa: E402

TARGET = 0.05   # incremental with 1% changed, as a fraction of the full send's time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.standard_args(parser)
    parser.add_argument("--size", help="SIZE:FILES (default 1G:10000; --quick 64M:1000)")
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of files rewritten (default 0.01)")
    args = parser.parse_args(argv)
    nbytes, nfiles = parse_size(args.size or ("64M:1000" if args.quick else "1G:10000"))
    try:
        measured = bench(nbytes, nfiles, args.changed)
    except Unavailable as exc:
        return common.finish(args.json, [], [("btrfs send/receive", str(exc))])
    full_secs, full_bytes = measured[0][1], measured[0][2]
    rows = []
    for i, (what, secs, moved) in enumerate(measured):
        if i == 0:
            rows.append(Row("transfer", f"{label(nbytes, nfiles)}: {what}", secs, unit="s",
                            note=f"{moved / (1 << 20):.1f} MiB moved"))
            continue
        incremental = i == 1
        # The target is about a real part's size; a --quick run's few MiB
        # are dominated by starting the tools and says nothing about it.
        met = None if args.quick or not incremental else secs / full_secs <= TARGET
        rows.append(Row("transfer", f"{label(nbytes, nfiles)}: {what}", secs, full_secs, unit="s",
                        ref_name="full send", target=f"<= x{TARGET:g} of full" if incremental else "", met=met,
                        note=f"{moved / (1 << 20):.1f} MiB moved (full: {full_bytes / (1 << 20):.1f} MiB)"))
    return common.finish(args.json, rows)


def bench(nbytes: int, nfiles: int, fraction: float) -> list[tuple[str, float, int]]:
    """(case, seconds, bytes moved): full send, incremental send, plain tar copy."""
    from slurm_snap.backends.registry import get_backend
    from slurm_snap.backends.transfer import _pipe, transfer
    from slurm_snap.backends.transport import LocalTransport

    img = max(3 * nbytes, 1 << 30)
    with common.loop_btrfs(img, prefix="bench-xfer-src-") as src_mnt, \
            common.loop_btrfs(img, prefix="bench-xfer-dst-") as dst_mnt:
        src = get_backend("btrfs", {"timeout": 3600.0}, LocalTransport())
        dst = get_backend("btrfs", {"timeout": 3600.0}, LocalTransport())
        vol = src.create_volume(os.path.join(src_mnt, "vol"))
        fill(vol, nbytes, nfiles)
        sync_fs(src_mnt)
        s1 = src.create(vol, "s1")
        into = os.path.join(dst_mnt, ".snapshots")
        rows = []

        def timed(what, fn):
            t0 = time.monotonic()
            out = fn()
            sync_fs(dst_mnt)
            rows.append((what, time.monotonic() - t0, out))
            return out

        timed("full (btrfs send)", lambda: transfer(src, s1, dst, timeout=3600, into=into).bytes)
        # 1% of the files rewritten whole, new bytes (an optimizer state, a shard).
        changed = max(1, int(nfiles * fraction))
        per = max(1, nbytes // nfiles)
        for i in range(changed):
            with open(os.path.join(vol, f"d{i % 100:02d}", f"f{i:07d}"), "wb") as f:
                f.write(os.urandom(per))
        sync_fs(src_mnt)
        s2 = src.create(vol, "s2")
        timed(f"incremental, {fraction:.0%} of files changed (send -p)",
              lambda: transfer(src, s2, dst, timeout=3600, into=into, parent=s1).bytes)
        plain_dir = os.path.join(dst_mnt, "plain")
        os.mkdir(plain_dir)
        tar = common.which("tar")
        timed("reference: plain copy (tar | tar, same pipe)",
              lambda: _pipe(src, [tar, "-C", s1.ref, "-cf", "-", "."], dst,
                            [tar, "-C", plain_dir, "-xf", "-"], 3600))
    return rows

if __name__ == "__main__":
    sys.exit(main())
