"""doctor names the zfs CLI dialect each zfs volume class talks to (issue 20):
OpenZFS with its version, or the older zfs-fuse-style CLI; a zfs whose answer
is neither is a failed finding, not a guess."""
from __future__ import annotations

import os

from slurm_snap import config
from slurm_snap.doctor import probes, site_checks
from slurm_snap.doctor.facts import ClassTools

FAKES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fakes")

# What zfs-fuse 0.7.0 (Debian 12) prints for `zfs version`, on stderr, exit 2.
ZFS_FUSE_VERSION = r"""#!/bin/sh
[ "$1" = version ] || exit 99
printf "unrecognized command 'version'\nusage: zfs command args ...\n" >&2
exit 2
"""
STRANGE_VERSION = "#!/bin/sh\necho 'ZFS Storage Manager 9000'\n"


def cfg_with_zfs(tmp_path, tool_dir: str):
    p = tmp_path / "c.toml"
    p.write_text(f'''
[inventory]
url = "sqlite:///{tmp_path}/inv.db"
[paths]
barrier_dir = "{tmp_path}/b"
restore_root = "{tmp_path}/r"
log_dir = "{tmp_path}/l"
[[volume_class]]
name = "tank"
prefix = "{tmp_path}/tank"
scope = "shared"
backend = "zfs"
[volume_class.options]
tool_dir = "{tool_dir}"
''')
    return config.load(p)


def tool_dir(tmp_path, script: str) -> str:
    d = tmp_path / "tools"
    d.mkdir()
    (d / "zfs").write_text(script)
    (d / "zfs").chmod(0o755)
    return str(d)


def zfs_findings(cfg):
    return [f for f in site_checks.check_local(cfg, probes.local(cfg)) if "volume class tank" in f.what and "found" in f.what
            or "cannot tell" in f.what]


def test_openzfs_version_is_reported(tmp_path):
    [f] = zfs_findings(cfg_with_zfs(tmp_path, FAKES))  # the fake answers as OpenZFS 2.1.11 does
    assert f.ok
    assert f.what == ("volume class tank on this host: backend zfs found "
                      "OpenZFS 2.1.11-1 (zfs version; zfs list -p)")


def test_zfs_fuse_dialect_is_reported(tmp_path):
    [f] = zfs_findings(cfg_with_zfs(tmp_path, tool_dir(tmp_path, ZFS_FUSE_VERSION)))
    assert f.ok
    assert "pre-0.8 zfs CLI without `zfs version`" in f.what and "zfs-fuse 0.7" in f.what


def test_an_answer_that_is_neither_is_a_failed_finding_quoting_it(tmp_path):
    [f] = zfs_findings(cfg_with_zfs(tmp_path, tool_dir(tmp_path, STRANGE_VERSION)))
    assert not f.ok
    assert "ZFS Storage Manager 9000" in f.what
    assert "docs/backends.md" in f.fix


def test_backends_without_a_report_add_no_finding(tmp_path):
    from slurm_snap.backends.base import Backend

    class Quiet:
        name = "btrfs"
        tool_report = Backend.tool_report

    said = Quiet().tool_report()
    assert said is None
    found = site_checks.check_class(config.from_dict({}), ClassTools("scratch", "btrfs", tool_report=said))
    assert [f.what for f in found] == ["volume class scratch: backend btrfs tools present"]
