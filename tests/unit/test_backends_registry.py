"""The backend registry and option checking: no tools, no filesystems."""
from __future__ import annotations

from importlib import metadata

import pytest

from slurm_snap import errors
from slurm_snap.backends import registry
from slurm_snap.backends.base import Backend, Capabilities
from slurm_snap.backends.registry import BUILTINS, Registry, get_backend
from slurm_snap.backends.transport import LocalTransport


class Dummy(Backend):
    name = "dummy"
    OPTIONS = {"colour": (str, "blue"), "depth": (int, 1)}

    capabilities = Capabilities(atomic=True, read_only=True, instant=True, per_file_cost=False,
                                scope="volume", needs_root=False, can_clone=False)

    def create(self, volume, name):
        raise NotImplementedError

    def list(self, volume):
        return []

    def exists(self, ref):
        return False

    def delete(self, ref):
        return False


def test_every_builtin_is_registered_and_loads():
    reg = registry.default_registry()
    assert set(BUILTINS) <= set(reg.names())
    for name in BUILTINS:
        cls = reg.backend_class(name)
        assert issubclass(cls, Backend) and cls.name == name


def test_unknown_backend_is_a_bad_value_naming_it():
    with pytest.raises(errors.BadValueError) as e:
        get_backend("nfs-magic", {})
    assert "'nfs-magic'" in str(e.value)
    assert e.value.exit_code == errors.USAGE


def test_unknown_option_is_a_config_error_naming_it():
    with pytest.raises(errors.ConfigError) as e:
        get_backend("btrfs", {"snapdirr": "/x"})
    assert "snapdirr" in str(e.value) and "btrfs" in str(e.value)
    assert e.value.exit_code == errors.CONFIG


def test_option_types_are_checked():
    with pytest.raises(errors.ConfigError) as e:
        Dummy({"depth": "deep"}, LocalTransport())
    assert "depth" in str(e.value)
    with pytest.raises(errors.ConfigError):
        Dummy({"timeout": 0}, LocalTransport())
    with pytest.raises(errors.BadValueError):
        Dummy({"tool_dir": "relative/dir"}, LocalTransport())
    d = Dummy({"depth": 3, "timeout": 5}, LocalTransport())
    assert (d.options["colour"], d.options["depth"], d.timeout) == ("blue", 3, 5.0)


def test_duplicate_names_are_rejected_but_the_same_registration_is_not():
    reg = Registry()
    reg.register("dummy", Dummy)
    reg.register("dummy", f"{Dummy.__module__}:Dummy")  # the same target, spelled as an entry point
    with pytest.raises(errors.Conflict) as e:
        reg.register("dummy", "other.module:Dummy")
    assert "dummy" in str(e.value)
    assert reg.backend_class("dummy") is Dummy


def test_entry_points_go_through_the_same_path(monkeypatch):
    ep = metadata.EntryPoint(name="dummy", value=f"{Dummy.__module__}:Dummy", group=registry.GROUP)
    clash = metadata.EntryPoint(name="btrfs", value="evil.plugin:Btrfs", group=registry.GROUP)
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [ep] if group == registry.GROUP else [])
    assert registry._load_default().backend_class("dummy") is Dummy
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [clash])
    with pytest.raises(errors.Conflict):
        registry._load_default()


def test_target_that_is_not_a_backend_is_a_config_error():
    reg = Registry()
    reg.register("bogus", "slurm_snap.errors:SnapError")
    with pytest.raises(errors.ConfigError) as e:
        reg.backend_class("bogus")
    assert "bogus" in str(e.value)


def test_optional_verbs_are_unsupported_and_volume_scope_does_not_coalesce():
    d = Dummy({}, LocalTransport())
    with pytest.raises(errors.Unsupported) as e:
        d.clone(None, "/x")
    assert e.value.exit_code == errors.UNSUPPORTED and "clone" in str(e.value)
    assert d.coalesce_key("/x") is None


def test_dataclasses_are_frozen():
    d = Dummy({}, LocalTransport())
    with pytest.raises(AttributeError):
        d.capabilities.read_only = False
    ref = d.ref("/v", "s1", "/v/.s/s1")
    with pytest.raises(AttributeError):
        ref.name = "s2"
