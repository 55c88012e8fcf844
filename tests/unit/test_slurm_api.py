"""slurm/api.py chooses pyslurm or Slurm's commands once, by version, before
anything imports pyslurm; doctor says which and what a preemption's requeue
costs on the running version."""
from __future__ import annotations

import sys

import pytest

from slurm_snap.doctor import slurm_checks as doctor
from slurm_snap.slurm import api, clifilter
from slurm_snap.slurm.version import SlurmVersion

REPO_LUA = __import__("pathlib").Path(__file__).resolve().parents[2] / "etc" / "cli_filter.lua"


def test_a_matching_pyslurm_is_chosen(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    c = api.choose("25.11", "25.11.2", conf=str(conf))
    assert c.name == "pyslurm" and not c.refused and "25.11.2" in c.why


@pytest.mark.parametrize("slurm", ["26.05", "24.11", "22.05"])
def test_a_pyslurm_of_another_series_is_refused_by_name_with_what_to_install(slurm):
    c = api.choose(slurm, "25.11.2")
    assert c.name == "commands"
    assert "pyslurm 25.11.2 refused" in c.refused and f"pyslurm=={slurm}.*" in c.refused


def test_no_pyslurm_unknown_version_missing_conf_or_forced_mean_the_commands(tmp_path):
    assert api.choose("25.11", None) == api.Choice("commands", "pyslurm is not installed")
    assert api.choose(None, "25.11.2").refused.startswith("pyslurm 25.11.2 not used")
    missing = api.choose("25.11", "25.11.2", conf=str(tmp_path / "nope.conf"))
    assert missing.name == "commands" and "slurm.conf" in missing.refused
    assert api.choose("25.11", "25.11.2", force="commands").name == "commands"


def test_the_epilogs_lookup_goes_through_the_commands_even_where_pyslurm_matches(monkeypatch, tmp_path):
    """A hook asks once in a process of its own: pyslurm's import would cost
    more than the fork it saves (docs/benchmarks.md, row 13)."""
    from slurm_snap.config import Config
    from slurm_snap.hooks import jobhooks
    from slurm_snap.slurm import commands
    from slurm_snap.slurm.commands import JobInfo
    from slurm_snap.slurm.jobenv import JobEnv

    monkeypatch.setattr(api, "probe", lambda: api.Choice("pyslurm", "pyslurm 25.11.2 matches Slurm 25.11"))
    monkeypatch.setattr(api, "_IFACE", None)
    monkeypatch.setattr(api, "Pyslurm", lambda: pytest.fail("a hook imported pyslurm"))
    asked = []
    monkeypatch.setattr(commands, "squeue_job", lambda job_id, timeout: asked.append(job_id) or JobInfo(
        job_id=job_id, user="alice", uid=1000, state="COMPLETING", restart_count=0, preempt_time=1000,
        nodes="n1", partition="low", batch_host="n1"))
    job = JobEnv(job_id=7, restart_count=0, uid=1000, gid=1000, user="alice", partition="low", nodes=("n1",),
                 node="n1", opted_in=True, on_preempt=True, volumes=(), consistency="app", resume_cmd="")
    cfg = Config(path=str(tmp_path / "c.toml"))
    stop = jobhooks._why_stopped(cfg, job)
    assert (stop.trigger, stop.ended) == ("preempt", 1000) and asked == [7]
    assert isinstance(api.for_hook(), api.Commands)


def test_a_refused_pyslurm_is_never_imported(monkeypatch, tmp_path):
    """The probe reads the header and the package metadata only."""
    bin_dir = tmp_path / "bin"
    (tmp_path / "include" / "slurm").mkdir(parents=True)
    bin_dir.mkdir()
    (tmp_path / "include" / "slurm" / "slurm_version.h").write_text("#define SLURM_VERSION_NUMBER 0x1a0503\n")
    assert api.installed_series(str(bin_dir)) == "26.05"
    (tmp_path / "include" / "slurm" / "slurm_version.h").write_text("#define SLURM_VERSION_NUMBER 0x160508\n")
    assert api.installed_series(str(bin_dir)) == "22.05"
    assert api.installed_series(str(tmp_path / "elsewhere" / "bin")) is None
    monkeypatch.setattr(api, "installed_series", lambda: "26.05")
    monkeypatch.setattr(api, "pyslurm_version", lambda: "25.11.2")
    monkeypatch.setattr(api, "_IFACE", None)
    monkeypatch.delenv("SLURM_SNAP_SLURM_API", raising=False)
    before = "pyslurm" in sys.modules
    assert isinstance(api.interface(), api.Commands) and "refused" in api.chosen().refused
    assert ("pyslurm" in sys.modules) == before


@pytest.mark.parametrize("complete, sinfo", [
    ("IDLE", "idle"), ("MIXED", "mixed"), ("IDLE+DRAIN", "drained"), ("ALLOCATED+DRAIN", "draining"),
    ("DOWN+NOT_RESPONDING", "down*"), ("DOWN+DRAIN", "down"), ("IDLE+COMPLETING", "completing"),
    ("IDLE+FAIL", "fail"), ("ALLOCATED+FAIL", "failing"), ("IDLE+NOT_RESPONDING", "idle*"),
])
def test_libslurms_node_states_read_as_sinfo_prints_them(complete, sinfo):
    assert api.sinfo_state(complete) == sinfo


def test_doctor_reports_what_cred_expire_costs_before_25_11():
    f, = doctor.check_requeue({"SLURM_VERSION": "24.11.5", "AuthInfo": "cred_expire=5"}, None)
    assert f.ok and "waits 5 s" in f.what and "every preemption costs its job 5 s" in f.what
    f, = doctor.check_requeue({"SLURM_VERSION": "22.05.8"}, None)
    assert "waits 120 s" in f.what


def test_doctor_wants_expedited_requeue_on_25_11_and_the_cli_filter_asking_for_it():
    off, = doctor.check_requeue({"SLURM_VERSION": "25.11.7", "SchedulerParameters": "requeue_delay=30"}, False)
    assert not off.ok and "otherwise 30 s" in off.what and "enable_expedited_requeue" in off.fix
    on = doctor.check_requeue({"SLURM_VERSION": "26.05.3", "SlurmctldParameters": "enable_expedited_requeue"}, False)
    assert [f.ok for f in on] == [True, False] and "--expedite" in on[1].fix


def test_doctor_names_the_slurm_api_and_a_controller_of_another_version():
    ok = doctor.check_slurm_api(api.Choice("pyslurm", "pyslurm 25.11.2 matches Slurm 25.11"), SlurmVersion(25, 11, 7))
    assert ok.ok and "pyslurm" in ok.what
    skew = doctor.check_slurm_api(api.Choice("pyslurm", "pyslurm 25.11.2 matches Slurm 25.11"), SlurmVersion(26, 5))
    assert not skew.ok and "pyslurm==26.05.*" in skew.fix
    refused = doctor.check_slurm_api(api.choose("26.05", "25.11.2"), SlurmVersion(26, 5))
    assert refused.ok and refused.warning and "pyslurm 25.11.2 refused" in refused.fix
    assert "pyslurm==26.05.*" in refused.fix and "Slurm's commands" in refused.what


def test_a_refused_pyslurm_is_a_warning_not_a_problem_in_doctors_output(capsys):
    """The commands serve where pyslurm is refused: doctor says WARN with what
    to install, and exits 0 when nothing else is wrong."""
    from slurm_snap.cli import doctor_cmd
    from slurm_snap.doctor.finding import Finding

    refused = doctor.check_slurm_api(api.choose("24.11", "25.11.2"), SlurmVersion(24, 11, 5))
    doctor_cmd._print([Finding(True, "something fine"), refused], as_json=False)
    out = capsys.readouterr().out
    assert "WARN  Slurm API: Slurm's commands (pyslurm 25.11.2 is for Slurm 25.11, Slurm 24.11 runs)" in out
    assert "why: pyslurm 25.11.2 refused: built for Slurm 25.11, this Slurm is 24.11; install pyslurm==24.11.*" in out
    assert out.rstrip().endswith("1 ok, 1 warning(s), 0 problem(s)") and "FAIL" not in out
    doctor_cmd._print([refused], as_json=True)
    got = __import__("json").loads(capsys.readouterr().out)
    assert got["ok"] and got["problems"] == 0 and got["findings"][0]["warning"] is True


def test_a_matching_pyslurm_that_does_not_load_leaves_the_commands_in_charge(monkeypatch):
    """Metadata says 25.11, but the extension does not load against this
    libslurm: the process asks through the commands, and says why."""
    monkeypatch.setattr(api, "probe", lambda: api.Choice("pyslurm", "pyslurm 25.11.2 matches Slurm 25.11"))
    monkeypatch.setattr(api, "_IFACE", None)

    def broken():
        raise ImportError("libslurm.so.43: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(api, "Pyslurm", broken)
    assert isinstance(api.interface(), api.Commands)
    c = api.chosen()
    assert c.name == "commands" and "libslurm.so.43" in c.why
    assert c.refused.startswith("pyslurm refused") and "pyslurm==25.11.*" in c.refused
    f = doctor.check_slurm_api(c, SlurmVersion(25, 11, 7))
    assert f.ok and f.warning


def test_the_cli_filter_asks_for_expedite_only_when_told():
    from slurm_snap.config import Config

    template = REPO_LUA.read_text()
    assert not clifilter.expedites(clifilter.render(template, Config(path="/x.toml")))
    assert clifilter.expedites(clifilter.render(template, Config(path="/x.toml"), expedite=True))
