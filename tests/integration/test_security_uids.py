"""Nobody let in, with real uids: processes that really are the job's user or
another user (os.fork + setgid/setuid in a child; the CLI through runuser)
try to forge another job's acknowledgements, write root's files in the
barrier directory, read the inventory or the hook log, and act on another
user's job. Each attempt must fail with EACCES/EPERM or exit 4/9, and the
coordinator must not accept what they managed to write.

Needs root and the dev-cluster accounts (scripts/dev-cluster up creates
snapuser and snapother; they persist on the machine).
(Covered elsewhere: unknown SSH host keys are refused --
tests/integration/test_ssh_transport.py::test_unknown_host_key_is_refused.)
"""
from __future__ import annotations

import datetime as dt
import errno
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fs import require  # noqa: E402  (fail under CI, skip locally)
from realcomponents import venv_python  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PY = venv_python()


def account(name):
    try:
        pw = pwd.getpwnam(name)
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return None


@pytest.fixture(scope="module")
def users():
    require(os.geteuid() == 0, "real-uid tests need root")
    a, b = account("snapuser"), account("snapother")
    require(a is not None and b is not None, "accounts snapuser/snapother missing (scripts/dev-cluster up makes them)")
    return {"owner": a, "other": b}


@pytest.fixture
def area(users):
    """A world-traversable temp dir (pytest's tmp_path is 0700 root) with two jobs' barrier dirs."""
    from slurm_snap.jobdir import JobDir
    from slurm_snap.jobrecords import JobRecord
    d = Path(tempfile.mkdtemp(prefix="slurm-snap-sec-", dir="/var/tmp"))
    d.chmod(0o755)
    barriers = d / "barriers"
    jobs = {}
    for job_id, who in ((101, "owner"), (202, "other")):
        uid, gid = users[who]
        jd = JobDir(str(barriers), job_id).prepare(uid, gid)
        jd.write_job(JobRecord(job_id=job_id, user=who))
        jobs[job_id] = Path(jd.path)
    try:
        yield d, jobs
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(uid: int, gid: int, fn) -> str:
    """Run fn() in a forked child with the given real ids; returns 'ok', 'errno:N' or 'exc:...'."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        res = "exc:unknown"
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                fn()
                res = "ok"
            except OSError as exc:
                res = f"errno:{exc.errno}"
            except BaseException as exc:  # noqa: BLE001 - report, never raise in the child
                res = f"exc:{type(exc).__name__}:{exc}"
            os.write(w, res.encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return data.decode()


DENIED = {f"errno:{errno.EACCES}", f"errno:{errno.EPERM}"}


def ack_bytes(job_id: int, node="n1", rank=0, epoch="sepoch1") -> bytes:
    from slurm_snap.jobrecords import Ack
    return Ack(job_id=str(job_id), epoch=epoch, node=node, rank=rank, local_rank=0, local_size=1, step=1,
               written_at=dt.datetime.now(dt.timezone.utc), manifest=()).to_bytes()


def write(path: Path, data: bytes = b"x"):
    def fn():
        with open(path, "wb") as f:
            f.write(data)
    return fn


# ---- barrier directory ---------------------------------------------------------------------
ATTEMPTS = {
    # name -> (who, what) ; every one must be refused by the kernel
    "other writes an ack into the job's ack/": ("other", lambda j: write(j[101] / "ack" / "n1.0.json",
                                                                         ack_bytes(101))),
    "other lists the job's ack/": ("other", lambda j: lambda: os.listdir(j[101] / "ack")),
    "other reads job.json": ("other", lambda j: lambda: open(j[101] / "job.json").read()),
    "other creates a file in the job dir": ("other", lambda j: write(j[101] / "request.json")),
    "other renames the job's dir away": ("other", lambda j: lambda: os.rename(j[101], j[101].parent / "stolen")),
    "other replaces the job dir with a link": ("other", lambda j: lambda: os.symlink("/tmp", j[101].parent / "303")),
    "owner writes a release": ("owner", lambda j: write(j[101] / "release" / "sepoch1")),
    "owner rewrites job.json": ("owner", lambda j: write(j[101] / "job.json")),
    "owner writes request.json": ("owner", lambda j: write(j[101] / "request.json")),
    "owner writes resume.json": ("owner", lambda j: write(j[101] / "resume.json")),
    "owner renames ack/ away": ("owner", lambda j: lambda: os.rename(j[101] / "ack", j[101] / "ack2")),
    "owner chmods the job dir": ("owner", lambda j: lambda: os.chmod(j[101], 0o777)),
    "owner writes into another job's ack/": ("owner", lambda j: write(j[202] / "ack" / "n1.0.json",
                                                                      ack_bytes(202))),
}


@pytest.mark.parametrize("name", sorted(ATTEMPTS))
def test_barrier_directory_refuses(users, area, name):
    _d, jobs = area
    who, make = ATTEMPTS[name]
    before = sorted(str(p) for p in jobs[101].parent.rglob("*"))
    assert as_user(*users[who], make(jobs)) in DENIED
    assert sorted(str(p) for p in jobs[101].parent.rglob("*")) == before


def test_the_jobs_own_user_may_acknowledge(users, area):
    _d, jobs = area
    assert as_user(*users["owner"], write(jobs[101] / "ack" / "n1.0.json", ack_bytes(101))) == "ok"
    assert os.stat(jobs[101] / "ack" / "n1.0.json").st_uid == users["owner"][0]
    from slurm_snap.protocol.barrier import AckCollector
    c = AckCollector(str(jobs[101] / "ack"), job_id=101, epoch="sepoch1", nodes=["n1"], owner_uid=users["owner"][0])
    c.rescan()
    assert c.state.all_complete and c.state.rejected == {}


def test_forgeries_that_do_land_are_not_accepted(users, area):
    """What a user can write is rejected by the coordinator: an ack for another job
    in their own directory, and a hard link to someone else's ack."""
    _d, jobs = area
    from slurm_snap.protocol.barrier import AckCollector
    # the other user writes, in their own job's ack/, an ack claiming job 101
    assert as_user(*users["other"], write(jobs[202] / "ack" / "n1.0.json", ack_bytes(101))) == "ok"
    c = AckCollector(str(jobs[202] / "ack"), job_id=202, epoch="sepoch1", nodes=["n1"], owner_uid=users["other"][0])
    c.rescan()
    assert "belongs to another job" in c.state.rejected["n1.0.json"] and not c.state.complete
    # the owner of 101 writes a valid ack; the other user tries to hard-link it into 202's ack/
    assert as_user(*users["owner"], write(jobs[101] / "ack" / "n1.0.json", ack_bytes(101))) == "ok"
    res = as_user(*users["other"], lambda: os.link(jobs[101] / "ack" / "n1.0.json", jobs[202] / "ack" / "x.json"))
    assert res in DENIED  # cannot even reach it (ack/ is 0700)
    # root plants a foreign-owned file (as if a link had been possible): rejected by owner and link count
    foreign = jobs[202] / "ack" / "n1.1.json"
    foreign.write_bytes(ack_bytes(202, rank=1))
    os.chown(foreign, users["owner"][0], users["owner"][1])
    c = AckCollector(str(jobs[202] / "ack"), job_id=202, epoch="sepoch1", nodes=["n1"], owner_uid=users["other"][0])
    c.rescan()
    assert f"owned by uid {users['owner'][0]}" in c.state.rejected["n1.1.json"]


# ---- root's files --------------------------------------------------------------------------------
@pytest.fixture
def site(area, users):
    d, _jobs = area
    cfg = d / "slurm-snap.toml"
    cfg.write_text(f"""
[inventory]
url = "sqlite:///{d}/db/inventory.db"
[paths]
barrier_dir = "{d}/barriers"
log_dir = "{d}/log"
restore_root = "{d}/restore"
allowed_roots = ["{d}/root"]
[[volume_class]]
name = "pfs"
prefix = "{d}/root/pfs"
scope = "shared"
backend = "btrfs"
""")
    cfg.chmod(0o644)
    from slurm_snap import config
    from slurm_snap.hooks.policy import run_hook
    from slurm_snap.inventory.repository import Inventory
    from slurm_snap.jobrecords import VolumeRecord
    inv = Inventory(f"sqlite:///{d}/db/inventory.db")
    inv.upgrade()
    with inv.session() as repo:
        run = repo.record_job_run(job_id=101, restart_count=0, user_name="snapuser", uid=users["owner"][0],
                                  nodes=["n1"])
        repo.add_volumes(run, [VolumeRecord(path=f"{d}/root/pfs/jobs/101", scope="shared", volume_class="pfs",
                                          backend="btrfs")])
        repo.event("hook", "secret-ish: job 101 of snapuser", job_id=101)
    run_hook("prolog", lambda: "recorded", cfg=config.load(str(cfg)), job_id=101)
    os.chmod(d / "db", 0o755)  # even with a traversable directory, the files themselves are private
    # the engine stays open (as a running coordinator's would): -wal and -shm exist meanwhile
    yield d, cfg
    inv.dispose()


@pytest.mark.parametrize("who", ["owner", "other"])
@pytest.mark.parametrize("target", ["db/inventory.db", "db/inventory.db-wal", "db/inventory.db-shm", "log/hooks.log"])
def test_users_cannot_read_roots_files(users, site, who, target):
    d, _cfg = site
    path = d / target
    assert path.exists(), path
    assert as_user(*users[who], lambda: open(path, "rb").read(1)) in DENIED


def run_cli_as(user: str, cfg: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["/usr/sbin/runuser", "-u", user, "--", PY, "-m", "slurm_snap", "--config", str(cfg), *argv],
                          capture_output=True, text=True, timeout=60, cwd="/", env={"PATH": "/usr/bin:/bin",
                                                                                   "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("argv", [["show", "101"], ["report", "-j", "101"], ["snapshot", "101"],
                                  ["restore-test", "101", "--command", "/bin/true"], ["repair"], ["db", "upgrade"]])
def test_a_user_running_the_cli_directly_gets_nothing(users, site, argv):
    """Without the sudo rule the CLI runs as the user: the inventory is unreadable,
    so every command fails (exit 9 or 4) and prints no data."""
    require(os.path.exists("/usr/sbin/runuser"), "runuser missing")
    d, cfg = site
    p = run_cli_as("snapother", cfg, *argv)
    assert p.returncode in (4, 9), (p.returncode, p.stderr)
    assert p.stdout == "" and "snapuser" not in p.stderr and "secret-ish" not in p.stderr
    assert "slurm-snap:" in p.stderr
    if p.returncode == 9:
        # One sentence that names the cause and the service users go through.
        assert "cannot read it (permission denied" in p.stderr and "slurm-snap serve" in p.stderr, p.stderr


def test_a_user_cannot_become_someone_else_with_sudo_uid(users, site):
    """SUDO_UID is believed only from root: a user setting it gains nothing."""
    d, cfg = site
    p = subprocess.run(["/usr/sbin/runuser", "-u", "snapother", "--", "/usr/bin/env", "SUDO_UID=0",
                        f"PYTHONPATH={REPO}", PY, "-c",
                        "from slurm_snap.access import current_caller; c = current_caller(); print(c.uid, c.via_sudo)"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(users["other"][0]), "False"]


def test_submit_check_as_a_user_who_cannot_look_inside_another_users_directory(users, site):
    """The helper runs as the submitting user: EACCES on the walk is a clear error naming the value."""
    d, cfg = site
    theirs = d / "root" / "pfs" / "users" / "snapuser"
    (theirs / "data").mkdir(parents=True)
    for p in (theirs, theirs / "data"):
        os.chown(p, *users["owner"])
    theirs.chmod(0o700)
    for p in (d / "root", d / "root" / "pfs", d / "root" / "pfs" / "users"):
        p.chmod(0o755)
    value = str(theirs / "data")
    p = run_cli_as("snapother", cfg, "hook", "validate-options", "--volumes", value)
    assert p.returncode == 2, p.stderr
    assert repr(value) in p.stderr and "Permission denied" in p.stderr and "Traceback" not in p.stderr
