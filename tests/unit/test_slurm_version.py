"""What differs by Slurm version is decided in slurm_snap/slurm/version.py (and,
for slurm.conf lines on the shell side, scripts/lib-slurm-version.sh): the two
agree, doctor asks for the running version's spelling, and the JSON of 22.05
and 24.11 (shapes as measured on the dev cluster) reads the same."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from slurm_snap import errors
from slurm_snap.doctor import slurm_checks
from slurm_snap.config import Config
from slurm_snap.slurm import commands, version
from slurm_snap.slurm.version import SlurmVersion

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "scripts" / "lib-slurm-version.sh"


@pytest.mark.parametrize("text, want", [
    ("slurm 24.11.5\n", SlurmVersion(24, 11, 5)), ("22.05.8", SlurmVersion(22, 5, 8)),
    ("24.11.5-4+deb13u1", SlurmVersion(24, 11, 5)), ("25.05", SlurmVersion(25, 5, 0)),
])
def test_versions_parse_from_what_slurm_and_debian_print(text, want):
    assert SlurmVersion.parse(text) == want


def test_an_unreadable_version_is_a_config_error():
    with pytest.raises(errors.ConfigError):
        SlurmVersion.parse("slurm-wlm")


@pytest.mark.parametrize("v, key, value", [
    ("22.05.8", "SlurmctldParameters", "preempt_send_user_signal"),
    ("23.02.0", "PreemptParameters", "send_user_signal"),
    ("24.11.5", "PreemptParameters", "send_user_signal"),
])
def test_the_preemption_signal_setting_moved_in_23_02(v, key, value):
    assert SlurmVersion.parse(v).preempt_signal_setting == (key, value)


@pytest.mark.parametrize("v", ["22.05", "23.02", "24.11", "25.05", "25.11", "26.05", "27.11"])
def test_shell_and_python_write_the_same_slurm_conf_lines(v):
    """The dev cluster's slurm.conf comes from the shell function; doctor
    checks with the Python rule: they must not drift apart."""
    out = subprocess.run(["bash", "-c", 'source "$0"; slurm_conf_version_lines "$1"', str(LIB), v],
                         capture_output=True, text=True, timeout=30, check=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_SNAP_SLURM": "22.05"}).stdout
    key, value = SlurmVersion.parse(v).preempt_signal_setting
    assert out.splitlines() == list(SlurmVersion.parse(v).conf_lines)
    assert out.splitlines()[0] == f"{key}={value}"
    assert ("SlurmctldParameters=enable_expedited_requeue" in out) == (v >= "25.11")


def _shell(script: str, asked: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", 'source "$0"; ' + script, str(LIB)], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin", "SLURM_SNAP_SLURM": asked, **env})


def test_shell_and_python_run_the_same_versions():
    out = _shell('echo "$SLURM_SNAP_SLURM_VERSIONS"', "22.05")
    assert tuple(out.stdout.split()) == version.TESTED


@pytest.mark.parametrize("v", version.TESTED)
def test_every_version_has_its_own_prefix_and_debians_are_pinned(v):
    out = _shell('slurm_install_paths; echo "$SLURM_BIN $SLURM_INCLUDE $SLURM_SBIN $SLURM_PLUGIN_DIR"; '
                 'debian_slurm_pin "$SLURM_SNAP_SLURM" && echo "$SLURM_DEB_VERSION|$SLURM_DEB_SUITE|$SLURM_DEB_PREFIX" '
                 '&& echo "$SLURM_DEB_SHA256"', v)
    lines = out.stdout.splitlines()
    if v == "22.05":  # Debian 12's packages
        assert lines == ["/usr/bin /usr/include /usr/sbin /usr/lib/x86_64-linux-gnu/slurm-wlm"]
        return
    if v == "25.11":  # the site's own, never installed by the scripts
        assert lines == ["/opt/slurm-25.11/bin /opt/slurm-25.11/include /opt/slurm-25.11/sbin /opt/slurm-25.11/lib/slurm"]
        return
    deb_version, suite, prefix = lines[1].split("|")
    assert deb_version.startswith(v + ".") and suite in ("trixie", "sid")
    assert lines[0] == f"{prefix}/bin {prefix}/include {prefix}/sbin {prefix}/lib/slurm"
    assert prefix.startswith(f"/opt/slurm-{v}.") and "+" not in prefix
    pins = dict(line.split("=") for line in lines[2:])
    # Every package of source slurm-wlm that is used, each by its SHA-256.
    assert {"slurmd", "slurmctld", "slurm-client", "slurm-wlm-basic-plugins", "libslurm-dev"} <= set(pins)
    assert all(len(sha) == 64 and int(sha, 16) >= 0 for sha in pins.values())


def test_the_site_prefix_of_25_11_comes_from_the_environment():
    out = _shell('slurm_install_paths; echo "$SLURM_BIN"', "25.11", SLURM_SNAP_SLURM_PREFIX="/site/slurm")
    assert out.stdout.split() == ["/site/slurm/bin"]


def test_a_missing_site_slurm_is_an_error_naming_what_to_install(tmp_path):
    r = _shell('die() { echo "$*" >&2; exit 1; }; ensure_slurm; echo reached', "25.11",
               SLURM_SNAP_SLURM_PREFIX=str(tmp_path / "none"))
    assert r.returncode == 1 and "reached" not in r.stdout
    assert f"missing {tmp_path}/none itself" in r.stderr and "install Slurm 25.11 under that prefix" in r.stderr
    assert "never build" in r.stderr


def test_a_site_prefix_of_another_series_is_refused(tmp_path):
    for f in ("sbin/slurmctld", "sbin/slurmd", "sbin/slurmstepd", "bin/sbatch", "bin/squeue", "bin/scontrol",
              "include/slurm/spank.h", "lib/slurm/auth_munge.so"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("#!/bin/sh\necho slurm 24.11.5\n")
        (tmp_path / f).chmod(0o755)
    r = _shell('die() { echo "$*" >&2; exit 1; }; ensure_slurm; echo reached', "25.11",
               SLURM_SNAP_SLURM_PREFIX=str(tmp_path))
    assert r.returncode == 1 and "says 'slurm 24.11.5', not Slurm 25.11" in r.stderr
    (tmp_path / "lib" / "slurm" / "auth_munge.so").unlink()
    r = _shell('die() { echo "$*" >&2; exit 1; }; ensure_slurm', "25.11", SLURM_SNAP_SLURM_PREFIX=str(tmp_path))
    assert r.returncode == 1 and f"missing {tmp_path}/lib/slurm/auth_munge.so." in r.stderr


def test_an_unknown_version_is_refused_naming_the_accepted_ones():
    r = _shell("echo reached", "25.05")
    assert r.returncode == 2 and "reached" not in r.stdout
    assert "SLURM_SNAP_SLURM=25.05" in r.stderr and "22.05, 24.11, 25.11, 26.05" in r.stderr


def test_expedited_requeue_and_sluid_from_25_11():
    assert SlurmVersion(24, 11).expedited_requeue is None and not SlurmVersion(25, 5).job_sluid
    assert SlurmVersion(25, 11).expedited_requeue == ("SlurmctldParameters", "enable_expedited_requeue")
    assert SlurmVersion(26, 5).job_sluid and SlurmVersion(26, 5).own_metrics
    assert SlurmVersion(25, 11, 7).series == "25.11" and SlurmVersion(22, 5).series == "22.05"


def test_prolog_epilog_timeout_split_in_25_05():
    assert SlurmVersion(24, 11).hook_timeout_keys == ("PrologEpilogTimeout",)
    assert SlurmVersion(25, 5).hook_timeout_keys == ("PrologTimeout", "EpilogTimeout")


def _signal_finding(slurm: dict[str, str]):
    found = [f for f in slurm_checks.check_slurm(Config(path="/x.toml"), slurm, [], None)
             if f.what.startswith("the user's signal is sent at preemption")]
    assert len(found) == 1
    return found[0]


def test_doctor_on_24_11_wants_preempt_parameters():
    ok = _signal_finding({"SLURM_VERSION": "24.11.5", "PreemptParameters": "send_user_signal"})
    assert ok.ok and "PreemptParameters=send_user_signal" in ok.what
    old = _signal_finding({"SLURM_VERSION": "24.11.5", "SlurmctldParameters": "preempt_send_user_signal"})
    assert not old.ok and "PreemptParameters=send_user_signal" in old.fix


def test_doctor_on_22_05_wants_slurmctld_parameters():
    ok = _signal_finding({"SLURM_VERSION": "22.05.8", "SlurmctldParameters": "enable_configless,preempt_send_user_signal"})
    assert ok.ok
    new = _signal_finding({"SLURM_VERSION": "22.05.8", "PreemptParameters": "send_user_signal"})
    assert not new.ok and "SlurmctldParameters=preempt_send_user_signal" in new.fix


def test_doctor_checks_the_split_hook_timeouts_on_25_05():
    cfg = Config(path="/x.toml")
    whats = [f.what for f in slurm_checks.check_slurm(cfg, {"SLURM_VERSION": "25.05.0", "PrologTimeout": "5",
                                                      "EpilogTimeout": "10", "PrologEpilogTimeout": "500"}, [], None)
             if "hook budget" in f.what]
    assert any("PrologTimeout 5 s" in w for w in whats) and any("EpilogTimeout 10 s" in w for w in whats)
    assert not any("PrologEpilogTimeout" in w for w in whats)


# One job as squeue --json prints it, trimmed to the keys slurm-snap reads.
JOB_2205 = {"job_id": 7, "user_name": "alice", "user_id": 1000, "job_state": "COMPLETING", "restart_cnt": 1,
            "preempt_time": 1764680000, "nodes": "n[1-3]", "partition": "low", "batch_host": "n1"}
JOB_2411 = {"job_id": 7, "user_name": "alice", "user_id": 1000, "job_state": ["PENDING", "COMPLETING"],
            "restart_cnt": 1, "preempt_time": {"set": True, "infinite": False, "number": 1764680000},
            "nodes": "n[1-3]", "partition": "low", "batch_host": "n1"}


@pytest.mark.parametrize("job", [JOB_2205, JOB_2411], ids=["22.05", "24.11"])
def test_a_preempted_jobs_record_reads_the_same_from_both_versions(job):
    info = commands.job_from_json(json.dumps({"jobs": [job]}), 7)
    assert (info.state, info.restart_count, info.preempt_time) == ("COMPLETING", 1, 1764680000)


def test_states_read_with_2205s_meaning():
    assert version.json_state(["RUNNING"]) == "RUNNING" and version.json_state("COMPLETING") == "COMPLETING"
    assert version.json_state(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert version.json_state([]) == ""


def test_unset_and_infinite_numbers_are_zero():
    assert version.json_number({"set": False, "infinite": False, "number": 99}) == 0
    assert version.json_number({"set": True, "infinite": True, "number": 0}) == 0
    assert version.json_number(None) == 0 and version.json_number(3) == 3


FAKE = """#!/bin/sh
echo "$*" >>{log}
echo '{json}'
"""


@pytest.mark.parametrize("job", [JOB_2205, JOB_2411], ids=["22.05", "24.11"])
def test_a_hooks_squeue_names_the_job_and_still_picks_it_out(tmp_path, monkeypatch, job):
    """24.11 honours -j with --json; 22.05 ignores it and prints every job."""
    log = tmp_path / "argv"
    squeue = tmp_path / "squeue"
    squeue.write_text(FAKE.format(log=log, json=json.dumps({"jobs": [job, {**job, "job_id": 8}]})))
    squeue.chmod(0o755)
    monkeypatch.setenv("SLURM_SNAP_SQUEUE", str(squeue))
    assert commands.squeue_job(8).job_id == 8
    assert log.read_text().splitlines() == ["--json -j 8"]
    with pytest.raises(errors.NotFound):
        commands.squeue_job(9)


def test_bin_dir_comes_before_the_system_directories(tmp_path, monkeypatch):
    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.delenv("SLURM_SNAP_SLURM_BIN", raising=False)
    commands.adopt_bin_dir(str(tmp_path))
    assert commands.tool("scontrol") == str(fake)
    commands.adopt_bin_dir("/elsewhere")  # the environment's choice stays
    assert commands.tool("scontrol") == str(fake)


def test_doctor_finds_the_hooks_in_24_11s_indexed_lines():
    """24.11's `scontrol show config` prints Prolog[0] = ... (several scripts per hook)."""
    cfg = Config(path="/x.toml")
    slurm = {"SLURM_VERSION": "24.11.5", "Prolog[0]": "/site/other-prolog", "Prolog[1]": "/x/slurm-snap-prolog",
             "Epilog[0]": "/x/slurm-snap-epilog", "PrologSlurmctld[0]": "/x/slurm-snap-prolog-slurmctld"}
    found = {f.what: f.ok for f in slurm_checks.check_slurm(cfg, slurm, [], None) if " runs slurm-snap" in f.what}
    assert found == {"Prolog runs slurm-snap-prolog": True, "Epilog runs slurm-snap-epilog": True,
                     "PrologSlurmctld runs slurm-snap-prolog-slurmctld": True,
                     "EpilogSlurmctld runs slurm-snap-epilog-slurmctld": False}


def test_validate_options_hands_the_ranks_bin_dir_only_when_configured(tmp_path, capsys):
    from slurm_snap.cli import main

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nbarrier_dir = "{tmp_path}/b"\n')
    assert main(["--config", str(cfg), "hook", "validate-options"]) == 0
    assert "SLURM_SNAP_SLURM_BIN" not in capsys.readouterr().out
    cfg.write_text(f'[paths]\nbarrier_dir = "{tmp_path}/b"\n[slurm]\nbin_dir = "/opt/slurm-24.11/bin"\n')
    assert main(["--config", str(cfg), "hook", "validate-options"]) == 0
    assert "SLURM_SNAP_SLURM_BIN=/opt/slurm-24.11/bin" in capsys.readouterr().out.splitlines()


def test_a_relative_bin_dir_is_refused(tmp_path):
    from slurm_snap.config import load

    cfg = tmp_path / "c.toml"
    cfg.write_text('[slurm]\nbin_dir = "opt/bin"\n')
    with pytest.raises(errors.ConfigError, match="slurm.bin_dir"):
        load(str(cfg))


def test_rank_zeros_scontrol_comes_from_the_jobs_bin_dir(tmp_path, monkeypatch):
    from slurm_snap.client import early

    fake = tmp_path / "scontrol"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SLURM_SNAP_SLURM_BIN", str(tmp_path))
    assert early.scontrol() == str(fake)


def _choose(state: Path, asked: str) -> subprocess.CompletedProcess:
    script = ('log() { :; }; die() { echo "$*" >&2; exit 1; }; STATE=$1; source "$0"; choose_slurm; '
              'echo "$SLURM_SNAP_SLURM $SLURM_BIN"')
    return subprocess.run(["bash", "-c", script, str(LIB), str(state)], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **({"SLURM_SNAP_SLURM": asked} if asked else {})})


def test_a_state_dir_keeps_the_slurm_it_was_brought_up_with(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm-version").write_text("24.11\n")
    (tmp_path / "etc" / "slurm-prefix").write_text("/opt/slurm-24.11.5-4_deb13u0\n")  # an older pin's
    assert _choose(tmp_path, "").stdout.split() == ["24.11", "/opt/slurm-24.11.5-4_deb13u0/bin"]
    assert _choose(tmp_path, "24.11").returncode == 0
    refused = _choose(tmp_path, "22.05")
    assert refused.returncode == 1 and "brought up with SLURM_SNAP_SLURM=24.11" in refused.stderr
    assert _choose(tmp_path / "fresh", "").stdout.split() == ["22.05", "/usr/bin"]
