"""The SPANK plugin inside real sbatch: options listed, bad values rejected at
submit time with a message naming the value, values handed to the job.

Valid submissions use --hold so no job runs; they are cancelled right away.
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cluster import unavailable
from testkit.cluster import REPO, Cluster, user_ids

pytestmark = pytest.mark.integration

OPTIONS = ("--snapshot-on-preempt", "--snapshot-volumes=", "--snapshot-consistency=", "--snapshot-resume-cmd=")


def submit(cluster: Cluster, *args: str, user: str | None = None):
    """sbatch --hold ARGS as the test user; cancels the job if one was created."""
    proc = cluster.sbatch_raw(["--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "true"],
                              user=user or cluster.user)
    if proc.returncode == 0:
        cluster.cancel(int(proc.stdout.strip().split(";")[0]))
    return proc


def assert_rejected(proc, *needles: str) -> None:
    assert proc.returncode != 0, f"sbatch accepted it: {proc.stdout}"
    assert "slurm-snap:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not named in: {proc.stderr}"


def test_sbatch_help_lists_the_options(cluster):
    proc = cluster.run(["sbatch", "--help"], user=cluster.user)
    assert proc.returncode == 0, proc.stderr
    for option in OPTIONS:
        assert option in proc.stdout, f"{option} missing from sbatch --help"


def test_valid_options_are_accepted(cluster):
    proc = submit(cluster, "--snapshot-on-preempt", "--snapshot-volumes=pfs,scratch", "--snapshot-consistency=crash")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("value, named", [
    ("relative/dir", "relative/dir"),
    ("nosuchclass", "nosuchclass"),
    ("/etc", "/etc"),
])
def test_bad_volume_is_named(cluster, value, named):
    assert_rejected(submit(cluster, f"--snapshot-volumes={value}"), named)


def test_dotdot_is_rejected(cluster):
    value = f"{cluster.user_dir()}/../{cluster.other_user}"
    assert_rejected(submit(cluster, f"--snapshot-volumes={value}"), value)


def test_empty_list_is_rejected(cluster):
    assert_rejected(submit(cluster, "--snapshot-volumes="), "--snapshot-volumes", "empty")


def test_empty_item_is_rejected(cluster):
    assert_rejected(submit(cluster, "--snapshot-volumes=pfs,,scratch"), "pfs,,scratch")


def test_control_character_is_rejected(cluster):
    assert_rejected(submit(cluster, "--snapshot-volumes=pfs\x01"), "control character")


def test_bad_consistency_is_named(cluster):
    assert_rejected(submit(cluster, "--snapshot-consistency=maybe"), "maybe")


def test_symlink_escaping_the_roots_is_rejected(cluster):
    link = cluster.user_dir() / "escape"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink("/etc", link)
    os.lchown(link, *user_ids(cluster.user))
    assert_rejected(submit(cluster, f"--snapshot-volumes={link}"), str(link))


def test_other_users_directory_is_rejected(cluster):
    value = str(cluster.user_dir(user=cluster.other_user))
    assert_rejected(submit(cluster, f"--snapshot-volumes={value}"), value)


# --- the plugin's own behaviour, independent of the helper's rules ------------

@pytest.fixture
def conf_with_helper(cluster):
    """A copy of the cluster's client config whose plugstack names another helper."""
    made = []

    def _make(helper: str) -> str:
        d = Path(cluster.state) / f"conf-{time.monotonic_ns()}"
        d.mkdir(mode=0o755)
        made.append(d)
        etc = Path(cluster.slurm_conf).parent
        shutil.copy(etc / "cli_filter.lua", d / "cli_filter.lua")
        plugstack = re.sub(r"helper=\S+", f"helper={helper}", (etc / "plugstack.conf").read_text())
        (d / "plugstack.conf").write_text(plugstack)
        conf = re.sub(r"^PlugStackConfig=.*$", f"PlugStackConfig={d}/plugstack.conf",
                      Path(cluster.slurm_conf).read_text(), flags=re.M)
        (d / "slurm.conf").write_text(conf)
        for f in d.iterdir():
            f.chmod(0o644)
        return str(d / "slurm.conf")

    yield _make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def submit_with_conf(cluster: Cluster, conf: str, *args: str):
    """sbatch on login as the test user with another slurm.conf (hence another plugstack)."""
    proc = cluster.sbatch_raw(["--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "true"],
                              user=cluster.user, env={"SLURM_CONF": conf})
    if proc.returncode == 0:
        cluster.cancel(int(proc.stdout.strip().split(";")[0]))
    return proc


def test_missing_helper_is_named(cluster, conf_with_helper):
    conf = conf_with_helper("/nonexistent/bin/slurm-snap")
    assert_rejected(submit_with_conf(cluster, conf, "--snapshot-volumes=pfs"), "/nonexistent/bin/slurm-snap")


def test_jobs_without_options_never_run_the_helper(cluster, conf_with_helper):
    conf = conf_with_helper("/nonexistent/bin/slurm-snap")
    proc = submit_with_conf(cluster, conf)
    assert proc.returncode == 0, proc.stderr


def test_helper_failure_fails_the_submission(cluster, conf_with_helper):
    # /bin/false stands for a helper that rejects everything without a word.
    conf = conf_with_helper("/bin/false")
    assert_rejected(submit_with_conf(cluster, conf, "--snapshot-volumes=pfs"), "exited with 1")


def test_values_reach_the_job_environment(cluster):
    out = cluster.make_user_dir(f"env-{time.monotonic_ns()}")
    job_id = cluster.sbatch("-N2", "-o", "/dev/null", "--snapshot-volumes=pfs", "--snapshot-consistency=crash",
                            "--wrap", f"env > {out}/env.batch; srun -l env > {out}/env.tasks")
    cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    env = dict(line.split("=", 1) for line in (out / "env.batch").read_text().splitlines() if "=" in line)
    # Job-control variables arrive with Slurm's prefix, and the plugin's
    # user_init copies them under their own names for the rank-side client.
    assert env.get("SLURM_SPANK_SLURM_SNAP") == "1"
    assert env.get("SLURM_SPANK_SLURM_SNAP_VOLUMES") == "pfs"
    assert env.get("SLURM_SNAP_VOLUMES") == "pfs"
    assert env.get("SLURM_SNAP_CONSISTENCY") == "crash"
    # What the helper's validate-options printed (barrier dir) reaches every task.
    barrier = str(cluster.pfs / ".slurm-snap" / "barriers")
    tasks = (out / "env.tasks").read_text().splitlines()
    ranks = [m.group(1) for m in (re.match(r"^(\d+): SLURM_SNAP_BARRIER_DIR=(.*)$", line) for line in tasks)
             if m and m.group(2) == barrier]
    assert sorted(ranks) == ["0", "1"]
    assert not any("SLURM_SNAP_INDEPENDENT" in line for line in tasks)


def test_independent_ranks_option_reaches_every_rank(cluster):
    """--snapshot-independent-ranks: every task sees SLURM_SNAP_INDEPENDENT=1,
    which the client puts into its acknowledgements; `sbatch --help` lists it."""
    out = cluster.make_user_dir(f"indep-{time.monotonic_ns()}")
    job_id = cluster.sbatch("-N2", "-o", "/dev/null", "--snapshot-volumes=pfs", "--snapshot-independent-ranks",
                            "--wrap", f"srun -l env > {out}/env.tasks")
    cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    tasks = (out / "env.tasks").read_text().splitlines()
    assert sorted(line.split(":")[0] for line in tasks if line.endswith(" SLURM_SNAP_INDEPENDENT=1")) == ["0", "1"]
    helped = cluster.run(["sbatch", "--help"], user=cluster.user, timeout=30)
    assert "--snapshot-independent-ranks" in helped.stdout, helped.stdout[-2000:]


def test_steps_inside_the_job_do_not_rerun_the_check(cluster, conf_with_helper):
    """srun in an opted-in job inherits the options; only the submission checks them."""
    out = cluster.make_user_dir(f"steps-{time.monotonic_ns()}")
    counter = cluster.write_user_file(f"{out.name}/count-helper",
                                      f"#!/bin/sh\necho \"$*\" >> {out}/calls\nexit 0\n", mode=0o755)
    conf = conf_with_helper(str(counter))
    proc = cluster.sbatch_raw(["--parsable", "-o", f"{out}/slurm.out", "--snapshot-volumes=pfs",
                               "--wrap", f"srun /bin/true && srun /bin/true && touch {out}/steps-ran"],
                              user=cluster.user, cwd=out, env={"SLURM_CONF": conf})
    assert proc.returncode == 0, proc.stderr
    cluster.wait_state(int(proc.stdout.strip().split(";")[0]), {"COMPLETED", "FAILED", "CANCELLED"}, timeout=60)
    assert (out / "steps-ran").exists(), (out / "slurm.out").read_text() if (out / "slurm.out").exists() else ""
    calls = (out / "calls").read_text().splitlines()
    assert len(calls) == 1, calls
    assert "hook validate-options --volumes pfs --consistency app" in calls[0]


# --- cli_filter.lua logic, run by a Lua interpreter (the live path is in test_cluster.py) ---

LUA_DRIVER = """
slurm = {SUCCESS = 0}
dofile(arg[1])
local opts = {type = arg[2], signal = arg[3], spank = {["slurm-snap"] = {["snapshot-on-preempt"] = arg[4]}}}
assert(slurm_cli_pre_submit(opts, 0) == slurm.SUCCESS)
io.write(opts.signal)
"""


@pytest.mark.parametrize("kind, signal, flag, inside_job, expected", [
    ("sbatch", "0@0", "set", False, "USR1@60"),        # only --snapshot-on-preempt: signal added
    ("sbatch", "B:USR2@30", "set", False, "B:USR2@30"),  # the user's own --signal wins
    ("sbatch", "0@0", "unset", False, "0@0"),          # not opted in: untouched
    ("salloc", "0@0", "set", False, "USR1@60"),
    ("srun", "0@0", "set", True, "0@0"),               # a step inside the job: the job has its signal
    ("srun", "0@0", "set", False, "USR1@60"),          # srun creating its own allocation
])
def test_cli_filter_sets_the_signal_only_when_needed(kind, signal, flag, inside_job, expected):
    proc = _lua(LUA_DRIVER, kind, signal, flag, env={"SLURM_JOB_ID": "5"} if inside_job else {})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected


def _lua(driver: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    lua = shutil.which("lua5.3") or shutil.which("lua5.1") or shutil.which("lua")
    if lua is None:
        unavailable("no lua interpreter (scripts/dev-cluster up installs lua5.3)")
    return subprocess.run([lua, "-", str(REPO / "etc" / "cli_filter.lua"), *args], input=driver,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, capture_output=True, text=True, timeout=10)


TIMELIMIT_DRIVER = """
slurm = {SUCCESS = 0}
dofile(arg[1])
local opts = {type = "sbatch", signal = arg[2], spank = {["slurm-snap"] = {
    ["snapshot-on-preempt"] = arg[3], ["snapshot-before-timelimit"] = arg[4]}}}
assert(slurm_cli_pre_submit(opts, 0) == slurm.SUCCESS)
io.write(opts.signal)
"""


@pytest.mark.parametrize("signal, preempt, margin, expected, warned", [
    ("0@0", "unset", "90s", "USR1@90", False),           # the margin is the signal's time
    ("0@0", "set", "5m", "USR1@300", False),             # with preemption too: it signals at once anyway
    ("0@0", "unset", "unset", "0@0", False),             # neither option: untouched
    ("USR1@200", "unset", "2m", "USR1@200", False),      # the user's own --signal wins
    ("B:USR1@60", "set", "unset", "B:USR1@60", True),    # ... but B: reaches no rank: said at submit
    ("B:USR1@60", "unset", "2m", "B:USR1@60", True),
    ("RB:USR1@60", "unset", "2m", "RB:USR1@60", True),
    ("B:USR1@60", "unset", "unset", "B:USR1@60", False),  # not opted in: none of our business
])
def test_cli_filter_signals_the_margin_before_the_time_limit_and_warns_of_B(signal, preempt, margin, expected,
                                                                            warned):
    proc = _lua(TIMELIMIT_DRIVER, signal, preempt, margin)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected
    assert ("signals only the batch shell" in proc.stderr) == warned, proc.stderr


def test_cli_filter_reads_a_margin_as_the_helper_does():
    """One grammar (slurm/duration.py), read twice: strictly by the helper,
    which refuses a bad value, and by cli_filter.lua for the signal's time."""
    from slurm_snap.errors import BadValueError
    from slurm_snap.slurm.duration import parse_duration

    forms = ["90s", "5m", "5min", "1h30m", "2h", "1d", "01:30", "1:02:03", "1-02:03:04",
             "abc", "5x", "m5", ""]
    driver = "dofile(arg[1])\nfor i = 2, #arg do io.write(tostring(slurm_snap_seconds(arg[i])), '\\n') end\n"
    proc = _lua(driver, *forms)
    assert proc.returncode == 0, proc.stderr
    got = proc.stdout.splitlines()
    for form, lua in zip(forms, got):
        try:
            want = str(int(parse_duration(form).total_seconds()))
        except BadValueError:
            want = "nil"
        assert lua == want, (form, lua, want)


# --- issue 21: what sbatch checks, what the Prolog refuses, and who is told ----

def _finished(cluster, job_id: int, timeout: float = 90):
    cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=timeout)


def _btrfs_subvolume(cluster, path: Path) -> None:
    """As the user on login, as the README tells them (btrfs lets a user make one)."""
    proc = cluster.run(["/usr/bin/btrfs", "subvolume", "create", str(path)], user=cluster.user)
    assert proc.returncode == 0, proc.stderr


def test_a_plain_directory_on_pfs_is_refused_at_submit_with_what_to_do(cluster):
    """Item 4: the pfs is visible from the submit host, so a directory btrfs
    cannot snapshot alone fails sbatch, instead of every set failing later."""
    plain = cluster.make_user_dir(f"plain-{time.monotonic_ns()}")
    proc = submit(cluster, "--snapshot-on-preempt", f"--snapshot-volumes={plain}")
    assert_rejected(proc, str(plain), "not a btrfs subvolume", f"btrfs subvolume create {plain}",
                    "or declare the class 'pfs'")
    vol = cluster.user_dir() / f"vol-{time.monotonic_ns()}"
    _btrfs_subvolume(cluster, vol)
    assert submit(cluster, "--snapshot-on-preempt", f"--snapshot-volumes={vol}").returncode == 0


def _readme_user_guide() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("## User's guide", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines()
            if line.startswith(("sbatch ", "btrfs "))]


def test_the_readmes_sbatch_examples_work_on_the_dev_cluster(cluster):
    """Item 4: the user's guide shows only submissions this cluster accepts."""
    lines = _readme_user_guide()
    assert sum(line.startswith("sbatch ") for line in lines) >= 2, lines
    run7 = f"run7-{time.monotonic_ns()}"
    for line in lines:
        # Split as the user's shell would (the guide quotes a resume command).
        argv = shlex.split(line.replace("$PFS", str(cluster.pfs)).replace("$USER", cluster.user).replace("run7", run7))
        if argv[0] == "btrfs":
            _btrfs_subvolume(cluster, Path(argv[-1]))
            continue
        assert argv[0] == "sbatch" and argv[-1] == "job.sh", line
        proc = submit(cluster, *argv[1:-1])
        assert proc.returncode == 0, (line, proc.stderr)


def test_sbatch_help_is_what_etc_readme_shows(cluster):
    """--help and the admin guide say the same about every option."""
    proc = cluster.run(["sbatch", "--help"], user=cluster.user)
    shown = (REPO / "etc" / "README.md").read_text().split("`sbatch --help` then shows:", 1)[1]
    shown = shown.split("```", 2)[1]
    norm = lambda t: " ".join(t.split())  # noqa: E731  (sbatch wraps at its own width)
    assert norm(shown) in norm(proc.stdout), proc.stdout


@contextlib.contextmanager
def _prolog_on_n2_first(cluster, line: str):
    """Every node of the dev cluster runs one Prolog script file; for the
    duration, `line` runs first in it on n2 only (slurmd execs the file anew
    for each job, and the swap is a rename)."""
    script = cluster.state / "libexec" / "slurm-snap-prolog"
    original = script.read_text()
    assert original.startswith("#!/bin/sh\n"), original[:40]
    first, rest = original.split("\n", 1)
    tmp = script.with_name(script.name + ".test")
    tmp.write_text(f'{first}\n[ "$SLURMD_NODENAME" = n2 ] && {{ {line}; }}\n{rest}')
    tmp.chmod(0o755)
    os.rename(tmp, script)
    try:
        yield
    finally:
        tmp.write_text(original)
        tmp.chmod(0o755)
        os.rename(tmp, script)


def _refused_on_n2(cluster):
    """A declared path that is a volume on n1 and a link to /etc on n2."""
    name = f"vol-{time.monotonic_ns()}"
    path = f"{cluster.scratch}/users/{cluster.user}/{name}"
    uid, gid = user_ids(cluster.user)
    n1 = cluster.disk("n1") / "users" / cluster.user / name
    subprocess.run(["/usr/bin/btrfs", "subvolume", "create", str(n1)], check=True, capture_output=True)
    os.chown(n1, uid, gid)
    n2 = cluster.disk("n2") / "users" / cluster.user / name
    os.symlink("/etc", n2)
    os.lchown(n2, uid, gid)
    return path


def test_a_late_prolog_on_another_node_is_still_told_in_the_batch_output(cluster):
    """Slurm 22.05 starts the batch script once the batch host's Prolog is
    done, not every node's: n2's Prolog, 3 s late here, refuses the path; the
    batch step on n1 waits for its word and prints it (CI once lost this
    race with no delay at all)."""
    path = _refused_on_n2(cluster)
    out = cluster.make_user_dir(f"late-{time.monotonic_ns()}")
    with _prolog_on_n2_first(cluster, "sleep 3"):
        job = cluster.sbatch("-N2", "-w", "n1,n2", "-o", f"{out}/%j.out", "--snapshot-on-preempt",
                             f"--snapshot-volumes=pfs,{path}", "--wrap", "echo batch-ran")
        _finished(cluster, job)
    text = (out / f"{job}.out").read_text()
    notice = f"slurm-snap: prolog on n2 refused --snapshot-volumes {path}: {path} is a symlink"
    assert text.count(notice) == 1 and text.index(notice) < text.index("batch-ran"), text
    assert "had not finished" not in text, text


def test_a_node_whose_prolog_left_no_word_is_counted_after_the_bound(cluster):
    """n2's slurm-snap Prolog never runs (its script exits first): the batch
    step waits its bound (15 s) and says one node did not report, instead of
    waiting forever or saying nothing; the job still runs."""
    out = cluster.make_user_dir(f"silent-{time.monotonic_ns()}")
    with _prolog_on_n2_first(cluster, "exit 0"):
        job = cluster.sbatch("-N2", "-w", "n1,n2", "-o", f"{out}/%j.out", "--snapshot-on-preempt",
                             "--snapshot-volumes=pfs", "--wrap", "echo batch-ran")
        _finished(cluster, job)
    text = (out / f"{job}.out").read_text()
    assert (f"slurm-snap: 1 of 2 nodes' Prologs had not finished after 15 s; what they found is in "
            f"`slurm-snap show {job}`") in text and "batch-ran" in text, text


def test_a_prolog_refusal_is_told_in_the_jobs_output_in_report_and_in_show(cluster):
    """Item 3: a node-local path the submit host cannot see is a link to /etc on
    n2 only (a volume on n1). sbatch accepts it; n2's Prolog refuses it; the
    job runs, and its output (batch step and srun step), `report` and `show`
    say so, through the user's own commands on login."""
    path = _refused_on_n2(cluster)
    out = cluster.make_user_dir(f"refused-{time.monotonic_ns()}")
    job = cluster.sbatch("-N2", "-w", "n1,n2", "-o", f"{out}/%j.out", "--snapshot-on-preempt",
                         f"--snapshot-volumes=pfs,{path}", "--wrap", "echo batch-ran; srun -N2 -n2 /bin/true")
    _finished(cluster, job)
    text = (out / f"{job}.out").read_text()
    notice = f"slurm-snap: prolog on n2 refused --snapshot-volumes {path}: {path} is a symlink"
    # once from the batch script (task 0 of the batch step), once from the srun step's task 0
    assert text.count(notice) == 2 and "batch-ran" in text, text
    assert "prolog on n1" not in text
    assert not (cluster.disk("n2") / "jobs").exists() or str(job) not in os.listdir(cluster.disk("n2") / "jobs")
    # report (as the user, on login, through the service): not silently absent
    rep = cluster.cli("report", "-j", str(job), "-P", "-n", "-o", "JobID,SetID,State,Volumes,Reason",
                      host="login", user=cluster.user)
    assert rep.returncode == 0, rep.stderr
    jid, set_id, state, volumes, reason = rep.stdout.strip().split("|")
    assert (jid, set_id, state, volumes) == (str(job), "", "UNPROTECTED", "0/3")
    assert reason.startswith(f"prolog refused 1 of 3 volumes: n2 {path}: ") and "symlink" in reason
    shown = cluster.cli("show", str(job), host="login", user=cluster.user)
    assert shown.returncode == 0, shown.stderr
    assert f"Job {job} (user {cluster.user}" in shown.stdout and "no snapshot set" in shown.stdout
    assert "UNPROTECTED: the Prolog refused 1 of 3 declared volumes" in shown.stdout
    assert f"n2         {path}: {path} is a symlink" in shown.stdout
    # the other user may not look (exit 4), on login too
    other = cluster.cli("show", str(job), host="login", user=cluster.other_user)
    assert other.returncode == 4, (other.stdout, other.stderr)
    # the node stays up: a refusal is the user's, not the node's
    sinfo = cluster.run(["sinfo", "-h", "-n", "n2", "-o", "%t"], timeout=30).stdout.strip()
    assert not sinfo.startswith(("drain", "drng", "down")), sinfo
