"""Bad input at every entry point: the CLI's job ids, the hook environment,
--snapshot-volumes as the hooks and the submit check see it, the config file,
and paths swapped for symlinks after they were validated.

Each case asserts the exit code, that the message names the offending value,
and -- for the hooks -- that nothing was created, recorded or written outside
the allowed roots. (Already covered elsewhere and not repeated here:
tests/unit/test_paths.py (path syntax), test_volumes.py (unknown class,
relative, /etc, empty item, 300 items), test_hostlist.py (n[1-, n[3-1],
n[a-b], huge range), test_config.py (unknown keys, wrong scalar types,
malformed TOML, non-UTF-8, missing file).)
"""
from __future__ import annotations

import json
import os
import pwd

import pytest

from slurm_snap import config, errors, paths
from slurm_snap.cli import main
from slurm_snap.hooks.volumes import validate_submit

def _user() -> tuple[int, int, str]:
    """A real unprivileged user when the machine has one (the dev-cluster user), else nobody."""
    for name in ("snapuser", "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid, name
        except KeyError:
            continue
    return 65534, 65534, "nobody"


UID, GID, USER = _user()


@pytest.fixture
def site(tmp_path):
    """A config with one allowed root holding a node-local and a shared class,
    and the user's own directory on the shared one."""
    root = tmp_path / "root"
    (root / "scratch" / "n1").mkdir(parents=True)
    (root / "pfs" / "users" / USER / "data").mkdir(parents=True)
    os.chown(root / "pfs" / "users" / USER, UID, GID)
    os.chown(root / "pfs" / "users" / USER / "data", UID, GID)
    (tmp_path / "outside").mkdir()
    text = f"""
[inventory]
url = "sqlite:///{tmp_path}/inv.db"
[paths]
allowed_roots = ["{root}"]
barrier_dir = "{tmp_path}/barriers"
log_dir = "{tmp_path}/log"
restore_root = "{tmp_path}/restore"
[timeouts]
hook_budget = 20
[[volume_class]]
name = "scratch"
prefix = "{root}/scratch/{{node}}"
scope = "node-local"
backend = "btrfs"
default = true
[[volume_class]]
name = "pfs"
prefix = "{root}/pfs"
scope = "shared"
# Any directory is a volume to xfs-reflink: these cases are about the path,
# not about whether a backend can cut that directory alone (test_volumes.py).
backend = "xfs-reflink"
"""
    for policy in ("open", "closed"):
        (tmp_path / f"{policy}.toml").write_text(text + f"[hooks]\nfailure_policy = '{policy}'\n")
    import dbtemplates

    dbtemplates.sqlite(tmp_path / "inv.db")     # migrated, as `db upgrade` leaves it
    return tmp_path


def cfg_path(site, policy="open") -> str:
    return str(site / f"{policy}.toml")


def hook_env(monkeypatch, **over):
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_UID": str(UID), "SLURM_JOB_GID": str(GID), "SLURM_JOB_USER": USER,
           "SLURMD_NODENAME": "n1", "SLURM_JOB_NODELIST": "n1", "SPANK_SLURM_SNAP": "1",
           "SPANK_SLURM_SNAP_VOLUMES": "scratch"}
    env.update(over)
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)


def tree(path) -> list[str]:
    """Every entry below `path` (to assert that nothing was created)."""
    out = []
    for dirpath, dirs, files in os.walk(path):
        out += [os.path.join(dirpath, n) for n in dirs + files]
    return sorted(out)


def job_runs(site) -> int:
    from sqlalchemy import text

    from slurm_snap.inventory.repository import Inventory
    inv = Inventory(f"sqlite:///{site}/inv.db")
    try:
        with inv.engine.connect() as c:
            return c.execute(text("select count(*) from job_run")).scalar()
    finally:
        inv.dispose()


def hook_failed_events(site) -> list[str]:
    from slurm_snap.inventory.repository import Inventory
    inv = Inventory(f"sqlite:///{site}/inv.db")
    try:
        with inv.session() as repo:
            return [e.message for e in repo.events(kind="hook-failed")]
    finally:
        inv.dispose()


def run_hook_both_policies(site, monkeypatch, capsys, hook="prolog"):
    """The hook under open (exit 0) and closed (exit 1); returns both stderr texts."""
    before = tree(site / "root")
    rc_open = main(["--config", cfg_path(site, "open"), "hook", hook])
    err_open = capsys.readouterr().err
    rc_closed = main(["--config", cfg_path(site, "closed"), "hook", hook])
    err_closed = capsys.readouterr().err
    assert (rc_open, rc_closed) == (0, 1), (err_open, err_closed)
    # nothing prepared, nothing recorded, no barrier directory for the job
    assert tree(site / "root") == before
    assert not (site / "barriers" / "77").exists()
    assert job_runs(site) == 0
    log = [json.loads(x) for x in (site / "log" / "hooks.log").read_text().splitlines()]
    assert [r["status"] for r in log] == ["failed", "failed"]
    assert log[0]["message"] in err_open and log[1]["message"] in err_closed
    return err_open, err_closed


# ---- CLI arguments -----------------------------------------------------------
BAD_JOB_IDS = ["abc", "1.2.3", "99999999999999999999", "4294967296", "١٢", "1\n2", "0x10", " "]


@pytest.mark.parametrize("command", ["snapshot", "show", "restore-test"])
@pytest.mark.parametrize("value", BAD_JOB_IDS)
def test_cli_bad_job_id_is_a_usage_error_naming_it(site, capsys, command, value):
    rc = main(["--config", cfg_path(site), command, value])
    err = capsys.readouterr().err
    assert rc == errors.USAGE, err
    assert value.strip() in err or repr(value) in err or (value == " " and "' '" in err), err
    assert job_runs(site) == 0


@pytest.mark.parametrize("command", ["snapshot", "show", "restore-test"])
def test_cli_negative_job_id_is_not_taken_for_a_job(site, capsys, command):
    assert main(["--config", cfg_path(site), command, "-1"]) == errors.USAGE
    assert "-1" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "0", "99999999999999999999", "abc"])
def test_cli_prune_bad_job_id(site, capsys, value):
    rc = main(["--config", cfg_path(site), "prune", "--keep-last", "1", "--job", value])
    assert rc == errors.USAGE
    assert value in capsys.readouterr().err


def test_cli_show_huge_set_id_is_a_usage_error(site, capsys):
    for argv in (["show", "set:99999999999999999999"], ["show", "--set", "99999999999999999999"]):
        assert main(["--config", cfg_path(site), *argv]) == errors.USAGE
        assert "99999999999999999999" in capsys.readouterr().err


# ---- hook environment ----------------------------------------------------------
@pytest.mark.parametrize("key,value,named", [
    ("SLURM_JOB_ID", None, "SLURM_JOB_ID"),
    ("SLURM_JOB_ID", "abc", "'abc'"),
    ("SLURM_JOB_ID", "-1", "'-1'"),
    ("SLURM_JOB_ID", "1.2", "'1.2'"),
    ("SLURM_JOB_ID", "١٢", "'١٢'"),
    ("SLURM_JOB_ID", "99999999999999999999", "'99999999999999999999'"),
    ("SLURM_JOB_ID", "12; rm -rf /", "'12; rm -rf /'"),
    ("SLURM_JOB_UID", None, "SLURM_JOB_UID"),
    ("SLURM_JOB_UID", "root", "'root'"),
    ("SLURM_JOB_UID", "-5", "'-5'"),
    ("SLURM_JOB_GID", "x", "'x'"),
    ("SLURM_JOB_NODELIST", "n[1-3", "'n[1-3'"),
    ("SLURM_JOB_NODELIST", "n1]", "'n1]'"),
    ("SLURM_JOB_NODELIST", "n[]", "'n[]'"),
    ("SLURM_JOB_NODELIST", "n[1,,2]", "'n[1,,2]'"),
    ("SLURM_JOB_NODELIST", "n[1-2,x]", "'n[1-2,x]'"),
])
def test_hook_bad_environment(site, monkeypatch, capsys, key, value, named):
    hook_env(monkeypatch, **{key: value})
    err_open, err_closed = run_hook_both_policies(site, monkeypatch, capsys)
    for err in (err_open, err_closed):
        assert named in err, err
        assert "(policy " in err


def _volumes_cases(site):
    root = site / "root"
    mine = root / "pfs" / "users" / USER
    return [
        (f"{mine}/../../../../outside", "'..'"),
        (f"{mine}/./data", "'.'"),
        ("users/x", "'users/x'"),
        ("../etc", "'../etc'"),
        (".hidden", "'.hidden'"),
        (f"{mine}/a\nb", "control character"),
        (f"{mine}/a\tb", "control character"),
        (f"{mine}/a\x1bb", "control character"),
        ("/etc", "outside the allowed roots"),
        (f"{site}/outside", "outside the allowed roots"),
        (f"{root}/pfs", "is the whole 'pfs' area"),
        ("scratch,nosuch", "'nosuch'"),
        ("scratch,,pfs", "empty item"),
        (",".join(["scratch"] * 257), "at most 256"),
        (f"{mine}/" + "x" * 300, "component longer than 255"),
        (f"{mine}/" + "/".join(["y" * 200] * 25), "longer than 4096"),
    ]


# 12 ("scratch,,pfs") is the submit check's alone: the plugin never passes an
# empty item on, and the hooks read SPANK_SLURM_SNAP_VOLUMES skipping empty items.
@pytest.mark.parametrize("i", [i for i in range(16) if i != 12])
def test_hook_bad_volume_declaration(site, monkeypatch, capsys, i):
    value, named = _volumes_cases(site)[i]
    hook_env(monkeypatch, SPANK_SLURM_SNAP_VOLUMES=value)
    for err in run_hook_both_policies(site, monkeypatch, capsys):
        assert named in err, err
    assert tree(site / "outside") == []
    # the job's env was readable, so the failure is also an inventory event
    events = hook_failed_events(site)
    assert len(events) == 2 and all(named in e for e in events)


@pytest.mark.parametrize("i", range(16))
def test_submit_check_rejects_the_same_declarations(site, capsys, i):
    """What the SPANK plugin runs as the user: exit 2, one line naming the value."""
    value, named = _volumes_cases(site)[i]
    rc = main(["--config", cfg_path(site), "hook", "validate-options", "--volumes", value])
    err = capsys.readouterr().err
    assert rc == errors.USAGE, err
    assert named in err and err.startswith("slurm-snap: ")


@pytest.mark.parametrize("value", ["pfs", "scratch,pfs"])
def test_huge_resume_cmd_is_rejected(site, capsys, value):
    big = "python train.py " + "A" * 100_000
    rc = main(["--config", cfg_path(site), "hook", "validate-options", "--volumes", value, "--resume-cmd", big])
    err = capsys.readouterr().err
    assert rc == errors.USAGE and "--snapshot-resume-cmd" in err and "python train.py" in err
    assert len(err) < 1000  # the message quotes a prefix, not 100 kB


def test_huge_volume_value_is_rejected_without_echoing_it_all(site, capsys):
    big = "/" + "z" * 100_000
    rc = main(["--config", cfg_path(site), "hook", "validate-options", "--volumes", big])
    err = capsys.readouterr().err
    assert rc == errors.USAGE and "longer than 4096" in err and "/zzzz" in err
    assert len(err) < 1000


@pytest.mark.parametrize("name", ["with space", "quote'\"", "$(touch x)", ";|&<>*?", "`id`"])
def test_odd_characters_are_data_not_commands(site, capsys, name):
    """Legal in a path: accepted as data, never interpreted (no file appears from `touch`)."""
    mine = site / "root" / "pfs" / "users" / USER
    (mine / name).mkdir()
    os.chown(mine / name, UID, GID)
    cwd = os.getcwd()
    os.chdir(site)
    try:
        declared = validate_submit(config.load(cfg_path(site)), [f"{mine}/{name}"], "app", uid=UID)
    finally:
        os.chdir(cwd)
    assert declared[0].rel == f"users/{USER}/{name}"
    assert not (site / "x").exists()


def test_invalid_utf8_in_the_hook_environment(site, monkeypatch, capsys):
    """os.environ decodes undecodable bytes to surrogates: refused as not UTF-8."""
    mine = site / "root" / "pfs" / "users" / USER
    value = os.fsdecode(os.fsencode(str(mine)) + b"/\xff\xfe")
    hook_env(monkeypatch, SPANK_SLURM_SNAP_VOLUMES=value)
    for err in run_hook_both_policies(site, monkeypatch, capsys):
        assert "not valid UTF-8" in err


# ---- a path validated, then swapped for a symlink ---------------------------------
@pytest.mark.parametrize("swap", ["leaf", "parent"])
def test_symlink_swapped_in_after_validation_is_refused_by_the_hook(site, monkeypatch, capsys, swap):
    mine = site / "root" / "pfs" / "users" / USER
    declared = f"{mine}/data"
    cfg = config.load(cfg_path(site))
    ok = paths.resolve(declared, cfg.paths.allowed_roots)
    assert ok.exists and ok.uid == UID
    validate_submit(cfg, [declared], "app", uid=UID)  # sbatch accepted it
    # ...then the user swaps a component for a link to somewhere root would write
    victim = site / "outside"
    (victim / "precious").write_text("root's")
    if swap == "leaf":
        os.rename(mine / "data", mine / "data.old")
        os.symlink(victim, mine / "data")
        swapped = f"{mine}/data"
    else:
        os.rename(mine, f"{mine}.old")
        os.symlink(victim, mine)
        (victim / "data").mkdir()
        swapped = str(mine)
    hook_env(monkeypatch, SPANK_SLURM_SNAP_VOLUMES=declared)
    before = tree(victim)
    rc = main(["--config", cfg_path(site, "closed"), "hook", "prolog"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"{swapped} is a symlink" in err and repr(declared) in err
    assert tree(victim) == before and (victim / "precious").read_text() == "root's"
    assert not (site / "barriers" / "77").exists()


def test_another_users_directory_is_refused_by_the_hook(site, monkeypatch, capsys):
    theirs = site / "root" / "pfs" / "users" / "someone"
    theirs.mkdir()
    os.chown(theirs, UID + 1, UID + 1)
    hook_env(monkeypatch, SPANK_SLURM_SNAP_VOLUMES=str(theirs))
    rc = main(["--config", cfg_path(site, "closed"), "hook", "prolog"])
    err = capsys.readouterr().err
    assert rc == 1 and f"owned by uid {UID + 1}, not by the job's user" in err and str(theirs) in err
    assert not (site / "barriers" / "77").exists()


# ---- config file -------------------------------------------------------------------
@pytest.mark.parametrize("text,key,why", [
    ("[volume_class]\nname='a'\n", "volume_class", "array of tables"),
    ("inventory = 5\n", "inventory", "must be a table"),
    ("[inventory]\nbusy_timeout = true\n", "inventory.busy_timeout", "expected a number"),
    ("[paths]\nallowed_roots = ['/a/../b']\n", "paths.allowed_roots[0]", "clean absolute"),
    ("[paths]\nbarrier_dir = 'rel/dir'\n", "paths.barrier_dir", "not absolute"),
    ("[paths]\nallowed_roots = [1, 2]\n", "paths.allowed_roots", "array of strings"),
    ("[protocol]\ngrace = -5\n", "protocol.grace", "negative"),
    ("[protocol]\ncheckpoint_signal = 'SIG_DFL'\n", "protocol.checkpoint_signal", "'SIG_DFL'"),
    ("[protocol]\ncheckpoint_signal = 'SIG_IGN'\n", "protocol.checkpoint_signal", "'SIG_IGN'"),
    ("[protocol]\ndefault_consistency = 'best'\n", "protocol.default_consistency", "'best'"),
    ("[[volume_class]]\nname='../x'\nprefix='/a'\nscope='shared'\nbackend='x'\n", "volume_class[0].name", "'../x'"),
    ("[[volume_class]]\nname='a b'\nprefix='/a'\nscope='shared'\nbackend='x'\n", "volume_class[0].name", "'a b'"),
    ("[[volume_class]]\nname='a'\nprefix='rel'\nscope='shared'\nbackend='x'\n", "volume_class[0].prefix", "'rel'"),
    ("[[volume_class]]\nname='a'\nprefix='/a'\nscope='shared'\nbackend='x'\ntransport='telnet'\n",
     "volume_class[0].transport", "'telnet'"),
    ("[[volume_class]]\nname='a'\nprefix='/a'\nscope='shared'\nbackend='x'\noptions=5\n",
     "volume_class[0].options", "expected a table"),
    ("[inventory]\nurl='a'\nurl='b'\n", "(syntax)", "line 3"),
    ("\x00\x01\x02", "(syntax)", ""),
])
def test_config_bad_value_names_key_file_and_value(write_config, text, key, why):
    path = write_config(text)
    with pytest.raises(errors.ConfigError) as ei:
        config.load(path)
    msg = str(ei.value)
    assert path in msg and key in msg and why in msg, msg
    assert ei.value.exit_code == errors.CONFIG


def test_config_path_that_is_a_directory(tmp_path, capsys):
    assert main(["--config", str(tmp_path), "config", "check"]) == errors.CONFIG
    assert f"{tmp_path}: (file): Is a directory" in capsys.readouterr().err


def test_config_hook_with_broken_config_never_drains(site, monkeypatch, capsys):
    """A config the hooks cannot parse: policy unknown, so open (exit 0), message names the file."""
    bad = site / "broken.toml"
    bad.write_text("[hooks\nfailure_policy='closed'\n")
    hook_env(monkeypatch)
    assert main(["--config", str(bad), "hook", "prolog"]) == 0
    assert str(bad) in capsys.readouterr().err

