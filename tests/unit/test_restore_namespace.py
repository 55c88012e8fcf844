"""The drill namespace is created exactly where the guard checked, never
through a symlink swapped into its base afterwards, and never reused."""
from __future__ import annotations

import os
import stat

import pytest

from slurm_snap import errors
from slurm_snap.restore import journal as journal_mod
from slurm_snap.restore import namespace as nsmod
from slurm_snap.restore.journal import Clone, Journal


def journal(**kw) -> Journal:
    return Journal(set_id=4, test_id=1, host="ctl", pid=1, started_at="2026-12-03T08:00:00+00:00", **kw)


def test_namespace_and_marker_dir_modes_and_owner(tmp_path):
    base = tmp_path / "restore" / "root"
    ns = nsmod.namespace_path(str(base), 7, 3)
    marker = nsmod.make_namespace(str(base), ns, os.getuid(), os.getgid())
    assert marker == os.path.join(ns, nsmod.MARKER_DIR)
    assert stat.S_IMODE(os.stat(ns).st_mode) == 0o755
    st = os.stat(marker)
    assert stat.S_IMODE(st.st_mode) == 0o700 and (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


def test_existing_namespace_is_never_reused(tmp_path):
    ns = nsmod.namespace_path(str(tmp_path), 7, 3)
    nsmod.make_namespace(str(tmp_path), ns, os.getuid(), os.getgid())
    with pytest.raises(FileExistsError):
        nsmod.make_namespace(str(tmp_path), ns, os.getuid(), os.getgid())


def test_base_swapped_for_a_symlink_after_the_check_is_refused(tmp_path):
    """The guard resolved <user dir>/drills; the user then replaced it with a
    link to a directory root must not create anything in."""
    live = tmp_path / "live-volume"
    live.mkdir()
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    base = user_dir / "drills"
    base.symlink_to(live)                       # the swap
    ns = nsmod.namespace_path(str(base), 7, 3)
    with pytest.raises(errors.PathError, match="is a symlink"):
        nsmod.make_namespace(str(base), ns, os.getuid(), os.getgid())
    assert list(live.iterdir()) == []


def test_namespace_must_be_directly_inside_its_base(tmp_path):
    with pytest.raises(errors.BadValueError, match="not directly inside"):
        nsmod.make_namespace(str(tmp_path / "a"), str(tmp_path / "b" / "7-3"), os.getuid(), os.getgid())


@pytest.mark.parametrize("mode,owner", [(0o777, "self"), (0o775, "self"), (0o755, "other")])
def test_restore_root_someone_else_could_write_is_refused(tmp_path, mode, owner):
    base = tmp_path / "restore-root"
    base.mkdir()
    os.chmod(base, mode)
    if owner == "other":
        from realcomponents import require
        require(os.geteuid() == 0, "needs root to give the directory away")
        os.chown(base, 65534, 65534)
    ns = nsmod.namespace_path(str(base), 7, 3)
    with pytest.raises(errors.BadValueError, match="must be owned by uid"):
        nsmod.make_namespace(str(base), ns, os.getuid(), os.getgid(), base_must_be_ours=True)
    assert list(base.iterdir()) == []
    os.chmod(base, 0o755)
    if owner == "other":
        os.chown(base, os.geteuid(), os.getegid())
    nsmod.make_namespace(str(base), ns, os.getuid(), os.getgid(), base_must_be_ours=True)
    assert os.path.isdir(ns)


def test_cleanup_removes_the_alternative_namespace_on_every_host(tmp_path, monkeypatch):
    """Node-local volumes at one path on several nodes: their clones' alternative
    namespaces have one path too, one directory per node, and each is removed."""
    from types import SimpleNamespace

    ns = nsmod.namespace_path(str(tmp_path), 4, 1)
    nsmod.make_namespace(str(tmp_path), ns, os.getuid(), os.getgid())
    alt = nsmod.alt_namespace("/scratch/jobs/.snapshots/s1", ns)
    journal_mod.write(ns, journal(namespaces=(alt,), clones=tuple(
        Clone(snapshot_id=1, path=f"{alt}/scratch@{n}", ns=alt, live="/scratch/jobs/4", volume_class="scratch", node=n)
        for n in ("n1", "n2", "n3"))))
    backends = {n: SimpleNamespace(transport=SimpleNamespace(where=f"root@{n}")) for n in ("n1", "n2", "n3")}
    removed, emptied = [], []
    monkeypatch.setattr(nsmod, "remove_clone", lambda b, path, where: removed.append((b.transport.where, path)))
    monkeypatch.setattr(nsmod, "_remove_empty_dir", lambda b, path: emptied.append((b.transport.where, path)))
    assert nsmod.cleanup_namespace(ns, lambda clone: backends[clone.node]) == []
    assert sorted(removed) == [(f"root@{n}", f"{alt}/scratch@{n}") for n in ("n1", "n2", "n3")]
    assert sorted(emptied) == [(f"root@{n}", alt) for n in ("n1", "n2", "n3")]
    assert not os.path.exists(ns)


def test_cleanup_takes_a_killed_writers_temporary_as_its_own_but_nothing_else(tmp_path):
    """drill.json is written by fsio.atomic_write: a drill killed mid-write
    leaves its temporary, which must not keep the namespace forever."""
    ns = nsmod.namespace_path(str(tmp_path), 4, 2)
    nsmod.make_namespace(str(tmp_path), ns, os.getuid(), os.getgid())
    journal_mod.write(ns, journal())
    with open(os.path.join(ns, f".{journal_mod.FILE}.123.456.abcd.tmp"), "w") as f:
        f.write("{")
    assert nsmod.cleanup_namespace(ns, lambda entry: None) == []
    assert not os.path.exists(ns)
    ns = nsmod.namespace_path(str(tmp_path), 4, 3)
    nsmod.make_namespace(str(tmp_path), ns, os.getuid(), os.getgid())
    open(os.path.join(ns, "user-file"), "w").close()
    (err,) = nsmod.cleanup_namespace(ns, lambda entry: None)
    assert "unexpected entries ['user-file']" in err and os.path.isdir(ns)
