"""The zfs backend's two CLI dialects, driven by a transport that replays what
each zfs printed. The zfs-fuse lines are copied from zfs-fuse 0.7.0 (Debian 12)
runs on this machine; the OpenZFS lines follow zfs-version(8) and zfs-list(8).
The conformance suite runs the same backend against real zfs-fuse and the fake."""
from __future__ import annotations

import datetime as dt
import os
from typing import Sequence

import pytest

from slurm_snap import errors
from slurm_snap.backends import zfs
from slurm_snap.backends.transport import Result, Transport

FUSE_VERSION_ERR = ("unrecognized command 'version'\nusage: zfs command args ...\n"
                    "where 'command' is one of the following:\n")
FUSE_LIST_P_ERR = "invalid option 'p'\nusage:\n\tlist [-rH][-d max] [-o property[,...]] [-t type[,...]]\n"


class ReplayTransport(Transport):
    """Answers each argv (without the tool path) from a table; records every call."""

    def __init__(self, answers: dict[tuple[str, ...], Result | list[Result]]):
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], timeout: float, input: bytes | None = None) -> Result:
        if argv[0] == "test" and argv[1] == "-x":  # tool lookup: everything is installed
            return Result(0, b"", b"")
        tool = os.path.basename(argv[0])
        key = tuple(argv[1:]) if tool == "zfs" else (tool, *argv[1:])
        self.calls.append(key)
        answer = self.answers.get(key)
        if answer is None:
            return Result(2, b"", f"replay: no answer for {key}".encode())
        if isinstance(answer, list):
            return answer.pop(0) if len(answer) > 1 else answer[0]
        return answer


def ok(text: str = "") -> Result:
    return Result(0, text.encode(), b"")


def fail(status: int, stderr: str) -> Result:
    return Result(status, b"", stderr.encode())


DS = "tank/vol"
LIST_P = ("list", "-H", "-p", "-t", "snapshot", "-o", "name,creation", "-d", "1", DS)
GET_P = ("get", "-H", "-p", "-o", "name,value", "-d", "1", "creation", DS)
MOUNTPOINT = ("get", "-H", "-p", "-o", "value", "mountpoint", DS)
SNAPDIR = ("test", "-d", "/tank/vol/.zfs/snapshot")


def backend(answers) -> tuple[zfs.ZfsBackend, ReplayTransport]:
    t = ReplayTransport(answers)
    return zfs.ZfsBackend({}, t), t


def test_parse_dialect_reads_what_each_cli_prints():
    assert zfs.parse_dialect(0, "zfs-2.1.11-1\nzfs-kmod-2.1.11-1\n", "") == zfs.Dialect("openzfs", "2.1.11-1", True)
    legacy = zfs.parse_dialect(2, "", FUSE_VERSION_ERR)
    assert legacy is not None and legacy.name == "legacy" and legacy.version is None
    assert not legacy.list_parsable and legacy.busy_after_unmount
    # Anything else is not guessed at: an unknown first line, another failure.
    assert zfs.parse_dialect(0, "something else\n", "") is None
    assert zfs.parse_dialect(1, "", "cannot open '/dev/zfs': Permission denied") is None
    assert zfs.parse_dialect(2, "", "missing command") is None


def test_constructor_runs_no_zfs_and_the_probe_runs_once():
    b, t = backend({("version",): fail(2, FUSE_VERSION_ERR), GET_P: ok(""), MOUNTPOINT: ok("/tank/vol\n")})
    assert t.calls == []  # building the backend (config checks, doctor) costs no zfs call
    b.list(DS)
    b.list(DS)
    assert t.calls.count(("version",)) == 1
    assert LIST_P not in t.calls  # zfs-fuse would answer "invalid option 'p'"


def test_legacy_dialect_lists_through_zfs_get_and_keeps_only_this_datasets_snapshots():
    # What zfs-fuse 0.7 prints for `zfs get -H -p -o name,value -d 1 creation tank/vol`:
    # the dataset itself, a child dataset and the snapshots, creation in epoch seconds.
    got = ("tank/vol\t1796184952\ntank/vol/child\t1796184960\n"
           "tank/vol@s1\t1796184953\ntank/vol@s2\t1796184990\n")
    b, t = backend({("version",): fail(2, FUSE_VERSION_ERR), GET_P: ok(got), MOUNTPOINT: ok("/tank/vol\n"),
                    SNAPDIR: fail(1, "")})
    refs = b.list(DS)
    assert [(r.name, r.ref) for r in refs] == [("s1", "tank/vol@s1"), ("s2", "tank/vol@s2")]
    assert refs[0].created_at == dt.datetime.fromtimestamp(1796184953, dt.timezone.utc)
    # No .zfs directory on zfs-fuse: no path is claimed for the snapshot's files.
    assert all(r.path is None for r in refs)


def test_openzfs_dialect_lists_with_dash_p_and_gives_snapshot_paths():
    b, t = backend({("version",): ok("zfs-2.1.11-1\nzfs-kmod-2.1.11-1\n"),
                    LIST_P: ok("tank/vol@s1\t1796184953\n"), MOUNTPOINT: ok("/tank/vol\n"), SNAPDIR: ok()})
    [ref] = b.list(DS)
    assert ref.path == "/tank/vol/.zfs/snapshot/s1"
    assert GET_P not in t.calls
    assert b.dialect.describe() == "OpenZFS 2.1.11-1 (zfs version; zfs list -p)"


def test_unknown_version_output_is_an_error_that_quotes_it():
    b, _ = backend({("version",): ok("zfs version banner from the future\n")})
    with pytest.raises(errors.BackendError) as e:
        b.list(DS)
    assert "zfs version banner from the future" in str(e.value)
    assert not isinstance(e.value, errors.CommandFailed)


CLONES = ("list", "-H", "-o", "name,mountpoint,origin", "-t", "filesystem")
FUSE_CLONE_LIST = "tank\t/tank\t-\ntank/vol\t/tank/vol\t-\ntank/c1\t/tank/c1\ttank/vol@s1\n"
BUSY = fail(1, "cannot destroy 'tank/c1': dataset is busy\n")


def test_delete_clone_retries_busy_on_zfs_fuse(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(zfs.time, "sleep", slept.append)
    b, t = backend({("version",): fail(2, FUSE_VERSION_ERR), CLONES: ok(FUSE_CLONE_LIST),
                    ("destroy", "tank/c1"): [BUSY, ok()], ("rmdir", "--", "/tank/c1"): ok()})
    assert b.delete_clone("/tank/c1") is True
    assert t.calls.count(("destroy", "tank/c1")) == 2
    assert slept == [zfs.ZfsBackend.BUSY_RETRY_DELAYS[0]]
    # ZFS leaves the mountpoint directory of a clone it made there: removed, only if empty (rmdir)
    assert t.calls[-1] == ("rmdir", "--", "/tank/c1")


def test_delete_clone_gives_up_on_a_dataset_that_stays_busy(monkeypatch):
    monkeypatch.setattr(zfs.time, "sleep", lambda s: None)
    b, t = backend({("version",): fail(2, FUSE_VERSION_ERR), CLONES: ok(FUSE_CLONE_LIST),
                    ("destroy", "tank/c1"): BUSY})
    with pytest.raises(errors.CommandFailed) as e:
        b.delete_clone("/tank/c1")
    assert "dataset is busy" in str(e.value)
    assert t.calls.count(("destroy", "tank/c1")) == len(zfs.ZfsBackend.BUSY_RETRY_DELAYS) + 1


def test_delete_clone_does_not_retry_on_openzfs_or_other_errors(monkeypatch):
    monkeypatch.setattr(zfs.time, "sleep", lambda s: pytest.fail("no retry expected"))
    b, t = backend({("version",): ok("zfs-2.2.2-1\n"), CLONES: ok(FUSE_CLONE_LIST),
                    ("destroy", "tank/c1"): BUSY})
    with pytest.raises(errors.CommandFailed):
        b.delete_clone("/tank/c1")
    assert t.calls.count(("destroy", "tank/c1")) == 1


def test_delete_clone_refuses_a_dataset_that_is_not_a_clone():
    b, t = backend({("version",): fail(2, FUSE_VERSION_ERR), CLONES: ok(FUSE_CLONE_LIST)})
    with pytest.raises(errors.BadValueError) as e:
        b.delete_clone("tank/vol")
    assert "'tank/vol'" in str(e.value) and "not a clone" in str(e.value)
    assert not any(c[0] == "destroy" for c in t.calls)
