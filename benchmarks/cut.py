"""Issue 9, item 4: what a cut costs as the data grows.

On a fresh btrfs (loop device, sparse image), two volumes, each a subvolume
made by the product's btrfs backend (create_volume): SMALL (default 1 GiB in
10,000 files) and BIG (default 10 GiB in 100,000 files). For each:
  - snapshot through slurm_snap.backends (btrfs backend, local transport: the
    product's path, with its checks), after `sync`: "synced";
  - the first snapshot right after writing, without sync: btrfs flushes the
    dirty data inside the snapshot call ("unsynced"; the dirty amount is shown);
  - the reference: what a user without slurm-snap would do, `cp -a` of the
    same data made durable (cp then sync): `--reflink=never` (a real copy),
    and plain `cp -a` too (coreutils >= 9 reflinks on btrfs by default).
The growth row (BIG snapshot / SMALL snapshot) shows the cut does not grow
with the data. Free space is checked first; BIG shrinks (with a note) if short.

    $SLURM_SNAP_VENV/bin/python benchmarks/cut.py [--quick] [--small 1G:10000] [--big 10G:100000]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from common import Row, Unavailable  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
BASE = "/var/tmp"


def parse_size(text: str) -> tuple[int, int]:
    """'10G:100000' -> (bytes, files)."""
    size, _, files = text.partition(":")
    mult = {"K": 1 << 10, "M": MIB, "G": GIB}.get(size[-1:].upper(), 1)
    try:
        nbytes = int(float(size[:-1] if mult != 1 else size) * mult)
        nfiles = int(files)
    except ValueError:
        raise SystemExit(f"bad size {text!r}: expected SIZE:FILES, e.g. 1G:10000") from None
    if nbytes <= 0 or nfiles <= 0:
        raise SystemExit(f"bad size {text!r}: size and file count must be > 0")
    return nbytes, nfiles


def label(nbytes: int, nfiles: int) -> str:
    size = f"{nbytes / GIB:g} GiB" if nbytes >= GIB else f"{nbytes / MIB:g} MiB"
    return f"{size}/{nfiles // 1000}k files" if nfiles >= 1000 else f"{size}/{nfiles} files"


def fill(path: str, nbytes: int, nfiles: int) -> None:
    """nfiles files of equal size in 100 directories; incompressible bytes
    (btrfs does not compress by default, but a site might)."""
    per = max(1, nbytes // nfiles)
    block = os.urandom(min(per, 4 * MIB))
    for i in range(nfiles):
        d = os.path.join(path, f"d{i % 100:02d}")
        if i < 100:
            os.mkdir(d)
        with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
            left = per
            while left > 0:
                chunk = block[:left]
                f.write(chunk)
                left -= len(chunk)


def dirty_mib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("Dirty:"):
            return int(line.split()[1]) / 1024
    return 0.0


def sync_fs(path: str) -> None:
    common.run([common.which("sync"), "-f", path], timeout=1800)


def bench(small: tuple[int, int], big: tuple[int, int], quick: bool) -> tuple[list[Row], list[str]]:
    from slurm_snap.backends.registry import get_backend
    from slurm_snap.backends.transport import LocalTransport

    notes: list[str] = []
    # Originals of both sizes plus one copy of the bigger at a time, plus slack.
    need = lambda b: int((small[0] + 2 * b[0]) * 1.15) + GIB  # noqa: E731
    free = common.free_bytes(BASE)
    while need(big) > free and big[0] > small[0]:
        big = (big[0] // 2, big[1] // 2)
        notes.append(f"only {free / GIB:.1f} GiB free in {BASE}: BIG scaled down to {label(*big)}")
    if need(big) > free:
        raise Unavailable(f"only {free / GIB:.1f} GiB free in {BASE}")
    repeat_snap = 5 if quick else 15
    repeat_copy = 1 if quick else 2
    cp = common.which("cp")
    rows: list[Row] = []
    results = {}
    with common.loop_btrfs(need(big) + 2 * GIB, prefix="bench-cut-") as mnt:
        backend = get_backend("btrfs", {"timeout": 600.0}, LocalTransport())
        for tag, (nbytes, nfiles) in (("small", small), ("big", big)):
            vol = backend.create_volume(os.path.join(mnt, f"vol-{tag}"))
            t = time.perf_counter()
            fill(vol, nbytes, nfiles)
            write_s = time.perf_counter() - t
            dirty = dirty_mib()
            t = time.perf_counter()
            backend.create(vol, f"{tag}-unsynced")
            unsynced = time.perf_counter() - t
            sync_fs(mnt)
            snaps = []
            for i in range(repeat_snap):
                sync_fs(mnt)  # each cut of a quiesced volume: nothing dirty
                t = time.perf_counter()
                ref = backend.create(vol, f"{tag}-synced-{i}")
                snaps.append(time.perf_counter() - t)
                if not backend.exists(ref):
                    raise RuntimeError(f"snapshot {ref.ref} not found after create")
            copies: dict[str, list[float]] = {"never": [], "auto": []}
            for i in range(repeat_copy):
                for mode in ("never", "auto"):
                    # A subvolume as the target: deleting the copy is instant.
                    target = backend.create_volume(os.path.join(mnt, f"copy-{tag}-{mode}-{i}"))
                    t = time.perf_counter()
                    common.run([cp, "-a", f"--reflink={mode}", "--", vol + "/.", target + "/"], timeout=7200)
                    sync_fs(mnt)
                    copies[mode].append(time.perf_counter() - t)
                    common.run([common.which("btrfs"), "subvolume", "delete", "--", target], timeout=600)
                    # Deletion frees the extents later, in btrfs's cleaner: wait
                    # for it, or the next real copy runs out of space.
                    common.run([common.which("btrfs"), "subvolume", "sync", mnt], timeout=1800)
            results[tag] = {"label": label(nbytes, nfiles), "write_s": write_s, "dirty_mib": dirty,
                            "unsynced": unsynced, "synced": common.summarize(snaps),
                            "cp_never": common.summarize(copies["never"]),
                            "cp_auto": common.summarize(copies["auto"])}
            print(f"  {tag}: {label(nbytes, nfiles)} written in {write_s:.1f} s", flush=True)
    for tag in ("small", "big"):
        r = results[tag]
        rows.append(Row("cut", f"btrfs snapshot (synced), {r['label']}", r["synced"]["median"],
                        r["cp_never"]["median"], "ms", "cp -a --reflink=never + sync", "ratio", "", None,
                        f"median of {r['synced']['n']} cuts, copy median of {r['cp_never']['n']}", r))
        rows.append(Row("cut", f"  same, vs plain cp -a (reflink) + sync", r["synced"]["median"],
                        r["cp_auto"]["median"], "ms", "cp -a + sync", "ratio"))
        rows.append(Row("cut", f"  btrfs snapshot unsynced, {r['label']}", r["unsynced"] * 1000,
                        r["synced"]["median"], "ms", "synced snapshot", "ratio", "", None,
                        f"{r['dirty_mib']:.0f} MiB dirty (machine-wide) when cut; btrfs flushes inside the call"))
    s, b = results["small"]["synced"]["median"], results["big"]["synced"]["median"]
    grow = b / s
    rows.append(Row("cut", f"snapshot growth: {results['big']['label']} vs {results['small']['label']}", b, s, "ms",
                    "small snapshot", "ratio", f"< x2 for x{big[0] / small[0]:g} the data", grow < 2,
                    "synced; copy grew x{:.1f}".format(results["big"]["cp_never"]["median"]
                                                        / results["small"]["cp_never"]["median"])))
    return rows, notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.standard_args(ap)
    ap.add_argument("--small", help="SIZE:FILES (default 1G:10000; --quick 64M:1000)")
    ap.add_argument("--big", help="SIZE:FILES (default 10G:100000; --quick 256M:4000)")
    args = ap.parse_args(argv)
    small = parse_size(args.small or ("64M:1000" if args.quick else "1G:10000"))
    big = parse_size(args.big or ("256M:4000" if args.quick else "10G:100000"))
    print("cut cost against data size (btrfs on loop)", flush=True)
    rows, unavailable, notes = [], [], []
    try:
        rows, notes = bench(small, big, args.quick)
    except Unavailable as exc:
        unavailable.append(("btrfs cut", str(exc)))
    return common.finish(args.json, rows, unavailable, notes)


if __name__ == "__main__":
    sys.exit(main())
