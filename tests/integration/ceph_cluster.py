"""A one-host Ceph 16 with a CephFS, mounted with ceph-fuse, for the cephfs backend's real tests.

No systemd and no /etc/ceph: every daemon gets the conf file, data dirs,
admin sockets and cephx keys this module makes in a temp dir, binds to
127.0.0.1 on free ports, runs in the foreground (-f) so the PID we stop is
the one we started, and is stopped by that PID at the end (client first:
unmount, then mds, osd, mgr, mon). The OSD stores objects in memory
(memstore, capped at MEMSTORE_MB): nothing touches a disk or a loop device,
and nothing survives the session.

Measured on this machine kind (2 cores, Debian 12, Ceph 16.2.15): start to
an active MDS and a ceph-fuse mount in 7 to 12 s (most of it the mon's
first election and the MDS going through its boot states), ~440 MiB RSS for
the five processes. With CI=true a missing package is a failure.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field

import pytest
from testkit.loopfs import which
from realcomponents import require

FS_NAME = "sstest"
MEMSTORE_MB = 512  # what the OSD may hold in memory; the suite writes a few KB
TOOLS = ("ceph", "ceph-authtool", "monmaptool", "ceph-mon", "ceph-mgr", "ceph-osd", "ceph-mds", "ceph-fuse")
START_TIMEOUT = 120  # a loaded 2-core CI machine; an idle one needs ~6 s


@dataclass
class CephFs:
    """What tests use: the mount, and a `ceph` CLI bound to this cluster's conf and admin key."""

    mountpoint: str  # the CephFS root, through ceph-fuse
    conf: str
    admin_keyring: str
    client: str  # the cephx name the mount uses (`ceph fs authorize ... rws`)
    tmp: str
    pids: dict[str, int] = field(default_factory=dict)
    start_seconds: float = 0.0

    def ceph(self, *args: str, timeout: float = 60) -> str:
        res = subprocess.run([which("ceph"), "-c", self.conf, "-k", self.admin_keyring, "-n", "client.admin",
                              "--connect-timeout", "30", *args], capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise RuntimeError(f"ceph {' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def rss_kb(self) -> dict[str, int]:
        out = {}
        for name, pid in self.pids.items():
            with open(f"/proc/{pid}/status") as f:
                out[name] = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return out


def _conf(tmp: str, fsid: str, mon_port: int) -> str:
    # ms_bind_*: the OSD, MDS and mgr pick their own ports; 127.0.0.1 keeps
    # them off the machine's interfaces. $name expands per daemon.
    return f"""[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
mon initial members = a
public addr = 127.0.0.1
ms bind ipv6 = false
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
run dir = {tmp}/run
admin socket = {tmp}/run/$name.asok
pid file = {tmp}/run/$name.pid
log file = {tmp}/log/$name.log
mon data = {tmp}/data/$name
mgr data = {tmp}/data/$name
osd data = {tmp}/data/$name
mds data = {tmp}/data/$name
keyring = {tmp}/data/$name/keyring
crash dir = {tmp}/crash
# One OSD on one host: pools of one replica, and CRUSH may place on that OSD.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
osd crush chooseleaf type = 0
mon warn on pool no redundancy = false
osd objectstore = memstore
memstore device bytes = {MEMSTORE_MB << 20}
# Two cores shared with other work: few threads, small caches.
osd op num shards = 1
osd op num threads per shard = 1
mds cache memory limit = 67108864
mgr initial modules =
"""


def _spawn(tmp: str, name: str, argv: list[str]) -> subprocess.Popen:
    log = open(os.path.join(tmp, "log", f"{name}.stderr"), "w")
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)


def _wait(what: str, ok, procs: dict[str, subprocess.Popen], tmp: str, deadline: float) -> None:
    while True:
        dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        try:
            if not dead and ok():
                return
        except (RuntimeError, subprocess.TimeoutExpired, ValueError):
            pass  # the mon answers errors (the mgr half-made JSON) while still starting
        if dead or time.monotonic() > deadline:
            logs = "".join(f"\n--- {f}\n" + open(os.path.join(tmp, "log", f)).read()[-2000:]
                           for f in sorted(os.listdir(os.path.join(tmp, "log"))))
            pytest.fail(f"ceph: {what} not reached (exited: {dead}); logs:{logs}")
        time.sleep(0.2)


def _mds_active(fs) -> bool:
    """Whether the filesystem's MDS is active. `ceph fs status` is the mgr's:
    while the mgr's status module is still loading it answers without an
    `mdsmap` (a CI run on a fresh machine got that), which is "not yet"."""
    ranks = json.loads(fs.ceph("fs", "status", FS_NAME, "-f", "json")).get("mdsmap") or []
    return any(r.get("state") == "active" for r in ranks if isinstance(r, dict))


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 5 s: the MDS spends 8 to 30 s on a clean
    shutdown here, and nothing of this memstore cluster is kept anyway."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def cephfs_cluster():
    """Start mon, mgr, one memstore OSD and an MDS; make a CephFS with new
    snapshots allowed; mount it with ceph-fuse as a client whose key has the
    `s` (snapshot) flag. Everything is stopped by PID and removed at the end."""
    require(os.geteuid() == 0, "the test Ceph runs as root (ceph-fuse mounts)")
    require(os.path.exists("/dev/fuse"), "/dev/fuse is missing (ceph-fuse needs FUSE)")
    for tool in TOOLS:
        require(which(tool) is not None,
                f"{tool} not installed (apt-get install ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common)")
    from fs import free_port  # fs imports this module; a late import avoids the cycle

    t0 = time.monotonic()
    deadline = t0 + START_TIMEOUT
    tmp = tempfile.mkdtemp(prefix="slurm-snap-ceph-")
    for d in ("run", "log", "crash", "data/mon.a", "data/mgr.x", "data/osd.0", "data/mds.a", "mnt"):
        os.makedirs(os.path.join(tmp, d))
    conf = os.path.join(tmp, "ceph.conf")
    fsid, mon_port = str(uuid.uuid4()), free_port()
    with open(conf, "w") as f:
        f.write(_conf(tmp, fsid, mon_port))
    admin = os.path.join(tmp, "admin.keyring")
    procs: dict[str, subprocess.Popen] = {}
    mounted = False
    fs = CephFs(os.path.join(tmp, "mnt"), conf, admin, "client.snaptest", tmp)

    def tool(*argv: str, timeout: float = 60) -> None:
        res = subprocess.run([which(argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            pytest.fail(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")

    try:
        # mkfs copies this into the mon's data dir: it must live elsewhere.
        mon_keyring = os.path.join(tmp, "mon.keyring")
        tool("ceph-authtool", "--create-keyring", mon_keyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *")
        tool("ceph-authtool", "--create-keyring", admin, "--gen-key", "-n", "client.admin",
             *[a for s in ("mon", "osd", "mds", "mgr") for a in ("--cap", s, "allow *")])
        tool("ceph-authtool", mon_keyring, "--import-keyring", admin)
        monmap = os.path.join(tmp, "monmap")
        tool("monmaptool", "--create", "--fsid", fsid, "--addv", "a", f"[v2:127.0.0.1:{mon_port}]",
             "--set-min-mon-release", "pacific", monmap)
        tool("ceph-mon", "-c", conf, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", mon_keyring)
        procs["mon"] = _spawn(tmp, "mon", [which("ceph-mon"), "-f", "-c", conf, "-i", "a"])
        _wait("mon quorum", lambda: json.loads(fs.ceph("quorum_status", "-f", "json"))["quorum_names"] == ["a"],
              procs, tmp, deadline)

        # Keys each daemon reads from its data dir (the conf's keyring).
        fs.ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd", "allow *", "mds", "allow *",
                "-o", os.path.join(tmp, "data/mgr.x/keyring"))
        procs["mgr"] = _spawn(tmp, "mgr", [which("ceph-mgr"), "-f", "-c", conf, "-i", "x"])

        osd_uuid = str(uuid.uuid4())
        osd_id = fs.ceph("osd", "new", osd_uuid).strip()
        if osd_id != "0":  # the conf's data dir and keyring are osd.0's
            pytest.fail(f"ceph osd new gave id {osd_id!r}, expected '0'")
        fs.ceph("auth", "get-or-create", "osd.0", "mon", "allow profile osd", "mgr", "allow profile osd",
                "osd", "allow *", "-o", os.path.join(tmp, "data/osd.0/keyring"))
        tool("ceph-osd", "-c", conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
        procs["osd"] = _spawn(tmp, "osd", [which("ceph-osd"), "-f", "-c", conf, "-i", "0"])

        fs.ceph("osd", "pool", "create", f"{FS_NAME}_metadata", "8")
        fs.ceph("osd", "pool", "create", f"{FS_NAME}_data", "8")
        fs.ceph("fs", "new", FS_NAME, f"{FS_NAME}_metadata", f"{FS_NAME}_data")
        # The switch a site must turn on (new filesystems allow it from Mimic on; said here explicitly).
        fs.ceph("fs", "set", FS_NAME, "allow_new_snaps", "true")
        fs.ceph("auth", "get-or-create", "mds.a", "mon", "allow profile mds", "osd", "allow rwx", "mds", "allow",
                "mgr", "allow profile mds", "-o", os.path.join(tmp, "data/mds.a/keyring"))
        procs["mds"] = _spawn(tmp, "mds", [which("ceph-mds"), "-f", "-c", conf, "-i", "a"])

        # What a site gives a snapshotting client: rw plus the `s` flag, nothing more.
        client_keyring = os.path.join(tmp, "client.keyring")
        with open(client_keyring, "w") as f:
            f.write(fs.ceph("fs", "authorize", FS_NAME, fs.client, "/", "rws"))
        _wait("an active MDS", lambda: _mds_active(fs), procs, tmp, deadline)
        procs["fuse"] = _spawn(tmp, "fuse", [which("ceph-fuse"), "-f", "-c", conf, "-n", fs.client, "-k",
                                             client_keyring, "--client_fs", FS_NAME, fs.mountpoint])
        mounted = True
        _wait("the ceph-fuse mount", lambda: os.path.ismount(fs.mountpoint), procs, tmp, deadline)
        fs.start_seconds = time.monotonic() - t0
        fs.pids = {n: p.pid for n, p in procs.items()}
        yield fs
    finally:
        if mounted and os.path.ismount(fs.mountpoint):
            subprocess.run([which("umount"), fs.mountpoint], capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        for name in ("fuse", "mds", "osd", "mgr", "mon"):  # clients before servers; the mon last
            if name in procs:
                _stop(procs[name])
        shutil.rmtree(tmp, ignore_errors=True)
