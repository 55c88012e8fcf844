"""Bad input in files root reads: barrier acknowledgements written by ranks
(the job's user controls ack/) and the output of backend tools.

Already covered and not repeated: tests/unit/test_protocol_barrier.py
(wrong epoch, another job's, name/content mismatch, foreign node, NUL
garbage, oversized, symlink to /etc/passwd, FIFO, hard link, foreign owner)
and tests/unit/test_client_ack.py (every field's type and range).
Here: what would crash, hang or fool the coordinator instead of being rejected.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import stat
import textwrap
import threading
import time

import pytest

from protocol_fixtures import make_env
from slurm_snap import errors
from slurm_snap.backends.registry import get_backend
from slurm_snap.backends.transport import LocalTransport
from slurm_snap.jobrecords import MAX_ACK_BYTES, Ack
from slurm_snap.protocol.barrier import node_barrier_complete
from slurm_snap.protocol.barrier import AckCollector, wait_for_barrier

EPOCH = "sfeedface"


@pytest.fixture
def env(tmp_path):
    e = make_env(tmp_path, nodes=("n1", "n2"))
    os.makedirs(e.ack_dir, exist_ok=True)
    return e


def collector(env, **kw):
    return AckCollector(env.ack_dir, job_id=env.job_id, epoch=EPOCH, nodes=env.nodes, **kw)


def good(env, node="n1", rank=0, **over) -> bytes:
    doc = json.loads(Ack(job_id=str(env.job_id), epoch=EPOCH, node=node, rank=rank, local_rank=0,
                         local_size=1, step=3, written_at=dt.datetime.now(dt.timezone.utc), manifest=()).to_bytes())
    doc.update(over)
    return json.dumps(doc).encode()


def put(env, name: str, raw: bytes) -> str:
    path = os.path.join(env.ack_dir, name)
    with open(path, "wb") as f:
        f.write(raw)
    return path


# ---- acknowledgement content that would crash or exhaust the reader -------------
HOSTILE = {
    "deep-array": (b"[" * 200_000 + b"]" * 200_000, "not valid JSON"),
    "deep-object": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "not valid JSON"),
    "huge-local-size": (None, "'local_size'"),
    "huge-rank": (None, "'rank'"),
    "huge-step": (None, "'step'"),
    "huge-size": (None, "manifest[0].size"),
    "nan-step": (None, "'step'"),
    "float-rank": (None, "'rank'"),
    "invalid-utf8": (b'{"version": 1, "node": "\xff\xfe"}', "not valid JSON"),
    "bom": (b"\xef\xbb\xbf{}", "missing"),
    "null": (b"null", "expected a JSON object"),
    "empty": (b"", "not valid JSON"),
    "path-traversal-node": (None, "'node'"),
    "relative-manifest": (None, "manifest[0].path"),
}


def hostile_bytes(env, case: str) -> bytes:
    raw, _ = HOSTILE[case]
    if raw is not None:
        return raw
    over = {
        "huge-local-size": {"local_size": 10**12},
        "huge-rank": {"rank": 10**30},
        "huge-step": {"step": 2**64},
        "huge-size": {"manifest": [{"path": "/x", "size": 10**40}]},
        "float-rank": {"rank": 1.5},
        "path-traversal-node": {"node": "../../etc"},
        "relative-manifest": {"manifest": [{"path": "x/../../etc/shadow", "size": 1}]},
    }.get(case)
    if case == "nan-step":
        return good(env).replace(b'"step": 3', b'"step": NaN')
    return good(env, **over)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_ack_is_rejected_quickly_with_its_reason(env, case):
    raw = hostile_bytes(env, case)
    assert len(raw) <= MAX_ACK_BYTES
    with pytest.raises(errors.BadValueError) as ei:
        Ack.from_bytes(raw, env.job_id, EPOCH)
    assert HOSTILE[case][1] in str(ei.value)
    # and through the coordinator's reader, as a file in ack/: rejected, never fatal
    put(env, "n1.0.json", raw)
    c = collector(env)
    t0 = time.monotonic()
    c.rescan()
    assert time.monotonic() - t0 < 5
    assert HOSTILE[case][1] in c.state.rejected["n1.0.json"]
    assert c.state.acks == {} and c.state.complete == set()


def test_huge_local_size_cannot_make_the_barrier_check_allocate():
    """Even built in memory (not parsed), the completeness rule checks the count first."""
    a = Ack(version=1, job_id="1", epoch=EPOCH, node="n1", rank=0, local_rank=0, local_size=10**12, step=1,
            written_at=dt.datetime.now(dt.timezone.utc), manifest=())
    t0 = time.monotonic()
    assert node_barrier_complete([a]) is False
    assert time.monotonic() - t0 < 1


# ---- what is in ack/ instead of a regular file -------------------------------------
def test_symlink_to_a_valid_ack_elsewhere_is_not_followed(env):
    """If the link were followed, this ack would be accepted: it is valid."""
    outside = os.path.join(env.tmp, "forged.json")
    with open(outside, "wb") as f:
        f.write(good(env))
    os.symlink(outside, os.path.join(env.ack_dir, "n1.0.json"))
    c = collector(env)
    c.rescan()
    assert c.state.rejected == {"n1.0.json": "is a symbolic link"}
    assert c.state.acks == {}


def test_symlink_to_etc_shadow_is_never_opened(env):
    os.symlink("/etc/shadow", os.path.join(env.ack_dir, "n1.0.json"))
    before = os.stat("/etc/shadow").st_atime_ns if os.path.exists("/etc/shadow") else None
    c = collector(env)
    c.rescan()
    assert c.state.rejected["n1.0.json"] == "is a symbolic link"
    # nothing of the target ends up in a reason or an ack
    assert all("root:" not in why for why in c.state.rejected.values())
    if before is not None:
        assert os.stat("/etc/shadow").st_atime_ns == before


def test_ack_directory_replaced_by_a_symlink_is_not_read(env):
    """The user owns the job dir's ack/ entry's content, not the job dir; but
    if ack/ itself became a link, the reader must not follow it."""
    real = os.path.join(env.tmp, "elsewhere")
    os.makedirs(real)
    with open(os.path.join(real, "n1.0.json"), "wb") as f:
        f.write(good(env))
    os.rmdir(env.ack_dir)
    os.symlink(real, env.ack_dir)
    c = collector(env)
    assert c.rescan() == 0
    assert c.state.acks == {}


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket", "sparse-10GB"])
def test_non_files_and_giant_files_do_not_block_the_barrier(env, kind):
    """Among good acks: the barrier completes promptly, the bad entry is named."""
    path = os.path.join(env.ack_dir, "n2.9.json")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "socket":
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    else:
        with open(path, "wb") as f:
            f.truncate(10 * 2**30)
    c = collector(env)

    def ranks():
        time.sleep(0.1)
        put(env, "n1.0.json", good(env, "n1", 0))
        put(env, "n2.1.json", good(env, "n2", 1))

    th = threading.Thread(target=ranks)
    th.start()
    t0 = time.monotonic()
    done = wait_for_barrier(c, timeout=10)
    th.join()
    assert done and time.monotonic() - t0 < 3
    why = c.state.rejected.get("n2.9.json", "")
    if kind == "sparse-10GB":
        assert f"{10 * 2**30} bytes, larger than the limit" in why
    elif kind == "directory":
        assert why in ("is not a regular file", "cannot open: Is a directory")
    else:
        assert why == "is not a regular file" or why.startswith("cannot open")


def test_thousands_of_junk_files_do_not_hide_the_real_acks(env):
    for i in range(3000):
        put(env, f"junk{i}.{i}.json", b"{}")
    put(env, "n1.0.json", good(env, "n1", 0))
    put(env, "n2.1.json", good(env, "n2", 1))
    c = collector(env)
    t0 = time.monotonic()
    assert wait_for_barrier(c, timeout=10)
    assert time.monotonic() - t0 < 5
    assert len(c.state.rejected) == 3000


# ---- backend tool output ---------------------------------------------------------------
FAKE_TOOL = textwrap.dedent("""\
    #!{python}
    # Prints the canned output in $SLURM_SNAP_FAKE_STATE/<tool>.<verb> (exit 0), else nothing.
    import os, sys
    state = os.environ["SLURM_SNAP_FAKE_STATE"]
    tool = os.path.basename(sys.argv[0])
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    with open(os.path.join(state, "calls"), "a") as f:
        f.write(tool + " " + " ".join(sys.argv[1:]) + "\\n")
    for name in (tool + "." + verb, tool):
        p = os.path.join(state, name)
        if os.path.exists(p):
            sys.stdout.buffer.write(open(p, "rb").read())
            break
    """)


def fake_tools(tmp_path, tools: list[str], outputs: dict[str, bytes]):
    bindir, state = tmp_path / "bin", tmp_path / "state"
    bindir.mkdir()
    state.mkdir()
    import sys
    for t in tools:
        p = bindir / t
        p.write_text(FAKE_TOOL.format(python=sys.executable))
        p.chmod(0o755)
    for name, data in outputs.items():
        (state / name).write_bytes(data)
    return str(bindir), state, LocalTransport(extra_env={"SLURM_SNAP_FAKE_STATE": str(state)})


ZFS_GARBAGE = (b"\x00\xff\xfegarbage\n"
               b"tank/other@slurm-snap-1-2-3\t1700000000\n"      # another dataset's snapshot
               b"tank/vol@good\t1700000000\n"
               b"tank/vol@undated\tnot-a-number\n"
               b"tank/vol@\t1\n"                                # empty name
               b"tank/vol@-rf\t1\n"                             # would read as an option
               b"tank/vol@../../x\t1\n"
               b"tank/volume2@slurm-snap-1-2-3\t1\n"            # a dataset sharing the prefix
               + b"x" * 100_000 + b"\n")


# What OpenZFS's `zfs version` prints: the backend reads its CLI dialect from it.
ZFS_VERSION = b"zfs-2.1.11-1\nzfs-kmod-2.1.11-1\n"


def test_zfs_garbage_listing_yields_only_this_datasets_snapshots(tmp_path):
    bindir, state, tr = fake_tools(tmp_path, ["zfs"], {"zfs.list": ZFS_GARBAGE, "zfs.get": b"/mnt/tank/vol\n",
                                                       "zfs.version": ZFS_VERSION})
    b = get_backend("zfs", {"tool_dir": bindir}, tr)
    refs = b.list("tank/vol")
    assert [r.ref for r in refs] == ["tank/vol@good", "tank/vol@undated"]
    assert refs[0].created_at == dt.datetime.fromtimestamp(1700000000, dt.timezone.utc)
    assert refs[1].created_at is None
    # repair deletes what list() shows under a set's names: the other datasets'
    # snapshot named like ours must not be destroyed through this volume
    from slurm_snap.backends.base import SnapshotRef
    foreign = SnapshotRef("zfs", "tank/vol", "slurm-snap-1-2-3", "tank/other@slurm-snap-1-2-3")
    assert b.exists(foreign) is False
    assert b.delete(foreign) is False
    assert "destroy" not in (state / "calls").read_text()


def test_zfs_snapshot_that_never_appears_is_a_backend_error(tmp_path):
    """`zfs snapshot` exits 0 but the listing does not show it: not a ref to nothing."""
    bindir, state, tr = fake_tools(tmp_path, ["zfs"], {"zfs.list": b"garbage\n", "zfs.get": b"/mnt/x\n",
                                                       "zfs.version": ZFS_VERSION})
    b = get_backend("zfs", {"tool_dir": bindir}, tr)
    with pytest.raises(errors.BackendError) as ei:
        b.create("tank/vol", "slurm-snap-1-2-3")
    assert "tank/vol@slurm-snap-1-2-3" in str(ei.value) and ei.value.exit_code == errors.BACKEND


GPFS_GARBAGE = {
    "mmlsfileset": b"mmlsfileset::HEADER:version:filesetName:path:\nmmlsfileset::0:1:fs1set:/gpfs/fs1set:\n",
    # a header without the directory column, junk lines, a row of another fileset
    "mmlssnapshot": (b"mmlssnapshot::HEADER:version:fileset:created:\n"
                     b"mmlssnapshot::0:1:fs1set:Mon Jan  1 00:00:00 2024:\n"
                     b"\xff\xfe:::\n"
                     b"mmlssnapshot::HEADER:version:directory:fileset:\n"
                     b"mmlssnapshot::0:1:slurm-snap-9-9-9:otherset:\n"),
}


def test_gpfs_garbage_listing_is_empty_and_create_fails_cleanly(tmp_path):
    tools = ["mmcrsnapshot", "mmlssnapshot", "mmdelsnapshot", "mmlsfileset"]
    bindir, state, tr = fake_tools(tmp_path, tools, GPFS_GARBAGE)
    b = get_backend("gpfs", {"tool_dir": bindir, "device": "fs1"}, tr)
    assert b.list("fs1set") == []
    with pytest.raises(errors.BackendError) as ei:   # not a KeyError from the parser
        b.create("fs1set", "slurm-snap-1-2-3")
    assert "mmlssnapshot does not list it" in str(ei.value) and "slurm-snap-1-2-3" in str(ei.value)


@pytest.mark.parametrize("backend,tools,opts,volume,sane", [
    # zfs answers its dialect probe sanely (noise there is the next test's case)
    ("zfs", ["zfs"], {}, "tank/vol", {"zfs.version": ZFS_VERSION}),
    ("gpfs", ["mmcrsnapshot", "mmlssnapshot", "mmdelsnapshot", "mmlsfileset"], {"device": "fs1"}, "fs1set", {}),
])
def test_binary_noise_from_every_tool_is_never_an_internal_error(tmp_path, backend, tools, opts, volume, sane):
    noise = bytes(range(256)) * 64 + b"\n:::@@@\t\t\n"
    bindir, state, tr = fake_tools(tmp_path, tools, {**{t: noise for t in tools}, **sane})
    b = get_backend(backend, {"tool_dir": bindir, **opts}, tr)
    assert b.list(volume) == []
    with pytest.raises(errors.SnapError) as ei:
        b.create(volume, "slurm-snap-1-2-3")
    assert ei.value.exit_code == errors.BACKEND


def test_binary_noise_from_zfs_version_is_a_backend_error_not_a_guess(tmp_path):
    noise = bytes(range(256)) * 64 + b"\n:::@@@\t\t\n"
    bindir, state, tr = fake_tools(tmp_path, ["zfs"], {"zfs": noise})
    b = get_backend("zfs", {"tool_dir": bindir}, tr)
    with pytest.raises(errors.BackendError) as ei:
        b.list("tank/vol")
    assert "zfs version" in str(ei.value) and ei.value.exit_code == errors.BACKEND
    assert (state / "calls").read_text().splitlines() == ["zfs version"]  # nothing run in a guessed dialect
