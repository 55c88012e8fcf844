"""One conformance suite, run by every backend.

Real filesystems: btrfs and xfs-reflink on loop devices, btrfs again through
SshTransport against our own sshd, zfs on a zfs-fuse pool (the zfs-fuse
0.7 CLI dialect), and cephfs on a one-host Ceph 16 mounted with ceph-fuse
(tests/integration/ceph_cluster.py). zfs again (the OpenZFS 2.x dialect),
lvm, lustre, gpfs and cephfs again run against the fake CLIs in tests/fakes
(documented argv, output and errors; not the real systems). Each case asserts the contract in base.py.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import stat
import subprocess
import time
from dataclasses import dataclass
from typing import Callable

import pytest

import fs as realfs
from slurm_snap import errors
from slurm_snap.backends.base import Backend
from slurm_snap.backends.registry import get_backend
from slurm_snap.backends.ssh import SshTransport
from slurm_snap.backends.transport import LocalTransport

btrfs_fs, xfs_fs, sshd, zfs_pool = realfs.btrfs_fs, realfs.xfs_fs, realfs.sshd, realfs.zfs_pool  # session fixtures
cephfs = realfs.cephfs

FAKES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes")
FAKE_ENV = "SLURM_SNAP_FAKE_STATE"
ODD = "odd 'sq' \"dq\" $HOME;x&y|z*"  # shell metacharacters a quoting bug would trip over
_seq = itertools.count()


@dataclass
class Harness:
    """A backend plus what the suite needs to drive it."""

    backend: Backend
    volume: str
    other_volume: str            # a second volume on the same backend instance
    names: str                   # "collide" | "independent" | "shared" (same name, other volume)
    odd_volume: str              # a volume whose name/path has unusual characters
    clone_target: Callable[[str], str]  # a fresh clone target from a name (plain or ODD)
    rebuild: Callable[..., Backend]  # (tool_dir=..., timeout=...) -> same backend kind
    volume_dir: Callable[[str], str | None] = lambda v: None  # where the test can write volume files
    enforced_ro: bool = False    # a real filesystem refuses writes (even from root)
    # Snapshots have a path where their files show (zfs-fuse has no .zfs
    # directory, so its snapshots have none and are read through a clone).
    browsable: bool = True
    # A snapshot cannot be deleted while a clone of it exists (ZFS: "snapshot
    # has dependent clones"); the clone goes first, through delete_clone().
    clones_pin: bool = False


def _subvolume(path: str) -> str:
    subprocess.run(["/usr/bin/btrfs", "subvolume", "create", path], check=True, capture_output=True)
    return path


def _btrfs(tmp_root: str, transport) -> Harness:
    parent = os.path.join(tmp_root, f"t{next(_seq)}")
    os.mkdir(parent)
    vols = [_subvolume(os.path.join(parent, n)) for n in ("vol", "other", ODD)]

    def make(**opts):
        return get_backend("btrfs", opts, transport)

    return Harness(make(), vols[0], vols[1], "collide", vols[2],
                   lambda n: os.path.join(parent, f"clone-{n}"), make,
                   volume_dir=lambda v: v, enforced_ro=True)


def _xfs(tmp_root: str, seal: str) -> Harness:
    parent = os.path.join(tmp_root, f"t{next(_seq)}")
    vols = [os.path.join(parent, n) for n in ("vol", "other", ODD)]
    for v in vols:
        os.makedirs(v)

    def make(**opts):
        return get_backend("xfs-reflink", {"seal": seal, **opts}, LocalTransport())

    return Harness(make(), vols[0], vols[1], "collide", vols[2],
                   lambda n: os.path.join(parent, f"clone-{n}"), make,
                   volume_dir=lambda v: v, enforced_ro=seal == "immutable")


def _fake_env(tmp_path) -> tuple[str, LocalTransport, Callable[..., None]]:
    state = str(tmp_path / "state")
    os.makedirs(state, exist_ok=True)
    env = {FAKE_ENV: state}

    def tool(*argv: str) -> None:  # test setup through the fake CLI itself
        subprocess.run([os.path.join(FAKES, argv[0]), *argv[1:]], check=True, capture_output=True,
                       env={"PATH": "/usr/bin:/bin", **env})

    return state, LocalTransport(extra_env=env), tool


def _zfs(tmp_path) -> Harness:
    state, transport, tool = _fake_env(tmp_path)
    vols = ["tank/vol", "tank/other", "tank/odd name:x.y-z"]
    for v in vols:
        tool("zfs", "create", v)

    def make(**opts):
        return get_backend("zfs", {"tool_dir": FAKES, **opts}, transport)

    return Harness(make(), vols[0], vols[1], "independent", vols[2], lambda n: f"tank/clone-{n.replace(ODD, 'odd name')}", make,
                   volume_dir=lambda v: os.path.join(state, "mnt", v), clones_pin=True)


def _zfs_paths(tmp_path) -> Harness:
    """The fake OpenZFS CLI with volumes and clone targets named by path (mountpoints)."""
    state, transport, tool = _fake_env(tmp_path)
    tool("zfs", "create", "tank")
    vols = ["tank/vol", "tank/other", "tank/odd name:x.y-z"]
    for v in vols:
        tool("zfs", "create", v)
    mnt = os.path.join(state, "mnt")

    def make(**opts):
        return get_backend("zfs", {"tool_dir": FAKES, **opts}, transport)

    return Harness(make(), *(os.path.join(mnt, v) for v in vols[:2]), "independent", os.path.join(mnt, vols[2]),
                   lambda n: os.path.join(mnt, "tank", f"clone-{n}"), make, volume_dir=lambda v: v, clones_pin=True)


def _zfs_fuse(pool) -> Harness:
    parent = f"{pool.name}/t{next(_seq)}"
    vols = [f"{parent}/{n}" for n in ("vol", "other", "odd name:x.y-z")]
    for v in vols:  # datasets inherit the pool's mountpoint: <pool mnt>/t<n>/<name>
        subprocess.run([realfs.which("zfs"), "create", "-p", v], check=True, capture_output=True, timeout=60)

    def make(**opts):
        return get_backend("zfs", opts, LocalTransport())

    backend = make()
    assert backend.dialect.name == "legacy", backend.dialect  # the dialect this variant exists to prove
    return Harness(backend, vols[0], vols[1], "independent", vols[2],
                   lambda n: f"{parent}/clone-{n.replace(ODD, 'odd name')}", make,
                   volume_dir=lambda v: pool.mountpoint + v[len(pool.name):], enforced_ro=True, browsable=False,
                   clones_pin=True)


def _zfs_fuse_paths(pool) -> Harness:
    """The same pool, volumes and clone targets named by path, as volume
    classes and restore drills name them: a volume is a dataset's mountpoint,
    a clone a dataset mounted at the target (inside the pool's mounts)."""
    h = _zfs_fuse(pool)
    mp = h.volume_dir

    def make(**opts):
        return get_backend("zfs", opts, LocalTransport())

    parent = os.path.dirname(mp(h.volume))
    return Harness(make(), mp(h.volume), mp(h.other_volume), "independent", mp(h.odd_volume),
                   lambda n: os.path.join(parent, f"clone-{n}"), make, volume_dir=lambda v: v,
                   enforced_ro=True, browsable=False, clones_pin=True)


def _lvm(tmp_path) -> Harness:
    state, transport, tool = _fake_env(tmp_path)
    tool("vgcreate", "vg0", "/dev/fake")
    vols = ["vg0/vol", "vg0/other", "vg0/odd+name.x_y-z"]
    for v in vols:
        tool("lvcreate", "-T", "vg0/pool", "-V", "1G", "-n", v.split("/")[1])

    def make(**opts):
        return get_backend("lvm", {"tool_dir": FAKES, **opts}, transport)

    return Harness(make(), vols[0], vols[1], "collide", vols[2], lambda n: f"clone-{n.replace(ODD, 'odd+name')}", make)


def _lustre(tmp_path) -> Harness:
    state, transport, tool = _fake_env(tmp_path)
    tool("lctl", "__fake_mkfs", "fs1")

    def make(**opts):
        return get_backend("lustre", {"tool_dir": FAKES, "fsname": "fs1", "mountpoint": "/lustre/fs1", **opts},
                           transport)

    return Harness(make(), "/lustre/fs1/vol", "/lustre/fs1/other", "shared", f"/lustre/fs1/{ODD}",
                   lambda n: f"/lustre/fs1/clone-{n}", make)


def _gpfs(tmp_path) -> Harness:
    state, transport, tool = _fake_env(tmp_path)
    vols = ["vol", "other", "odd.name-x_y"]
    for v in vols:
        tool("mmcrfileset", "gpfs0", v)
        tool("mmlinkfileset", "gpfs0", v, "-J", os.path.join(state, "gpfs0", v))

    def make(**opts):
        return get_backend("gpfs", {"tool_dir": FAKES, "device": "gpfs0", **opts}, transport)

    return Harness(make(), vols[0], vols[1], "independent", vols[2], lambda n: f"clone-{n}", make,
                   volume_dir=lambda v: os.path.join(state, "gpfs0", v))


def _cephfs(tmp_path) -> Harness:
    state, transport, tool = _fake_env(tmp_path)
    root = os.path.join(state, "cephfs")
    vols = [os.path.join(root, n) for n in ("vol", "other", ODD)]
    for v in vols:
        os.makedirs(v)

    def make(**opts):
        return get_backend("cephfs", {"tool_dir": os.path.join(FAKES, "ceph"), **opts}, transport)

    return Harness(make(), vols[0], vols[1], "independent", vols[2], lambda n: os.path.join(root, f"clone-{n}"),
                   make, volume_dir=lambda v: v)


def _cephfs_real(mounted) -> Harness:
    parent = os.path.join(mounted.mountpoint, f"t{next(_seq)}")
    vols = [os.path.join(parent, n) for n in ("vol", "other", ODD)]
    for v in vols:
        os.makedirs(v)

    def make(**opts):
        return get_backend("cephfs", opts, LocalTransport())

    # A CephFS snapshot is read-only for root too (EROFS), and browsable under .snap.
    return Harness(make(), vols[0], vols[1], "independent", vols[2], lambda n: os.path.join(parent, f"clone-{n}"),
                   make, volume_dir=lambda v: v, enforced_ro=True)


REAL = pytest.mark.integration
BACKENDS = [
    pytest.param("btrfs", marks=REAL),
    pytest.param("btrfs-ssh", marks=REAL),
    pytest.param("xfs-reflink", marks=REAL),
    pytest.param("xfs-reflink-mode", marks=REAL),
    pytest.param("zfs-fuse", marks=REAL),
    pytest.param("zfs-fuse-paths", marks=REAL),
    pytest.param("cephfs-real", marks=REAL),
    "zfs", "zfs-paths", "lvm", "lustre", "gpfs", "cephfs",
]


@pytest.fixture(params=BACKENDS)
def h(request, tmp_path) -> Harness:
    kind = request.param
    if kind == "btrfs":
        return _btrfs(request.getfixturevalue("btrfs_fs").mountpoint, LocalTransport())
    if kind == "btrfs-ssh":
        server = request.getfixturevalue("sshd")
        transport = SshTransport(server.host, port=server.port, user=server.user,
                                 known_hosts=server.known_hosts, key_file=server.key_file)
        request.addfinalizer(transport.close)
        return _btrfs(request.getfixturevalue("btrfs_fs").mountpoint, transport)
    if kind == "zfs-fuse":
        return _zfs_fuse(request.getfixturevalue("zfs_pool"))
    if kind == "zfs-fuse-paths":
        return _zfs_fuse_paths(request.getfixturevalue("zfs_pool"))
    if kind == "cephfs-real":
        return _cephfs_real(request.getfixturevalue("cephfs"))
    if kind.startswith("xfs-reflink"):
        return _xfs(request.getfixturevalue("xfs_fs").mountpoint, "mode" if kind.endswith("mode") else "immutable")
    return {"zfs": _zfs, "zfs-paths": _zfs_paths, "lvm": _lvm, "lustre": _lustre, "gpfs": _gpfs,
            "cephfs": _cephfs}[kind](tmp_path)


def snapshot_view(h: Harness, ref, tag: str) -> str:
    """Where the test reads a snapshot's files: its path, or, where snapshots
    have none (zfs-fuse), a fresh clone of it: what a restore would read."""
    assert (ref.path is not None) == h.browsable, ref
    return ref.path if ref.path is not None else h.backend.clone(ref, h.clone_target(f"view-{tag}"))


def write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --------------------------------------------------------------------------- cases
def test_create_is_idempotent(h: Harness):
    first = h.backend.create(h.volume, "s1")
    again = h.backend.create(h.volume, "s1")
    assert again == first
    assert (first.backend, first.volume, first.name) == (h.backend.name, h.volume, "s1")
    assert h.backend.exists(first)
    assert [r.name for r in h.backend.list(h.volume)] == ["s1"]


def test_snapshot_content_is_frozen(h: Harness):
    vdir = h.volume_dir(h.volume)
    if vdir is None:
        assert h.backend.create(h.volume, "s1").path is None  # block device / unmounted fs
        return
    write(os.path.join(vdir, "data"), b"before")
    ref = h.backend.create(h.volume, "s1")
    write(os.path.join(vdir, "data"), b"after")
    write(os.path.join(vdir, "new"), b"new")
    view = snapshot_view(h, ref, "frozen")
    assert read(os.path.join(view, "data")) == b"before"
    assert not os.path.exists(os.path.join(view, "new"))


def test_snapshot_refuses_writes(h: Harness):
    vdir = h.volume_dir(h.volume)
    ref = h.backend.create(h.volume, "s1")
    if h.backend.name == "xfs-reflink":  # read_only is only claimed when the seal binds root too
        assert h.backend.capabilities.read_only == h.enforced_ro
    else:
        assert h.backend.capabilities.read_only
    if vdir is None:
        return
    if not h.browsable:  # nothing shows the snapshot's files, so nothing can write to them
        assert ref.path is None
        return
    if h.enforced_ro:
        for attempt in (lambda: write(os.path.join(ref.path, "data"), b"x"),
                        lambda: os.mkdir(os.path.join(ref.path, "newdir"))):
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno in (errno.EROFS, errno.EPERM, errno.EACCES)
    else:  # fakes and seal="mode" can only mark the snapshot read-only (root ignores it)
        assert os.stat(ref.path).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) == 0


def test_clone_is_writable_and_snapshot_stays_read_only(h: Harness):
    vdir = h.volume_dir(h.volume)
    if vdir:
        write(os.path.join(vdir, "data"), b"before")
    ref = h.backend.create(h.volume, "s1")
    target = h.clone_target("c1")
    if not h.backend.capabilities.can_clone:
        with pytest.raises(errors.Unsupported):
            h.backend.clone(ref, target)
        return
    path = h.backend.clone(ref, target)
    with pytest.raises(errors.AlreadyExists):
        h.backend.clone(ref, target)
    if vdir is None:
        assert path.startswith("/")
        return
    assert read(os.path.join(path, "data")) == b"before"
    write(os.path.join(path, "data"), b"restored and changed")
    write(os.path.join(path, "new"), b"new")
    # Writing to the clone left the snapshot alone (read through a second clone where it has no path).
    assert read(os.path.join(snapshot_view(h, ref, "after"), "data")) == b"before"
    if h.enforced_ro and h.browsable:
        with pytest.raises(OSError):
            write(os.path.join(ref.path, "data"), b"x")
    assert h.backend.exists(ref)


def test_delete_missing_snapshot_returns_false(h: Harness):
    ref = h.backend.create(h.volume, "s1")
    assert h.backend.delete(ref) is True
    assert not h.backend.exists(ref)
    assert h.backend.delete(ref) is False
    assert h.backend.list(h.volume) == []
    # The volume itself is untouched by deleting its snapshot.
    assert h.backend.create(h.volume, "s2").name == "s2"


def test_same_name_on_another_volume(h: Harness):
    mine = h.backend.create(h.volume, "s1")
    if h.names == "collide":
        with pytest.raises(errors.SnapshotCollision):
            h.backend.create(h.other_volume, "s1")
        assert h.backend.exists(mine)
        return
    theirs = h.backend.create(h.other_volume, "s1")
    if h.names == "shared":  # whole-filesystem scope: one snapshot covers both
        assert theirs.ref == mine.ref
        assert h.backend.coalesce_key(h.volume) == h.backend.coalesce_key(h.other_volume) is not None
    else:
        assert theirs.ref != mine.ref
        assert [r.ref for r in h.backend.list(h.volume)] == [mine.ref]


def test_list_shows_only_this_volumes_snapshots(h: Harness):
    h.backend.create(h.volume, "mine")
    h.backend.create(h.other_volume, "theirs")
    names = [r.name for r in h.backend.list(h.volume)]
    if h.names == "shared":
        assert names == ["mine", "theirs"]
    else:
        assert names == ["mine"]


def test_unusual_characters_in_volume(h: Harness):
    vdir = h.volume_dir(h.odd_volume)
    if vdir:
        write(os.path.join(vdir, "data"), b"odd")
    ref = h.backend.create(h.odd_volume, "s1")
    assert ref.volume == h.odd_volume
    assert h.backend.create(h.odd_volume, "s1") == ref
    assert [r.name for r in h.backend.list(h.odd_volume)] == ["s1"]
    if vdir and h.browsable:
        assert read(os.path.join(ref.path, "data")) == b"odd"
    if h.backend.capabilities.can_clone:
        target = h.clone_target(ODD)
        path = h.backend.clone(ref, target)
        if vdir:
            assert read(os.path.join(path, "data")) == b"odd"
        if h.clones_pin:
            with pytest.raises(errors.CommandFailed) as e:
                h.backend.delete(ref)
            assert "dependent clones" in str(e.value)
            assert h.backend.exists(ref)
            assert h.backend.delete_clone(path) is True
    assert h.backend.delete(ref) is True
    assert h.backend.list(h.odd_volume) == []


def _script_dir(tmp_path, backend: Backend, body: str) -> str:
    d = tmp_path / f"tools-{next(_seq)}"
    d.mkdir()
    for tool in backend.TOOLS:
        p = d / tool
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(0o755)
    return str(d)


def test_hanging_tool_times_out(h: Harness, tmp_path):
    """The hanging tool's own call ends in errors.Timeout within the backend's
    timeout (+ 2.5 s to kill and reap it), not after the 30 s it would hang.

    Built with the default timeout: the tool lookup at construction is a
    call of its own (over SSH, a remote shell), which a loaded machine once
    took over 0.5 s to answer, so the test never reached the hanging tool.
    The short timeout is then the one the verb runs under. Over SSH the verb
    asks `stat` first, under the same 0.5 s: a Timeout that names anything
    but the hanging tool says nothing of it, and that attempt is repeated."""
    timeout = 0.5
    tool_dir = _script_dir(tmp_path, h.backend, "exec sleep 30")
    backend = h.rebuild(tool_dir=tool_dir)
    backend.timeout = timeout
    for _attempt in range(3):
        start = time.monotonic()
        with pytest.raises(errors.Timeout) as e:
            backend.create(h.volume, "s1")
        took = time.monotonic() - start
        if e.value.kwargs["what"].startswith(tool_dir + "/"):
            break
    assert e.value.kwargs["what"].startswith(tool_dir + "/"), e.value   # the hanging tool's call timed out
    assert e.value.kwargs["seconds"] == timeout
    assert took < timeout + 2.5


def test_failing_tool_raises_command_failed_with_stderr(h: Harness, tmp_path):
    backend = h.rebuild(tool_dir=_script_dir(tmp_path, h.backend, "echo 'simulated failure: disk on fire' >&2; exit 3"))
    with pytest.raises(errors.CommandFailed) as e:
        backend.create(h.volume, "s1")
    assert "simulated failure: disk on fire" in str(e.value)
    assert e.value.kwargs["status"] == 3
    assert e.value.exit_code == errors.BACKEND
    if h.backend.transport.where != "localhost":
        assert h.backend.transport.where in str(e.value)


def test_missing_tool_raises_tool_missing_naming_it(h: Harness, tmp_path):
    empty = tmp_path / "empty-tools"
    empty.mkdir()
    with pytest.raises(errors.ToolMissing) as e:
        h.rebuild(tool_dir=str(empty))
    assert e.value.kwargs["tool"] == h.backend.TOOLS[0]
    assert repr(h.backend.TOOLS[0]) in str(e.value)
    assert h.backend.transport.where in str(e.value)


def test_invalid_snapshot_name_is_rejected(h: Harness):
    for bad in ("", "-rf", "../x", "a/b", ".hidden", "x\ny"):
        with pytest.raises(errors.BadValueError) as e:
            h.backend.create(h.volume, bad)
        assert repr(bad) in str(e.value)
    assert h.backend.list(h.volume) == []


# Backends whose volumes are directories named by path (zfs, lvm and gpfs name
# datasets, logical volumes and filesets; lustre cuts the whole filesystem).
PATH_BACKENDS = [pytest.param("btrfs", marks=REAL), pytest.param("btrfs-ssh", marks=REAL),
                 pytest.param("xfs-reflink", marks=REAL), pytest.param("cephfs-real", marks=REAL), "cephfs"]


@pytest.mark.parametrize("h", PATH_BACKENDS, indirect=True)
def test_a_volume_swapped_for_a_symlink_is_refused_as_a_symlink(h: Harness):
    """Checked at submit, the volume is then replaced by a link (to another
    volume here: one root could snapshot, list or clone through it). Every
    verb that takes the volume says "symlink", cuts nothing through it, and
    leaves the link and its target alone (issue 21 item 4)."""
    target_snaps = h.backend.list(h.other_volume)
    moved = h.volume + ".real"
    os.rename(h.volume, moved)
    os.symlink(h.other_volume, h.volume)
    try:
        for verb in (lambda: h.backend.create(h.volume, "s1"), lambda: h.backend.list(h.volume)):
            with pytest.raises(errors.BadValueError) as e:
                verb()
            assert h.volume in str(e.value) and "is a symlink" in str(e.value), str(e.value)
            assert "inode" not in str(e.value)
        assert os.path.islink(h.volume) and os.readlink(h.volume) == h.other_volume
        assert h.backend.list(h.other_volume) == target_snaps
    finally:
        os.unlink(h.volume)
        os.rename(moved, h.volume)


# --------------------------------------------------------------------------- backend-specific
@pytest.mark.parametrize("h", [pytest.param("zfs-fuse", marks=REAL), pytest.param("zfs-fuse-paths", marks=REAL), "zfs",
                               "zfs-paths"], indirect=True)
def test_zfs_delete_clone_destroys_only_a_clone(h: Harness):
    ref = h.backend.create(h.volume, "s1")
    path = h.backend.clone(ref, h.clone_target("c1"))
    # A volume's own mountpoint is a dataset but not a clone: refused, and left alone.
    with pytest.raises(errors.BadValueError) as e:
        h.backend.delete_clone(h.volume_dir(h.volume))
    assert "not a clone" in str(e.value)
    assert h.backend.exists(ref) and os.path.isdir(h.volume_dir(h.volume))
    with pytest.raises(errors.BadValueError):
        h.backend.delete_clone("-rf")  # neither a path nor a dataset name
    assert h.backend.delete_clone(path) is True
    assert not os.path.exists(os.path.join(path, "data"))
    assert h.backend.delete_clone(path) is False  # already gone
    assert h.backend.delete(ref) is True  # no clone pins it any more


@pytest.mark.parametrize("h", [pytest.param("cephfs-real", marks=REAL), "cephfs"], indirect=True)
def test_cephfs_refuses_names_the_mds_reserves(h: Harness):
    """The MDS answers mkdir .snap/_NAME with EINVAL (Ceph 16, measured): such
    names are how ancestors' snapshots show. Refused before any tool runs."""
    for bad in ("_a_1", "_x"):
        with pytest.raises(errors.BadValueError) as e:
            h.backend.create(h.volume, bad)
        assert repr(bad) in str(e.value) and "reserves" in str(e.value)
    assert h.backend.list(h.volume) == []


@pytest.mark.integration
def test_cephfs_ancestors_snapshots_are_not_listed(cephfs):
    """A snapshot of a parent shows in every descendant's .snap as
    _NAME_INODE; list() must not take it for the volume's own."""
    h = _cephfs_real(cephfs)
    parent = os.path.dirname(h.volume)
    os.mkdir(os.path.join(parent, ".snap", "up"))
    try:
        inherited = os.listdir(os.path.join(h.volume, ".snap"))
        assert len(inherited) == 1 and inherited[0].startswith("_up_"), inherited  # what the real MDS shows
        assert h.backend.list(h.volume) == []
        mine = h.backend.create(h.volume, "s1")
        assert h.backend.list(h.volume) == [mine]
    finally:
        os.rmdir(os.path.join(parent, ".snap", "up"))


@pytest.mark.integration
def test_zfs_path_volumes_must_be_mountpoints_and_clones_stay_in_the_pool(zfs_pool, tmp_path):
    h = _zfs_fuse_paths(zfs_pool)
    inside = os.path.join(h.volume, "subdir")
    os.mkdir(inside)
    with pytest.raises(errors.BadValueError) as e:  # a directory inside a dataset is not a volume
        h.backend.create(inside, "s1")
    assert repr(inside) in str(e.value) and "no zfs dataset is mounted there" in str(e.value)
    ref = h.backend.create(h.volume, "s1")
    elsewhere = str(tmp_path / "restore" / "vol")  # not on the pool: another filesystem
    os.makedirs(os.path.dirname(elsewhere))
    with pytest.raises(errors.OtherFilesystem) as e:
        h.backend.clone(ref, elsewhere)
    assert repr(elsewhere) in str(e.value) and zfs_pool.name in str(e.value)
    assert not os.path.exists(elsewhere)
    # create_volume: a child dataset of the dataset mounted at the parent (the Prolog's per-job volume)
    jobs = os.path.dirname(h.volume)
    made = h.backend.create_volume(os.path.join(jobs, "job42"))
    assert made == os.path.join(jobs, "job42") and os.path.ismount(made)
    assert h.backend.create(made, "s1").ref.endswith("/job42@s1")
    with pytest.raises(errors.AlreadyExists):
        h.backend.create_volume(made)
    with pytest.raises(errors.BadValueError) as e:  # parent is a plain directory, not a dataset
        h.backend.create_volume(os.path.join(inside, "job43"))
    assert "not a zfs dataset's mountpoint" in str(e.value)


@pytest.mark.integration
def test_cephfs_cluster_fits_ci(cephfs):
    """What docs/backends.md claims for CI: the five processes stay under
    1 GiB RSS (measured ~440 MiB) and the MDS is active with snapshots allowed."""
    rss = cephfs.rss_kb()
    print(f"ceph: started in {cephfs.start_seconds:.1f} s; RSS {sum(rss.values()) >> 10} MiB {rss}")
    assert sorted(rss) == ["fuse", "mds", "mgr", "mon", "osd"]
    assert sum(rss.values()) < 1 << 20, rss
    # Ceph 16's JSON has no flags_state: the bit is CEPH_MDSMAP_ALLOW_SNAPS (1<<1, include/ceph_fs.h).
    flags = json.loads(cephfs.ceph("fs", "get", "sstest", "-f", "json"))["mdsmap"]["flags"]
    assert flags & (1 << 1), flags


@pytest.mark.integration
def test_btrfs_refuses_a_plain_directory_as_volume(btrfs_fs):
    plain = os.path.join(btrfs_fs.mountpoint, f"plain-{next(_seq)}")
    os.mkdir(plain)
    with pytest.raises(errors.BadValueError) as e:
        get_backend("btrfs", {}).create(plain, "s1")
    assert plain in str(e.value) and "subvolume" in str(e.value)


@pytest.mark.integration
def test_xfs_partial_copy_is_never_listed_and_is_replaced(xfs_fs):
    h = _xfs(xfs_fs.mountpoint, "immutable")
    snapdir = os.path.join(os.path.dirname(h.volume), ".snapshots")
    # What a copy killed half-way leaves behind: a claim and a .partial tree.
    os.makedirs(os.path.join(snapdir, ".s1.partial", "half"))
    write(os.path.join(snapdir, ".s1.slurm-snap"), ('{"volume": "%s"}' % h.volume).encode())
    assert h.backend.list(h.volume) == []
    write(os.path.join(h.volume, "data"), b"complete")
    ref = h.backend.create(h.volume, "s1")
    assert sorted(os.listdir(ref.path)) == ["data"]
    assert not os.path.exists(os.path.join(snapdir, ".s1.partial"))
    assert [r.name for r in h.backend.list(h.volume)] == ["s1"]
    assert h.backend.delete(ref) is True
    assert sorted(os.listdir(snapdir)) == []


def test_lustre_coalesce_key_is_the_filesystem(tmp_path):
    h = _lustre(tmp_path)
    assert h.backend.coalesce_key("/lustre/fs1/a") == h.backend.coalesce_key("/lustre/fs1/b/c") == "lustre:fs1"
    with pytest.raises(errors.BadValueError):
        h.backend.coalesce_key("/elsewhere/a")
    assert h.backend.capabilities.scope == "filesystem"
    assert h.backend.mount(h.backend.create(h.volume, "s1"))  # the snapshot fsname clients mount


def test_command_failed_message_is_the_tools_stderr_on_one_line(tmp_path):
    h = _zfs(tmp_path)
    with pytest.raises(errors.CommandFailed) as e:
        h.backend.create("tank/missing", "s1")
    assert str(e.value) == "zfs exited with status 1: cannot open 'tank/missing': dataset does not exist"


# --------------------------------------------------------------------------- transfer
# A snapshot from one host's backend to another's (backends.transfer): the
# real btrfs send into the real btrfs receive on a second filesystem, reached
# through the real sshd; xfs-reflink through its tar copy. One host stands in
# for two, so the copy lands in another directory (`into`) than the original.
@pytest.fixture(scope="module")
def second_btrfs():
    with realfs.loop_filesystem("btrfs") as fs:
        yield fs


def _tree(root: str) -> dict[str, bytes]:
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            out[os.path.relpath(os.path.join(d, f), root)] = read(os.path.join(d, f))
    return out


@pytest.mark.integration
def test_btrfs_transfer_over_ssh_full_then_incremental(btrfs_fs, second_btrfs, sshd):
    from slurm_snap.backends.transfer import transfer

    h = _btrfs(btrfs_fs.mountpoint, LocalTransport())
    ssh = SshTransport(sshd.host, port=sshd.port, user=sshd.user, known_hosts=sshd.known_hosts,
                       key_file=sshd.key_file)
    try:
        target = get_backend("btrfs", {}, ssh)
        assert h.backend.capabilities.can_send and target.capabilities.can_send
        for i in range(50):
            write(os.path.join(h.volume, f"f{i}"), os.urandom(64 << 10))
        s1 = h.backend.create(h.volume, "s1")
        into = os.path.join(second_btrfs.mountpoint, f"recv-{next(_seq)}", ".snapshots")
        full = transfer(h.backend, s1, target, timeout=60, into=into)
        assert full.method == "send" and full.ref.ref == os.path.join(into, "s1")
        assert full.bytes >= 50 * (64 << 10)
        assert _tree(full.ref.path) == _tree(s1.path)
        assert target.exists(full.ref)
        with pytest.raises(OSError) as e:   # the copy is a read-only snapshot too
            write(os.path.join(full.ref.path, "new"), b"x")
        assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        # Asking again moves nothing (a Prolog may run twice).
        assert transfer(h.backend, s1, target, timeout=60, into=into).method == "present"

        write(os.path.join(h.volume, "f0"), b"changed")
        s2 = h.backend.create(h.volume, "s2")
        inc = transfer(h.backend, s2, target, timeout=60, into=into, parent=s1)
        assert inc.method == "send-incremental" and inc.bytes < full.bytes / 20, (inc.bytes, full.bytes)
        assert _tree(inc.ref.path) == _tree(s2.path) and read(os.path.join(inc.ref.path, "f0")) == b"changed"
        # The received copies are snapshots the backend may delete (prune), not live volumes.
        assert target.delete(inc.ref) is True and not target.exists(inc.ref)
    finally:
        ssh.close()


@pytest.mark.integration
def test_btrfs_transfer_that_fails_leaves_nothing_half_received(btrfs_fs, second_btrfs, sshd):
    from slurm_snap.backends.transfer import transfer

    h = _btrfs(btrfs_fs.mountpoint, LocalTransport())
    ssh = SshTransport(sshd.host, port=sshd.port, user=sshd.user, known_hosts=sshd.known_hosts,
                       key_file=sshd.key_file)
    try:
        target = get_backend("btrfs", {}, ssh)
        write(os.path.join(h.volume, "a"), b"a")
        s1 = h.backend.create(h.volume, "s1")
        write(os.path.join(h.volume, "a"), b"b")
        s2 = h.backend.create(h.volume, "s2")
        into = os.path.join(second_btrfs.mountpoint, f"recv-{next(_seq)}", ".snapshots")
        # An incremental stream whose parent the target never received: receive refuses it.
        with pytest.raises(errors.CommandFailed) as e:
            transfer(h.backend, s2, target, timeout=60, into=into, parent=s1)
        assert "receive" in str(e.value) and ssh.where in str(e.value)
        assert not os.path.exists(os.path.join(into, "s2"))
    finally:
        ssh.close()


@pytest.mark.integration
def test_xfs_transfer_copies_files_and_seals_the_copy(xfs_fs):
    from slurm_snap.backends.transfer import transfer

    src = _xfs(xfs_fs.mountpoint, "immutable")
    dst = _xfs(xfs_fs.mountpoint, "immutable")
    assert not src.backend.capabilities.can_send and src.backend.capabilities.can_copy
    os.makedirs(os.path.join(src.volume, "sub"))
    write(os.path.join(src.volume, "sub", "x"), b"payload")
    s1 = src.backend.create(src.volume, "s1")
    into = os.path.join(os.path.dirname(dst.volume), ".snapshots")
    got = transfer(src.backend, s1, dst.backend, timeout=60, into=into)
    assert got.method == "copy" and _tree(got.ref.path) == {"sub/x": b"payload"}
    assert dst.backend.exists(got.ref) and not os.path.exists(os.path.join(into, ".s1.partial"))
    with pytest.raises(OSError):
        write(os.path.join(got.ref.path, "sub", "x"), b"overwrite")
    assert dst.backend.delete(got.ref) is True
