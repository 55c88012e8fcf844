import os

import pytest

from slurm_snap import errors, paths


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "root"
    (r / "alice" / "run1").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return r


@pytest.mark.parametrize("bad,why", [
    ("relative/path", "not an absolute path"),
    ("", "empty"),
    ("/a/../b", "'..'"),
    ("/a/./b", "'.'"),
    ("/a//b", "empty component"),
    ("/a/b\nc", "control character"),
    ("/a/\tb", "control character"),
    ("/a/\x00b", "control character"),
    ("/" + "x" * 5000, "longer than"),
    ("/a/" + "y" * 300, "component longer"),
    (b"/a/\xff", "UTF-8"),
    ("/a/\udcff", "UTF-8"),
])
def test_syntax_rejects_and_names_value(bad, why):
    with pytest.raises(errors.PathError) as ei:
        paths.check_syntax(bad)
    assert why in str(ei.value)
    assert ei.value.exit_code == errors.USAGE


def test_odd_but_legal_characters_accepted():
    for p in ("/a/with space", "/a/quote'\"", "/a/$(rm -rf)", "/a/;|&<>*?"):
        assert paths.check_syntax(p) == p


def test_resolve_inside_root(root):
    r = paths.resolve(str(root / "alice" / "run1"), [str(root)])
    assert r.exists and r.root == str(root) and r.uid == os.getuid()


def test_resolve_outside_roots(root, tmp_path):
    with pytest.raises(errors.PathError, match="outside the allowed roots"):
        paths.resolve(str(tmp_path / "outside"), [str(root)])


def test_resolve_prefix_trick(root, tmp_path):
    (tmp_path / "root-evil").mkdir()
    with pytest.raises(errors.PathError, match="outside"):
        paths.resolve(str(tmp_path / "root-evil"), [str(root)])


def test_symlink_escaping_root_refused(root, tmp_path):
    os.symlink(tmp_path / "outside", root / "alice" / "link")
    with pytest.raises(errors.PathError, match="symlink"):
        paths.resolve(str(root / "alice" / "link"), [str(root)])
    with pytest.raises(errors.PathError, match="symlink"):
        paths.resolve(str(root / "alice" / "link" / "deeper"), [str(root)], must_exist=False)


def test_symlink_inside_root_also_refused(root):
    os.symlink(root / "alice" / "run1", root / "alice" / "alias")
    with pytest.raises(errors.PathError, match="symlink"):
        paths.resolve(str(root / "alice" / "alias"), [str(root)])


def test_missing_leaf_allowed_only_when_asked(root):
    p = str(root / "alice" / "new")
    assert paths.resolve(p, [str(root)], must_exist=False).exists is False
    with pytest.raises(errors.PathError, match="does not exist"):
        paths.resolve(p, [str(root)])
    with pytest.raises(errors.PathError, match="does not exist"):
        paths.resolve(str(root / "nope" / "new"), [str(root)], must_exist=False)


def test_file_is_not_a_volume(root):
    (root / "alice" / "f").write_text("x")
    with pytest.raises(errors.PathError, match="not a directory"):
        paths.resolve(str(root / "alice" / "f"), [str(root)])


def test_open_dirs_nofollow_creates_what_is_missing(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    fd, made = paths.open_dirs_nofollow(str(target), 0o750)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(target))
    finally:
        os.close(fd)
    assert made == [str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(target)]
    assert paths.makedirs_nofollow(str(target)) == []        # all there: nothing made


@pytest.mark.parametrize("where", ["middle", "last"])
def test_open_dirs_nofollow_refuses_a_symlink_component(tmp_path, where):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "a").mkdir()
    link = tmp_path / "a" / "b"
    link.symlink_to(elsewhere)
    target = link / "c" if where == "middle" else link
    with pytest.raises(errors.PathError, match=r"is a symlink; refusing to create through it") as exc:
        paths.makedirs_nofollow(str(target))
    assert str(link) in str(exc.value)
    assert list(elsewhere.iterdir()) == []                    # nothing created where the link points


def test_open_dirs_nofollow_refuses_a_file_and_relative_paths(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(errors.PathError, match="is not a directory"):
        paths.makedirs_nofollow(str(tmp_path / "f" / "d"))
    for bad in ("rel/path", f"{tmp_path}/a/../b"):
        with pytest.raises(errors.PathError):
            paths.makedirs_nofollow(bad)
