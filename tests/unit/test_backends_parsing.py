"""Parsers of the tools' documented output formats, and input validation."""
from __future__ import annotations

import datetime as dt

import pytest

from slurm_snap import errors
from slurm_snap.backends import btrfs, gpfs, lustre, lvm, zfs
from slurm_snap.backends.base import check_abs_path, check_name

UTC = dt.timezone.utc

BTRFS_SHOW = """.snapshots/s1
\tName: \t\t\ts1
\tUUID: \t\t\t0a86c96f-4e57-4045-b252-0b5319eed92a
\tParent UUID: \t\t61e4a95b-7b92-314b-9c93-711e7e43fc06
\tReceived UUID: \t\t-
\tCreation time: \t\t2026-11-30 23:04:01 +0100
\tSubvolume ID: \t\t257
\tFlags: \t\t\treadonly
\tSnapshot(s):
\t\t\t\t.snapshots/child
"""


def test_btrfs_show():
    info = btrfs.parse_show(BTRFS_SHOW)
    assert info["Parent UUID"] == "61e4a95b-7b92-314b-9c93-711e7e43fc06"
    assert info["Flags"] == "readonly"
    assert ".snapshots/child" not in info
    assert btrfs.parse_time(info["Creation time"]) == dt.datetime(2026, 11, 30, 22, 4, 1, tzinfo=UTC)
    assert btrfs.parse_time("garbage") is None


def test_zfs_list_and_dataset_names():
    out = zfs.parse_snapshot_list("tank/a@s1\t1700000000\ntank/a@s2\t-\ntank/a\t1\n")
    assert out == {"tank/a@s1": dt.datetime.fromtimestamp(1700000000, UTC), "tank/a@s2": None}
    assert zfs.check_dataset("tank/odd name:x.y-z") == "tank/odd name:x.y-z"
    for bad in ("-o", "tank/a;rm", "tank/$x", "tank/'q'", "/tank", "tank/a@s1", "tank//a", ""):
        with pytest.raises(errors.BadValueError) as e:
            zfs.check_dataset(bad)
        assert repr(bad) in str(e.value)


def test_lvm_lvs_and_volume_names():
    out = lvm.parse_lvs("  s1|vol|2026-11-30 23:04:01 +0000|Vri---tz-k\n  vol||2026-11-30 22:00:00 +0000|Vwi-a-tz--\n")
    assert out["s1"]["origin"] == "vol" and out["s1"]["attr"][1] == "r"
    assert out["s1"]["created"] == dt.datetime(2026, 11, 30, 23, 4, 1, tzinfo=UTC)
    assert lvm.check_volume("vg0/odd+name.x_y-z") == ("vg0", "odd+name.x_y-z")
    for bad in ("vg0", "vg0/-x", "vg0/a b", "vg/a/b"):
        with pytest.raises(errors.BadValueError):
            lvm.check_volume(bad)


LCTL = """filesystem_name: fs1
snapshot_name: s1
snapshot_fsname: 1a2b3c4d
modify_time: Mon Nov 30 23:04:01 2026
create_time: Mon Nov 30 23:04:01 2026
status: not mount

filesystem_name: fs1
snapshot_name: s2
create_time: Tue Dec  1 01:02:03 2026
status: mounted
"""


def test_lustre_snapshot_list():
    out = lustre.parse_snapshot_list(LCTL)
    assert sorted(out) == ["s1", "s2"]
    assert out["s2"]["status"] == "mounted"
    assert lustre.parse_ctime(out["s2"]["create_time"]) == dt.datetime(2026, 12, 1, 1, 2, 3, tzinfo=UTC)
    assert lustre.parse_snapshot_list("") == {}


MMLSSNAPSHOT = """mmlssnapshot::HEADER:version:reserved:reserved:filesystemName:directory:snapID:status:created:quotas:data:metadata:fileset:snapType:newField:
mmlssnapshot::0:1:::gpfs0:s1:3:Valid:Mon Nov 30 23%3A04%3A01 2026::0:0:fset%3Aone::x:
mmlssnapshot::0:1:::gpfs0:s2:4:DeleteRequired:Mon Nov 30 23%3A05%3A01 2026::0:0:other::y:
"""


def test_gpfs_y_output_is_parsed_by_header():
    rows = gpfs.parse_y(MMLSSNAPSHOT, "mmlssnapshot")
    assert [r["directory"] for r in rows] == ["s1", "s2"]
    assert rows[0]["fileset"] == "fset:one"  # percent-decoded
    assert gpfs.parse_created(rows[0]["created"]) == dt.datetime(2026, 11, 30, 23, 4, 1, tzinfo=UTC)
    assert gpfs.parse_y("garbage\n", "mmlssnapshot") == []


def test_snapshot_names_and_paths():
    assert check_name("preempt-3_job.42:x") == "preempt-3_job.42:x"
    for bad in ("", "-rf", ".x", "a/b", "a b", "x\n", "a" * 201, None):
        with pytest.raises(errors.BadValueError):
            check_name(bad)
    assert check_abs_path("v", "/a b/'c'$;/") == "/a b/'c'$;"
    for bad in ("rel", "/a/../b", "/a/./b", "/a\nb", "/a\0b"):
        with pytest.raises(errors.BadValueError) as e:
            check_abs_path("volume", bad)
        assert "volume" in str(e.value)
