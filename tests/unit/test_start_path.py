"""What the processes on a job's start path import (issue 36): an opted-in
job's node Prolog and the SPANK plugin's check inside sbatch each start a
Python process, and every module they import is paid per job (per node for
the Prolog). These standard modules cost ~5 to 57 M instructions each on the
2-core machine of docs/benchmarks.md (dataclasses 57, tomllib 55, logging
48, subprocess 38, typing 33, json 25, re 20, enum 14); none of them may come
back on these paths unnoticed. The helpers that replace them (record,
plainjson, spawn, lazylog, configcache) have their own tests below.

    scripts/test tests/unit/test_start_path.py -q
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys

import pytest

from slurm_snap import configcache, plainjson, spawn
from slurm_snap.record import factory, record, replace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = {"dataclasses", "inspect", "typing", "re", "json", "logging", "subprocess", "tomllib", "enum",
         "threading", "hashlib", "pathlib", "traceback", "signal", "selectors", "contextlib"}
CONFIG = """[paths]
allowed_roots = ["{root}"]
barrier_dir = "{root}/barriers"
log_dir = "{root}/log"

[[volume_class]]
name = "scratch"
prefix = "{root}/scratch/{{node}}"
scope = "node-local"
backend = "btrfs"
default = true
"""


pytestmark = pytest.mark.slow(9)   # seconds idle: the unit run starts this file early (tests/conftest.py)


def _loaded(code: str, env: dict) -> set[str]:
    """The modules a fresh interpreter (isolated, as the entry points start
    it) has after running `code`."""
    full = (f"import sys; sys.path.insert(0, {REPO!r})\n{code}\n"
            "print(sorted(sys.modules))")
    out = subprocess.run([sys.executable, "-I", "-c", full], capture_output=True, text=True, timeout=60,
                         env=env, check=True)
    return set(eval(out.stdout.splitlines()[-1]))


@pytest.fixture
def site(tmp_path):
    cfg = tmp_path / "slurm-snap.toml"
    cfg.write_text(CONFIG.format(root=tmp_path))
    cache = tmp_path / "cache"
    env = {"SLURM_SNAP_CONFIG_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    # The first process parses the TOML and keeps it; the job's processes find it.
    _loaded(f"from slurm_snap import config; config.load({str(cfg)!r})", env)
    assert len(os.listdir(cache)) == 1
    return cfg, env


def test_the_node_prologs_imports_are_light(site):
    cfg, env = site
    loaded = _loaded(
        "import slurm_snap.entry, slurm_snap.hooks.run, slurm_snap.hooks.jobhooks, slurm_snap.hooks.policy\n"
        "import slurm_snap.backends.factory, slurm_snap.backends.btrfs, slurm_snap.slurm.jobenv\n"
        f"from slurm_snap import config; c = config.load({str(cfg)!r})\n"
        "from slurm_snap.hooks import volumes\n"
        "specs = volumes.specs_for_job(c, volumes.parse_declaration(c, ['scratch']), ['n1', 'n2'], 7)\n"
        "from slurm_snap.jobrecords import JobRecord\n"
        "from slurm_snap.plainjson import dumps; dumps(JobRecord(job_id=7, restart_count=0, user='u', "
        "nodes=('n1',), signal='SIGUSR1', volumes=tuple(specs)).to_json())\n"
        "from slurm_snap.spool import has_entries; has_entries(c.spool.directory)", env)
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
    assert not {m for m in loaded if m.split(".")[0] in ("click", "sqlalchemy", "paramiko")}


def test_the_submit_checks_imports_are_light(site):
    cfg, env = site
    loaded = _loaded(
        "from slurm_snap.hooks.submit import validate_options\n"
        f"from slurm_snap import config; c = config.load({str(cfg)!r})\n"
        "print(validate_options(c, volumes='scratch', consistency='app', resume_cmd='', every=None))\n"
        # The duration grammar too (--snapshot-every, --snapshot-before-timelimit): scanned without re.
        "print(validate_options(c, volumes='scratch', consistency='app', resume_cmd='', every='1h30min',\n"
        "                       before_timelimit='00:10:00'))", env)
    assert not loaded & HEAVY, sorted(loaded & HEAVY)
    assert "datetime" not in loaded
    assert "click" not in loaded


def test_the_entry_point_validates_without_click_and_says_the_same(site):
    """The plugin's fixed argv takes the fast path; its answers, good and
    bad, are the CLI's, word for word and exit code for exit code."""
    cfg, env = site
    script = os.path.join(REPO, "bin", "slurm-snap")
    for args in (["--volumes", "scratch"], ["--volumes", "nope", "--consistency", "app"],
                 ["--volumes", "scratch", "--every", "5s"], ["--volumes", ""]):
        fast = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {REPO!r}); "
                               "sys.argv[0] = 'slurm-snap'; from slurm_snap.entry import entry; entry()",
                               "--config", str(cfg), "hook", "validate-options", *args],
                              capture_output=True, text=True, env=env, timeout=60)
        slow = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {REPO!r}); "
                               "from slurm_snap.cli import main; sys.exit(main())",
                               "--config", str(cfg), "hook", "validate-options", *args],
                              capture_output=True, text=True, env=env, timeout=60)
        assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), args
    assert os.access(script, os.X_OK) and open(script).readline() == "#!python\n"
    assert "import re" not in open(script).read()


def test_help_and_version_are_clicks_own_text_without_click(site):
    """--help, --version and report --helpformat answer from helptext.py,
    without importing click, in the very words click prints for them."""
    cfg, env = site
    for columns in ("80", "200"):
        run_env = {**env, "COLUMNS": columns}
        for args in (["--version"], ["--help"], ["-h"], ["--config", str(cfg), "--help"],
                     ["report", "--helpformat"], ["-v", "report", "-e"]):
            fast = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {REPO!r}); "
                                   "sys.argv[0] = 'slurm-snap'; from slurm_snap.entry import entry; entry()", *args],
                                  capture_output=True, text=True, env=run_env, timeout=60)
            slow = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {REPO!r}); "
                                   "sys.argv[0] = 'slurm-snap'; from slurm_snap.cli import main; sys.exit(main())",
                                   *args], capture_output=True, text=True, env=run_env, timeout=60)
            assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), \
                (columns, args)
    for args in (["--version"], ["--help"], ["report", "--helpformat"]):
        loaded = _loaded("import sys; sys.argv = ['slurm-snap', *%r]\n"
                         "from slurm_snap.entry import entry\ntry:\n    entry()\nexcept SystemExit:\n    pass" % (args,),
                         env)
        assert not {m for m in loaded if m.split(".")[0] in ("click", "sqlalchemy")}, args


# --- the config cache -------------------------------------------------------------------------
def test_the_cache_answers_only_for_the_same_file(site, tmp_path):
    cfg, env = site
    os.environ[configcache.ENV_VAR] = env[configcache.ENV_VAR]
    try:
        st = os.stat(cfg)
        data = configcache.read(str(cfg), st)
        assert data is not None and data["volume_class"][0]["name"] == "scratch"
        cfg.write_text(CONFIG.format(root=tmp_path).replace("scratch", "local"))
        assert configcache.read(str(cfg), os.stat(cfg)) is None          # edited: parsed again
        from slurm_snap import config

        assert config.load(str(cfg)).volume_classes[0].name == "local"
        assert config.load(str(cfg)).volume_classes[0].name == "local"   # from the cache
    finally:
        del os.environ[configcache.ENV_VAR]


def test_the_cache_is_not_taken_from_an_untrusted_file(site):
    cfg, env = site
    os.environ[configcache.ENV_VAR] = env[configcache.ENV_VAR]
    try:
        cache = env[configcache.ENV_VAR]
        entry = os.path.join(cache, os.listdir(cache)[0])
        assert configcache.read(str(cfg), os.stat(cfg)) is not None
        os.chmod(entry, 0o666)                                             # anyone could have written it
        assert configcache.read(str(cfg), os.stat(cfg)) is None
        os.chmod(entry, 0o644)
        os.chmod(cache, 0o777)                                             # or swapped it
        assert configcache.read(str(cfg), os.stat(cfg)) is None
    finally:
        del os.environ[configcache.ENV_VAR]


def test_the_cache_keeps_the_configs_mode(site, tmp_path):
    cfg, env = site
    os.environ[configcache.ENV_VAR] = str(tmp_path / "cache2")
    try:
        os.chmod(cfg, 0o640)
        from slurm_snap import config

        config.load(str(cfg))
        (entry,) = os.listdir(tmp_path / "cache2")
        assert os.stat(tmp_path / "cache2" / entry).st_mode & 0o777 == 0o640
    finally:
        del os.environ[configcache.ENV_VAR]


# --- record -----------------------------------------------------------------------------------
@record
class _Part:
    name: str
    size: int = 0
    tags: dict = factory(dict)


@record(order=True)
class _Version:
    major: int
    minor: int


def test_a_record_is_a_frozen_dataclass_to_whoever_asks():
    p = _Part("a", 3)
    assert p == _Part(name="a", size=3) and p != _Part("a") and repr(p) == "_Part(name='a', size=3, tags={})"
    assert _Part("a").tags is not _Part("a").tags
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.size = 4
    assert dataclasses.is_dataclass(p) and [f.name for f in dataclasses.fields(_Part)] == ["name", "size", "tags"]
    assert dataclasses.asdict(p) == {"name": "a", "size": 3, "tags": {}}
    assert dataclasses.replace(p, size=5) == replace(p, size=5) == _Part("a", 5)
    assert _Version(1, 2) < _Version(1, 10) and hash(_Version(1, 2)) == hash(_Version(1, 2))
    for bad in (lambda: _Part(), lambda: _Part("a", 1, {}, 2), lambda: _Part("a", name="b"), lambda: _Part("a", x=1)):
        with pytest.raises(TypeError):
            bad()


def test_a_record_made_often_gets_a_compiled_init_that_behaves_the_same():
    made = [_Part(str(i), size=i) for i in range(600)]
    assert _Part.__init__.__code__.co_argcount == 4                   # compiled: self + 3 fields
    assert made[599] == _Part("599", 599) and _Part("x").tags == {} and _Part("x").tags is not _Part("x").tags
    with pytest.raises(TypeError):
        _Part()


def test_records_compare_and_hash_as_dataclasses_do_whatever_their_number_of_fields():
    @record(order=True)
    class Zero:
        pass

    @record(order=True)
    class One:
        a: int

    @dataclasses.dataclass(frozen=True, order=True)
    class OneDC:
        a: int

    nan = float("nan")
    assert Zero() == Zero() and not Zero() < Zero() and hash(Zero()) == hash(Zero())
    assert One(1) == One(1) and One(1) != One(2) and One(1) < One(2) and sorted([One(3), One(1)]) == [One(1), One(3)]
    assert hash(One(1)) == hash(One(1)) and len({One(1), One(1), One(2)}) == 2
    assert One(1) != OneDC(1) and One(1).__eq__(OneDC(1)) is NotImplemented
    x = One(nan)
    assert (x == x) == (OneDC(nan) == OneDC(nan)) == (One(nan) == One(nan))   # both: tuple identity
    assert _Part("a", 3) == _Part("a", 3) and _Part("a", 3) != _Part("a", 4) and _Version(2, 1) > _Version(1, 9)


# --- plainjson --------------------------------------------------------------------------------
def _value(rnd: random.Random, depth: int = 0):
    kinds = 10 if depth < 3 else 7
    k = rnd.randrange(kinds)
    if k == 0:
        return "s\u00e9\n\"\\\x01" + str(rnd.random())
    if k == 1:
        return rnd.choice([None, True, False])
    if k == 2:
        return rnd.randrange(-10**20, 10**20)
    if k in (3, 4):
        return rnd.choice([rnd.random() * 10 ** rnd.randrange(-30, 30), float("nan"), float("inf"), -0.0])
    if k in (5, 6):
        return ""
    if k == 7:
        return [_value(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    if k == 8:
        return tuple(_value(rnd, depth + 1) for _ in range(2))
    return {f"k{rnd.randrange(50)}": _value(rnd, depth + 1) for _ in range(rnd.randrange(5))}


def test_plainjson_writes_what_json_writes():
    rnd = random.Random(36)
    for _ in range(2000):
        v = _value(rnd)
        for sort_keys in (False, True):
            assert plainjson.dumps(v, sort_keys=sort_keys) == json.dumps(v, sort_keys=sort_keys)
    assert plainjson.dumps({1: "a"}) == json.dumps({1: "a"})          # not plain: json's own answer
    with pytest.raises(TypeError):
        plainjson.dumps({"a": object()})


# --- spawn ------------------------------------------------------------------------------------
def test_spawn_runs_an_argv_with_what_subprocess_gave(tmp_path):
    status, out, err = spawn.run(["/bin/sh", "-c", "cat; echo err >&2; trap - PIPE; exit 3"],
                                 {"PATH": "/usr/bin:/bin"}, 10, input=b"x" * 300_000)
    assert (status, len(out), err) == (3, 300_000, b"err\n")
    status, out, _ = spawn.run(["/bin/sh", "-c", "read x; echo \"[$x]\"; ls /proc/self/fd"], {}, 10)
    assert status == 0 and out.split()[0] == b"[]" and set(out.split()[1:]) <= {b"0", b"1", b"2", b"3"}
    status, _, _ = spawn.run(["/bin/sh", "-c", "kill -TERM $$"], {}, 10)
    assert status == -15
    with pytest.raises(FileNotFoundError):
        spawn.run([str(tmp_path / "missing")], {}, 10)


def test_spawn_kills_the_whole_session_at_its_deadline(tmp_path):
    pidfile = tmp_path / "pid"
    with pytest.raises(spawn.Expired):
        spawn.run(["/bin/sh", "-c", f"sleep 30 & echo $! > '{pidfile}'; echo started; wait"], {}, 0.5)
    pid = int(pidfile.read_text())
    for _ in range(100):
        if not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z":
            break
        import time

        time.sleep(0.02)
    else:
        pytest.fail(f"the tool's child {pid} outlived the deadline")


def test_a_forwarded_command_goes_to_the_service_without_click_and_says_the_same(tmp_path):
    """On a login host (the config names the service) a user's command is
    forwarded before click is imported (forwarding.py); a controller's
    command is refused the same way. Answers, good and bad, are the CLI's."""
    import socket

    with socket.socket() as s:                      # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "login.toml"
    cfg.write_text(f'[inventory]\nurl = "slurm-snap://127.0.0.1:{port}"\n')
    env = {"SLURM_SNAP_CONFIG_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    for args in (["report"], ["-v", "show", "7"], ["prune", "--apply"], ["report", "--helpformat"]):
        fast = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {REPO!r}); "
                               "sys.argv[0] = 'slurm-snap'; from slurm_snap.entry import entry; entry()",
                               "--config", str(cfg), *args], capture_output=True, text=True, env=env, timeout=60)
        slow = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {REPO!r}); "
                               "sys.argv[0] = 'slurm-snap'; from slurm_snap.cli import main; sys.exit(main())",
                               "--config", str(cfg), *args], capture_output=True, text=True, env=env, timeout=60)
        assert (fast.returncode, fast.stdout, fast.stderr) == (slow.returncode, slow.stdout, slow.stderr), args
    assert fast.returncode == 0 and "RPO" in fast.stdout                   # --helpformat: answered here
    loaded = _loaded("import sys; sys.argv = ['slurm-snap', '--config', %r, 'report']\n"
                     "from slurm_snap.entry import entry\ntry:\n    entry()\nexcept SystemExit:\n    pass" % str(cfg),
                     env)
    assert not {m for m in loaded if m.split(".")[0] in ("click", "sqlalchemy")}
    assert "slurm_snap.service.server" not in loaded and "slurm_snap.cli" not in loaded
