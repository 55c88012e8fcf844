import os

import pytest

from slurm_snap import config, errors
from slurm_snap.cli import main
from slurm_snap.hooks.volumes import parse_declaration, specs_for_job, validate_submit


@pytest.fixture
def cfg(tmp_path):
    (tmp_path / "pfs" / "alice").mkdir(parents=True)
    (tmp_path / "scratch").mkdir()
    text = f"""
[paths]
allowed_roots = ["{tmp_path}/pfs", "{tmp_path}/scratch"]
barrier_dir = "{tmp_path}/pfs/.b"
[[volume_class]]
name = "scratch"
prefix = "{tmp_path}/scratch/{{node}}"
scope = "node-local"
backend = "btrfs"
default = true
[[volume_class]]
name = "pfs"
prefix = "{tmp_path}/pfs"
scope = "shared"
backend = "btrfs"
"""
    p = tmp_path / "c.toml"
    p.write_text(text)
    return config.load(str(p))


def test_default_classes_when_nothing_declared(cfg):
    d = parse_declaration(cfg, [])
    assert [x.vc.name for x in d] == ["scratch"]


def test_every_node_gets_its_node_local_volume(cfg, tmp_path):
    specs = specs_for_job(cfg, parse_declaration(cfg, ["scratch", "pfs"]), ["n1", "n2", "n3"], 42)
    assert [(s.node, s.path) for s in specs] == [
        ("n1", f"{tmp_path}/scratch/n1/jobs/42"), ("n2", f"{tmp_path}/scratch/n2/jobs/42"),
        ("n3", f"{tmp_path}/scratch/n3/jobs/42"), ("", f"{tmp_path}/pfs/jobs/42")]


def test_explicit_paths(cfg, tmp_path):
    specs = specs_for_job(cfg, parse_declaration(cfg, [f"{tmp_path}/pfs/alice", f"{tmp_path}/scratch/n1/mine"]),
                          ["n1", "n2"], 7)
    assert ("", f"{tmp_path}/pfs/alice") in [(s.node, s.path) for s in specs]
    assert ("n2", f"{tmp_path}/scratch/n2/mine") in [(s.node, s.path) for s in specs]


@pytest.mark.parametrize("items,needle", [
    (["bogus"], "'bogus'"),
    (["relative/dir"], "'relative/dir'"),
    (["/etc"], "outside the allowed roots"),
    (["scratch", ""], "empty item"),
    (["x"] * 300, "at most 256"),
])
def test_bad_declarations(cfg, items, needle):
    with pytest.raises(errors.UsageError) as ei:
        parse_declaration(cfg, items)
    assert needle in str(ei.value)


def test_dotdot_escape_refused(cfg, tmp_path):
    with pytest.raises(errors.PathError, match=r"'\.\.'"):
        parse_declaration(cfg, [f"{tmp_path}/pfs/../../etc"])


def test_validate_submit_symlink_escape(cfg, tmp_path):
    os.symlink("/etc", tmp_path / "pfs" / "alice" / "esc")
    with pytest.raises(errors.PathError, match="symlink"):
        validate_submit(cfg, [f"{tmp_path}/pfs/alice/esc"], "app")


def test_validate_submit_other_users_dir(cfg, tmp_path):
    d = tmp_path / "pfs" / "bob"
    d.mkdir()
    os.chown(d, 4242, 4242)
    with pytest.raises(errors.PathError, match="owned by uid 4242"):
        validate_submit(cfg, [str(d)], "app", uid=1000)


def test_validate_submit_bad_consistency(cfg):
    with pytest.raises(errors.BadValueError, match="'sometimes'"):
        validate_submit(cfg, ["scratch"], "sometimes")


def test_validate_options_cli(cfg, capsys):
    assert main(["--config", cfg.path, "hook", "validate-options", "--volumes", "scratch,pfs"]) == 0
    out = capsys.readouterr().out
    assert f"SLURM_SNAP_BARRIER_DIR={cfg.paths.barrier_dir}" in out
    assert main(["--config", cfg.path, "hook", "validate-options", "--volumes", "nope"]) == errors.USAGE
    err = capsys.readouterr().err
    assert err.startswith("slurm-snap: ") and "'nope'" in err and err.count("\n") == 1
    assert main(["--config", cfg.path, "hook", "validate-options", "--volumes", ""]) == errors.USAGE
    assert "empty list" in capsys.readouterr().err


def test_validate_submit_refuses_a_directory_the_backend_cannot_snapshot_alone(cfg, tmp_path):
    """The pfs is visible from the submit host: a plain directory on a btrfs
    class is refused at sbatch, with what to do instead, rather than accepted
    and every set FAILing later (issue 21 item 4)."""
    d = tmp_path / "pfs" / "alice" / "run7"
    d.mkdir()
    with pytest.raises(errors.PathError) as ei:
        validate_submit(cfg, [str(d)], "app", uid=0)
    msg = str(ei.value)
    assert repr(str(d)) in msg and "not a btrfs subvolume" in msg
    assert f"`btrfs subvolume create {d}`" in msg
    assert "or declare the class 'pfs'" in msg and f"{tmp_path}/pfs/jobs/<job id>" in msg


@pytest.mark.parametrize("item, needle", [
    ("{tmp}/scratch/n1/../../etc", "'..'"),
    ("{tmp}/scratch/n1", "whole 'scratch' area"),
    ("{tmp}/scratch", "not inside any volume class's prefix"),
    ("{tmp}/scratch/n1//x", "empty component"),
    ("{tmp}/scratch/n1/x\ty", "control character"),
])
def test_validate_submit_checks_node_local_paths_as_far_as_the_submit_host_can(cfg, tmp_path, item, needle):
    """A node's disk is not visible at submit: syntax, class and prefix are
    what can be checked there; the Prolog checks the rest on the node."""
    with pytest.raises(errors.UsageError) as ei:
        validate_submit(cfg, [item.format(tmp=tmp_path)], "app")
    assert needle in str(ei.value)


def test_validate_submit_leaves_a_node_local_path_to_the_prolog(cfg, tmp_path):
    """Nothing of it exists here (the node's disk): accepted, for the Prolog to check."""
    (d,) = validate_submit(cfg, [f"{tmp_path}/scratch/n1/users/alice/link"], "app")
    assert (d.vc.name, d.rel) == ("scratch", "users/alice/link")
