import pytest

from slurm_snap import config, errors
from slurm_snap.cli import main

ROOT_EXAMPLE = "etc/slurm-snap.toml.example"

GOOD = """
[inventory]
url = "sqlite:////tmp/x.db"
[paths]
allowed_roots = ["/scratch"]
barrier_dir = "/scratch/.b"
[[volume_class]]
name = "scratch"
prefix = "/scratch/{node}"
scope = "node-local"
backend = "btrfs"
"""


def test_example_is_valid():
    cfg = config.load(ROOT_EXAMPLE)
    assert cfg.hooks.failure_policy == "open"
    assert cfg.protocol.checkpoint_signal == "SIGUSR1"
    assert {vc.name for vc in cfg.volume_classes} == {"scratch", "pfs"}


def test_defaults_and_env_override(write_config, monkeypatch):
    path = write_config(GOOD)
    monkeypatch.setenv("SLURM_SNAP_CONFIG", path)
    cfg = config.load()
    assert cfg.path == path
    assert cfg.timeouts.barrier == 60.0
    vc = cfg.volume_class("scratch")
    assert vc.job_path("n2", 42) == "/scratch/n2/jobs/42"
    assert cfg.signal_number == 10


@pytest.mark.parametrize("text,key", [
    ("[inventory]\nurll = 'x'\n", "inventory.urll"),
    ("[nope]\n", "nope"),
    ("[timeouts]\nbarrier = 'slow'\n", "timeouts.barrier"),
    ("[timeouts]\nbarrier = -1\n", "timeouts.barrier"),
    ("[hooks]\nfailure_policy = 'maybe'\n", "hooks.failure_policy"),
    ("[protocol]\ncheckpoint_signal = 'SIGKILL'\n", "protocol.checkpoint_signal"),
    ("[protocol]\ncheckpoint_signal = 'USR9'\n", "protocol.checkpoint_signal"),
    ("[paths]\nallowed_roots = ['relative']\n", "paths.allowed_roots[0]"),
    ("[paths]\nallowed_roots = '/x'\n", "paths.allowed_roots"),
    ("[ssh]\nport = 70000\n", "ssh.port"),
    ("[ssh]\nport = true\n", "ssh.port"),
    ("[ssh]\naddresses = '10.0.0.1'\n", "ssh.addresses"),
    ("[ssh.addresses]\nn1 = 7\n", "ssh.addresses.n1"),
    ("[ssh.addresses]\nn1 = ''\n", "ssh.addresses.n1"),
    ("[ssh.addresses]\nn1 = '10.0.0.1 -oProxyCommand=x'\n", "ssh.addresses.n1"),
    ("[ssh.addresses]\n'n 1' = '10.0.0.1'\n", "ssh.addresses.n 1"),
    ("[[volume_class]]\nname='a'\nprefix='/a'\nscope='global'\nbackend='btrfs'\n", "volume_class[0].scope"),
    ("[[volume_class]]\nname='a'\nprefix='/a'\nscope='shared'\n", "volume_class[0].backend"),
    ("[[volume_class]]\nname='a'\nprefix='/a/{node}'\nscope='shared'\nbackend='x'\n", "volume_class[0].prefix"),
    ("[[volume_class]]\nname='a'\nprefix='/a'\nscope='shared'\nbackend='x'\ncolour=1\n", "volume_class[0].colour"),
    ("[[volume_class]]\nname='a'\nprefix='/a'\nscope='shared'\nbackend='x'\n"
     "[[volume_class]]\nname='a'\nprefix='/b'\nscope='shared'\nbackend='x'\n", "volume_class[1].name"),
])
def test_bad_config_names_key_and_file(write_config, text, key):
    path = write_config(text)
    with pytest.raises(errors.ConfigError) as ei:
        config.load(path)
    assert key in str(ei.value)
    assert path in str(ei.value)
    assert ei.value.exit_code == errors.CONFIG


def test_malformed_toml(write_config):
    path = write_config("[inventory\nurl=")
    with pytest.raises(errors.ConfigError, match=r"\(syntax\)"):
        config.load(path)


def test_not_utf8(tmp_path):
    p = tmp_path / "c.toml"
    p.write_bytes(b"[paths]\nlog_dir = '/\xff'\n")
    with pytest.raises(errors.ConfigError, match="not UTF-8"):
        config.load(str(p))


def test_missing_file(tmp_path):
    with pytest.raises(errors.ConfigError, match="no such file"):
        config.load(str(tmp_path / "nope.toml"))


def test_cli_config_check_unknown_key_exits_config(write_config, capsys):
    path = write_config("[inventory]\nurl='sqlite://'\ncolour = 1\n")
    assert main(["config", "check", "--config", path]) == errors.CONFIG
    err = capsys.readouterr().err
    assert "inventory.colour" in err and "unknown key" in err and "Traceback" not in err


def test_cli_config_check_prints_effective(capsys):
    assert main(["config", "check", "--config", ROOT_EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and 'failure_policy = "open"' in out


def test_cli_config_check_bad_backend_option(write_config, capsys):
    path = write_config("[[volume_class]]\nname='a'\nprefix='/a'\nscope='shared'\nbackend='btrfs'\n"
                        "[volume_class.options]\nsnapdirr='/x'\n")
    assert main(["config", "check", "--config", path]) == errors.CONFIG
    assert "snapdirr" in capsys.readouterr().err


def test_cli_config_check_unknown_backend(write_config, capsys):
    path = write_config("[[volume_class]]\nname='a'\nprefix='/a'\nscope='shared'\nbackend='tape'\n")
    assert main(["config", "check", "--config", path]) == errors.CONFIG
    assert "'tape'" in capsys.readouterr().err


def test_version(capsys):
    assert main(["--version"]) == 0
    assert "slurm-snap, version" in capsys.readouterr().out


def test_config_check_tools_names_missing_tool(write_config, tmp_path, capsys):
    """A backend whose tool is missing fails at configuration check time, naming the tool."""
    path = write_config(f"[[volume_class]]\nname='pfs'\nprefix='{tmp_path}'\nscope='shared'\nbackend='zfs'\n"
                        "[volume_class.options]\ntool_dir='/nonexistent-tools'\n")
    rc = main(["config", "check", "--tools", "--config", path])
    err = capsys.readouterr().err
    assert rc == errors.CONFIG, err
    assert "'zfs'" in err and "not found" in err


@pytest.mark.parametrize("text,key,value", [
    ("", "hooks.failure_policy", "open"),
    ("[hooks]\nfailure_policy='closed'\n", "hooks.failure_policy", "closed"),
    ("", "hooks.record_in_background", "true"),
    ("[hooks]\nrecord_in_background=false\n", "hooks.record_in_background", "false"),
    ("", "timeouts.barrier", "60.0"),
])
def test_cli_config_get_prints_one_value(write_config, capsys, text, key, value):
    path = write_config(text)
    assert main(["--config", path, "config", "get", key]) == 0
    assert capsys.readouterr().out == value + "\n"


@pytest.mark.parametrize("key", ["hooks", "hooks.nope", "nope.x", "volume_class.name", "paths.allowed_roots"])
def test_cli_config_get_refuses_what_is_not_one_scalar_setting(write_config, capsys, key):
    path = write_config("")
    assert main(["--config", path, "config", "get", key]) == errors.USAGE
    assert repr(key) in capsys.readouterr().err


@pytest.mark.parametrize("text,policy,background,want", [
    ("RECORD=background\n", "open", True, True),
    ("RECORD=foreground\n", "open", True, False),
    ("RECORD=background\n", "closed", True, False),
    ("RECORD=foreground\n", "closed", True, True),
    ("RECORD=background\n", "open", False, False),
    ("# no RECORD line: an old entry point records in the foreground\n", "open", True, False),
])
def test_doctor_checks_the_prolog_slurmctld_entry_point_agrees(write_config, text, policy, background, want):
    from slurm_snap.doctor import slurm_checks

    cfg = config.load(write_config(f"[hooks]\nfailure_policy='{policy}'\n"
                                   f"record_in_background={'true' if background else 'false'}\n"))
    (finding,) = slurm_checks.check_entry_point(cfg, "/x/slurm-snap-prolog-slurmctld", "#!/bin/sh\n" + text)
    assert finding.ok is want
    if not want:
        assert "/x/slurm-snap-prolog-slurmctld" in finding.fix and "RECORD=" in finding.fix


def test_ssh_addresses_come_before_the_host_template(write_config):
    from slurm_snap.backends import factory

    cfg = config.load(write_config(GOOD.replace("[paths]", "[ssh]\nhost_template = '{node}.ib'\nport = 2222\n"
                                                "[ssh.addresses]\nn1 = '10.7.0.11'\n[paths]")
                                   + "transport = 'ssh'\n"))
    assert cfg.ssh.addresses == {"n1": "10.7.0.11"}
    assert factory.ssh_host(cfg, "n1") == "10.7.0.11"
    assert factory.ssh_host(cfg, "n2") == "n2.ib"       # not listed: the template
    vc = cfg.volume_class("scratch")
    t = factory.transport_for(cfg, vc, "n1")
    assert (t.host, t.port) == ("10.7.0.11", 2222)


def test_early_release_is_on_by_default_and_can_be_turned_off(tmp_path):
    from slurm_snap import config

    p = tmp_path / "c.toml"
    p.write_text("")
    assert config.load(p).protocol.early_release is True
    p.write_text("[protocol]\nearly_release = false\n")
    assert config.load(p).protocol.early_release is False
    p.write_text('[protocol]\nearly_release = "soon"\n')
    with pytest.raises(Exception) as err:
        config.load(p)
    assert "early_release" in str(err.value)


def test_example_tools_check_leaves_node_scratch_to_doctor_and_names_the_ssh_host(capsys):
    """README step 2: the example's scratch class is node-local over SSH (its
    tools are on the nodes, which doctor checks); its Lustre class is cut on
    the MGS over SSH, which a host without mgs01's key cannot reach: the error
    says which class and which host, not "needs a node name"."""
    rc = main(["config", "check", "--tools", "--config", ROOT_EXAMPLE])
    cap = capsys.readouterr()
    assert rc == errors.BACKEND
    assert cap.out.splitlines()[0] == ("# volume class scratch: node-local over SSH, checked on each node by "
                                       "`slurm-snap doctor`")
    assert "volume class 'pfs' over SSH on mgs01: " in cap.err and "known_hosts" in cap.err
    assert "needs a node name" not in cap.err


def test_example_without_the_lustre_class_passes_the_tools_check(tmp_path, capsys):
    """What the README tells a site without Lustre to change: delete the pfs table."""
    text = open(ROOT_EXAMPLE).read()
    cut = text.rindex("[[volume_class]]")
    assert 'name = "pfs"' in text[cut:]
    p = tmp_path / "slurm-snap.toml"
    p.write_text(text[:cut])
    assert main(["config", "check", "--tools", "--config", str(p)]) == 0
    assert "# volume class scratch: node-local over SSH" in capsys.readouterr().out


def test_tools_check_with_json_keeps_stdout_the_document(tmp_path, capsys):
    import json

    text = open(ROOT_EXAMPLE).read()
    p = tmp_path / "slurm-snap.toml"
    p.write_text(text[:text.rindex("[[volume_class]]")])
    assert main(["config", "check", "--tools", "--json", "--config", str(p)]) == 0
    cap = capsys.readouterr()
    assert [vc["name"] for vc in json.loads(cap.out)["volume_class"]] == ["scratch"]
    assert "# volume class scratch: node-local over SSH" in cap.err
