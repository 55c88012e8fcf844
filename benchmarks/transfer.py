#!/usr/bin/python3
"""Issue 23: what it costs to put a node-local part on another node.

    benchmarks/transfer.py [--size 1G:10000] [--changed 0.01]

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
from cut import fill, label, parse_size, sync_fs  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G:10000")
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of files rewritten (default 0.01)")
    args = parser.parse_args(argv)
    nbytes, nfiles = parse_size(args.size)

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

        full = timed("full (btrfs send)", lambda: transfer(src, s1, dst, timeout=3600, into=into).bytes)
        # 1% of the files rewritten whole, new bytes (an optimizer state, a shard).
        changed = max(1, int(nfiles * args.changed))
        per = max(1, nbytes // nfiles)
        for i in range(changed):
            with open(os.path.join(vol, f"d{i % 100:02d}", f"f{i:07d}"), "wb") as f:
                f.write(os.urandom(per))
        sync_fs(src_mnt)
        s2 = src.create(vol, "s2")
        timed(f"incremental, {args.changed:.0%} of files changed (send -p)",
              lambda: transfer(src, s2, dst, timeout=3600, into=into, parent=s1).bytes)
        plain_dir = os.path.join(dst_mnt, "plain")
        os.mkdir(plain_dir)
        tar = common.which("tar")
        timed("reference: plain copy (tar | tar, same pipe)",
              lambda: _pipe(src, [tar, "-C", s1.ref, "-cf", "-", "."], dst,
                            [tar, "-C", plain_dir, "-xf", "-"], 3600))
    print(f"\n{label(nbytes, nfiles)}: moving a node-local part to another node (both ends local transports)")
    print(f"  {'case':<52} {'seconds':>9} {'MiB moved':>10} {'x full':>7}")
    base = rows[0][1]
    for what, secs, moved in rows:
        print(f"  {what:<52} {secs:>9.2f} {moved / (1 << 20):>10.1f} {secs / base:>7.3f}")
    inc = rows[1][1] / base
    print(f"  incremental / full = {inc:.3f} (target <= 0.05): {'met' if inc <= 0.05 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
