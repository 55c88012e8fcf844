"""Shared pieces of the benchmark suite: statistics, result rows, the JSON
hand-off to benchmarks/run, interleaved timing and a btrfs on a loop device.

Every figure is measured beside its reference in the same run and quoted as a
ratio (or a difference, for costs added to a path): this machine is shared
and noisy, so absolute numbers from different runs are not comparable.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# slurm_snap from the work tree, and testkit/ (what the benchmarks share with
# the tests: doubles, loop filesystems, the dev cluster's driver); nothing
# from tests/.
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# The venv scripts/lib-packages.sh installs (SLURM_SNAP_VENV overrides it there too).
VENV_PY = os.path.join(os.environ.get("SLURM_SNAP_VENV") or "/opt/slurm-snap/venv", "bin", "python")
SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"


class Unavailable(Exception):
    """A benchmark cannot run here (missing root, tool, server, cluster, protocol)."""


@dataclass
class Row:
    """One line of the suite's table.

    `value` and `reference` are in `unit`; `compare` says how they relate:
    "ratio" (value / reference) or "added" (value - reference, a cost added
    to a path). `met` is None when the issue sets no target for the row.
    """

    bench: str
    case: str
    value: float | None
    reference: float | None = None
    unit: str = "ms"
    ref_name: str = ""
    compare: str = "ratio"
    target: str = ""
    met: bool | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def relation(self) -> float | None:
        if self.value is None or self.reference is None:
            return None
        if self.compare == "added":
            return self.value - self.reference
        return self.value / self.reference if self.reference else None


def summarize(samples: list[float]) -> dict:
    """Median and spread of timing samples (seconds in, milliseconds out)."""
    ms = sorted(s * 1000 for s in samples)
    if not ms:
        return {"n": 0}
    q = statistics.quantiles(ms, n=10, method="inclusive") if len(ms) >= 2 else [ms[0]] * 9
    return {"n": len(ms), "median": statistics.median(ms), "p10": q[0], "p90": q[-1], "min": ms[0], "max": ms[-1]}


def interleaved(cases: dict[str, Callable[[], None]], iterations: int, warmup: int = 2) -> dict[str, list[float]]:
    """Time each case `iterations` times, round-robin, so a burst of load on
    the machine hits every case alike instead of one case's whole series."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    out: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(iterations):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t)
    return out


def write_rows(path: str | None, rows: list[Row], unavailable: list[tuple[str, str]] = ()) -> None:
    """The hand-off to benchmarks/run: rows and 'not available' reasons as JSON."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"rows": [asdict(r) for r in rows],
                   "unavailable": [{"case": c, "reason": r} for c, r in unavailable]}, f, indent=1)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms" and abs(value) >= 10000:
        return f"{value / 1000:.1f} s"
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:.2f} {unit}" if abs(value) < 10 else f"{value:.1f} {unit}"


def relation_text(r: Row) -> str:
    rel = r.relation
    if rel is None:
        return ""
    if r.compare == "added":
        return ("+" if rel >= 0 else "-") + fmt(abs(rel), r.unit)
    if rel >= 0.1 or rel <= 0:
        return f"x{rel:.2f}"
    return f"x{rel:.4f} (1/{1 / rel:,.0f})"


def print_rows(rows: list[Row]) -> None:
    for r in rows:
        verdict = {True: "met", False: "MISSED", None: ""}[r.met]
        ref = f"  vs {r.ref_name} {fmt(r.reference, r.unit)} -> {relation_text(r)}" if r.reference is not None else ""
        target = f"  [{r.target}: {verdict}]" if r.target else ""
        print(f"  {r.case:<48} {fmt(r.value, r.unit):>11}{ref}{target}{('  (' + r.note + ')') if r.note else ''}",
              flush=True)


def finish(json_path: str | None, rows: list[Row], unavailable: list[tuple[str, str]] = (),
           notes: list[str] = ()) -> int:
    """Every benchmark's ending: print its rows, notes and what was not
    available, hand them to benchmarks/run as JSON; the exit status."""
    print_rows(rows)
    for n in notes:
        print(f"  note: {n}")
    for case, why in unavailable:
        print(f"  {case}: not available: {why}")
    if notes and rows:
        rows[-1].note += "; " + "; ".join(notes)
    write_rows(json_path, rows, unavailable)
    return 0


def run(argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """argv only, no shell; stdin closed; raises on a non-zero exit with stderr."""
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} {' '.join(argv[1:4])}... exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return proc


def which(tool: str) -> str:
    found = shutil.which(tool, path=SBIN)
    if not found:
        raise Unavailable(f"{tool} not installed")
    return found


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def machine_info() -> dict:
    mem = ""
    with contextlib.suppress(OSError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    cpu = ""
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    uname = " ".join(os.uname())
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        uname = subprocess.run([which("uname"), "-a"], capture_output=True, text=True, timeout=10).stdout.strip()
    return {"uname": uname, "nproc": os.cpu_count(), "memory": mem, "cpu": cpu,
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg())}


@contextlib.contextmanager
def loop_btrfs(size_bytes: int, *, prefix: str = "bench-btrfs-", base: str = "/var/tmp") -> Iterator[str]:
    """A fresh btrfs on a sparse image in a temp dir under `base`, mounted;
    yields the mount point. The same loop-device code as the tests
    (testkit/loopfs.py): torn down on the way out, whatever happened."""
    from testkit import loopfs

    why = loopfs.missing("btrfs")
    if why:
        raise Unavailable(why)
    with loopfs.mounted("btrfs", size_bytes, prefix=prefix, base=base) as fs:
        yield fs.mountpoint


def standard_args(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes, few iterations (CI smoke)")
    parser.add_argument("--json", metavar="PATH", help="write result rows here (for benchmarks/run)")


def attach_cluster(state: str):
    """A dev cluster that is already up (scripts/dev-cluster up STATE), driven
    with the driver the integration tests use (testkit/cluster.py), so the
    suite submits and waits the way the tests do."""
    from testkit.cluster import Cluster, ClusterError

    try:
        return Cluster.attach(state)
    except ClusterError as exc:
        raise Unavailable(str(exc)) from None
