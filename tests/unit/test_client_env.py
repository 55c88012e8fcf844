"""Checkpointer defaults from the Slurm environment, the per-job files it
reads (request.json, resume.json, job.json), the restore marker, and the
promise that the client imports nothing heavy."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

from slurm_snap.client import Checkpointer, mark_first_step
from slurm_snap.client.slurmenv import parse_tasks_per_node
from slurm_snap.client.slurmenv import local_size_from_env
from slurm_snap.errors import BadValueError, NotFound

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("value,expected", [
    ("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("1,3,0", [1, 3, 0]),
])
def test_parse_tasks_per_node(value, expected):
    assert parse_tasks_per_node(value) == expected


@pytest.mark.parametrize("value", ["", "2(x)", "x", "2(x0)", "1,,2", "-1"])
def test_parse_tasks_per_node_rejects(value):
    with pytest.raises(BadValueError):
        parse_tasks_per_node(value)


def test_local_size_picks_this_nodes_entry_and_prefers_the_step():
    env = {"SLURM_TASKS_PER_NODE": "8(x4)", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}
    assert local_size_from_env(env) == 1
    assert local_size_from_env({**env, "SLURM_NODEID": "1"}) == 2
    assert local_size_from_env({"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "0"}) == 2
    assert local_size_from_env({"SLURM_TASKS_PER_NODE": "3"}) == 3
    assert local_size_from_env({}) is None


def test_local_size_errors_name_the_value():
    with pytest.raises(BadValueError, match="'4'"):
        local_size_from_env({"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "4"})
    with pytest.raises(BadValueError, match="SLURM_NODEID is not set"):
        local_size_from_env({"SLURM_TASKS_PER_NODE": "2,1"})


SLURM_ENV = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n3", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
             "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_NODEID": "2", "SLURM_RESTART_COUNT": "2"}


def test_defaults_from_environment(tmp_path):
    ckpt = Checkpointer(env={**SLURM_ENV, "SLURM_SNAP_BARRIER_DIR": str(tmp_path)})
    assert (ckpt.job_id, ckpt.node, ckpt.rank, ckpt.local_rank, ckpt.local_size, ckpt.restart_count) == \
        ("77", "n3", 5, 1, 2, 2)
    assert ckpt.job_dir == str(tmp_path / "77")
    assert ckpt.enabled
    assert ckpt.epoch() == "preempt-2"


def test_arguments_win_over_environment(tmp_path):
    ckpt = Checkpointer(env=SLURM_ENV, barrier_dir=str(tmp_path), job_id="8", node="x", rank=0,
                        local_rank=0, local_size=1)
    assert (ckpt.job_id, ckpt.node, ckpt.rank, ckpt.local_size) == ("8", "x", 0, 1)


@pytest.mark.parametrize("env,named", [
    ({"SLURM_PROCID": "abc"}, "'abc'"),
    ({"SLURM_LOCALID": "3", "SLURM_TASKS_PER_NODE": "2"}, "3"),
    ({"SLURM_SNAP_BARRIER_DIR": "relative/dir"}, "'relative/dir'"),
    ({"SLURM_JOB_ID": "../1"}, "'../1'"),
])
def test_bad_environment_is_named(env, named):
    with pytest.raises(BadValueError) as info:
        Checkpointer(env=env)
    assert named in str(info.value)


def test_outside_slurm_snap(tmp_path):
    ckpt = Checkpointer(env={})
    assert not ckpt.enabled and ckpt.resume_info() is None
    assert ckpt.rank == 0 and ckpt.local_size == 1


@pytest.fixture
def job(tmp_path):
    job_dir = tmp_path / "77"
    job_dir.mkdir()
    return Checkpointer(env=SLURM_ENV, barrier_dir=str(tmp_path)), job_dir


def write(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_epoch_from_current_request(job):
    ckpt, job_dir = job
    write(job_dir / "request.json", {"job_id": "77", "epoch": "od-5", "requested_at": time.time(),
                                     "deadline": time.time() + 60})
    assert ckpt.epoch() == "od-5"


def test_epoch_ignores_released_or_expired_requests(job):
    ckpt, job_dir = job
    write(job_dir / "request.json", {"job_id": "77", "epoch": "od-5", "deadline": "2000-01-01T00:00:00+00:00"})
    assert ckpt.epoch() == "preempt-2"
    write(job_dir / "request.json", {"job_id": "77", "epoch": "od-6", "deadline": time.time() + 60})
    assert ckpt.epoch() == "od-6"
    (job_dir / "release").mkdir()
    (job_dir / "release" / "od-6").touch()
    assert ckpt.epoch() == "preempt-2"


@pytest.mark.parametrize("doc,named", [
    ({"job_id": "78", "epoch": "od-1"}, "'78'"),
    ({"job_id": "77", "epoch": "../x"}, "'../x'"),
    ({"job_id": "77"}, "'epoch'"),
    ({"job_id": "77", "epoch": "od-1", "deadline": "soon"}, "'soon'"),
])
def test_bad_request_is_named(job, doc, named):
    ckpt, job_dir = job
    write(job_dir / "request.json", doc)
    with pytest.raises(BadValueError) as info:
        ckpt.epoch()
    assert named in str(info.value)


def test_resume_info(job):
    ckpt, job_dir = job
    assert ckpt.resume_info() is None
    doc = {"set_id": 12, "step": 300, "checkpoint": {"live": "/pfs/ckpt", "snapshot": "/pfs/.snap/s12/ckpt"}}
    write(job_dir / "resume.json", doc)
    # Files written before per-rank entries existed read with empty ones.
    assert ckpt.resume_info() == {**doc, "ranks": {}, "missing": []}


@pytest.mark.parametrize("doc,named", [
    ({"set_id": 1, "step": -3, "checkpoint": {"live": "/a"}}, "-3"),
    ({"set_id": 1, "step": 3, "checkpoint": {"live": "rel/a"}}, "'rel/a'"),
    ({"set_id": 1, "step": 3, "checkpoint": {}}, "neither"),
    ({"step": 3, "checkpoint": {"live": "/a"}}, "'set_id'"),
])
def test_bad_resume_is_named(job, doc, named):
    ckpt, job_dir = job
    write(job_dir / "resume.json", doc)
    with pytest.raises(BadValueError) as info:
        ckpt.resume_info()
    assert named in str(info.value)


def test_unparseable_job_file_names_the_file(job):
    ckpt, job_dir = job
    (job_dir / "resume.json").write_text("{not json")
    with pytest.raises(BadValueError, match="resume.json"):
        ckpt.resume_info()


def test_volume_path(job):
    ckpt, job_dir = job
    write(job_dir / "job.json", {"job_id": "77", "restart_count": 2, "user": "u", "nodes": ["n1", "n3"],
                                 "volumes": [
                                     {"class": "scratch", "scope": "node", "node": "n1", "path": "/scratch/n1"},
                                     {"class": "scratch", "scope": "node", "node": "n3", "path": "/scratch/n3"},
                                     {"class": "pfs", "scope": "shared", "node": None, "path": "/pfs/u"},
                                 ]})
    assert ckpt.volume_path("scratch") == "/scratch/n3"
    assert ckpt.volume_path("pfs") == "/pfs/u"
    with pytest.raises(NotFound, match="'home'"):
        ckpt.volume_path("home")


def test_volume_path_without_job_file(job):
    ckpt, _ = job
    with pytest.raises(NotFound, match="'pfs'"):
        ckpt.volume_path("pfs")


def test_mark_first_step(tmp_path):
    marker = tmp_path / "marker"
    stream = io.StringIO()
    assert mark_first_step(301, env={"SLURM_SNAP_RESTORE_MARKER": str(marker)}, stream=stream) == \
        "SLURM_SNAP_FIRST_STEP 301"
    assert stream.getvalue() == "SLURM_SNAP_FIRST_STEP 301\n"
    assert marker.read_text() == "SLURM_SNAP_FIRST_STEP 301\n"
    assert os.listdir(tmp_path) == ["marker"]
    with pytest.raises(BadValueError, match="-1"):
        mark_first_step(-1, env={}, stream=stream)


def test_mark_first_step_writes_to_stdout(capsys):
    mark_first_step(5, env={})
    assert capsys.readouterr().out == "SLURM_SNAP_FIRST_STEP 5\n"


def test_client_imports_no_heavy_dependency():
    # -I: no PYTHONPATH, no user site, no cwd on the path; the blocked modules
    # are poisoned so an import of any of them fails loudly.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "for name in ('click', 'sqlalchemy', 'paramiko', 'alembic', 'torch', 'numpy'):\n"
        "    sys.modules[name] = None\n"
        "import slurm_snap.client as c, slurm_snap.client.dcp, slurm_snap.client.launch\n"
        "k = c.Checkpointer(env={}).install()\n"
        "assert k.decide(1) == c.Action(checkpoint=False, stop=False) and k.agreement is None\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('click', 'sqlalchemy', 'paramiko')"
        " and sys.modules[m] is not None]\n"
        "print('ok', heavy)\n"
    )
    result = subprocess.run([sys.executable, "-I", "-c", code, REPO], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok []"


TORCHRUN = {"RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8", "GROUP_RANK": "1"}
# What srun gives the torchrun agent of node 1 of 2 (one task per node).
SRUN_AGENT = {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
              "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2"}


def test_torchrun_workers_take_their_identity_from_torchrun_not_from_the_agents_task():
    """Under `srun torchrun --nproc-per-node=4` every worker inherits the
    agent's SLURM_PROCID/SLURM_LOCALID: rank 1, local rank 0 of 1. Taken at
    face value, one worker's ack would complete the node while three write."""
    ckpt = Checkpointer(env={**SRUN_AGENT, **TORCHRUN})
    assert (ckpt.rank, ckpt.local_rank, ckpt.local_size, ckpt.world_size, ckpt.launcher) == (5, 1, 4, 8, "torchrun")
    plain = Checkpointer(env=SRUN_AGENT)
    assert (plain.rank, plain.local_rank, plain.local_size, plain.world_size, plain.launcher) == (1, 0, 1, 2, "slurm")
    # torchrun's variables only count when all four are there.
    partial = {k: v for k, v in TORCHRUN.items() if k != "LOCAL_WORLD_SIZE"}
    assert Checkpointer(env={**SRUN_AGENT, **partial}).launcher == "slurm"
    lone = Checkpointer(env={})
    assert (lone.rank, lone.local_size, lone.world_size, lone.launcher) == (0, 1, None, "")


@pytest.mark.parametrize("env,named", [
    ({**TORCHRUN, "RANK": "8"}, "rank"),
    ({**TORCHRUN, "LOCAL_RANK": "4"}, "local rank"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "9"}, "local size"),
    ({**TORCHRUN, "WORLD_SIZE": "x"}, "WORLD_SIZE"),
    ({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "2"}, "rank"),
    ({"SLURM_SNAP_INDEPENDENT": "maybe"}, "SLURM_SNAP_INDEPENDENT"),
])
def test_impossible_identities_are_refused_naming_the_value(env, named):
    with pytest.raises(BadValueError) as err:
        Checkpointer(env=env)
    assert named in str(err.value)


def test_acknowledgement_carries_world_size_and_independence(tmp_path):
    barrier = tmp_path
    env = {"SLURM_JOB_ID": "77", "SLURM_SNAP_BARRIER_DIR": str(barrier), "SLURMD_NODENAME": "n1",
           **SRUN_AGENT, "SLURM_SNAP_INDEPENDENT": "1"}
    ckpt = Checkpointer(env=env)
    f = barrier / "w.bin"
    f.write_bytes(b"x")
    from slurm_snap.jobrecords import Ack

    ack = Ack.from_bytes(open(ckpt.commit(3, [f]), "rb").read(), "77", "preempt-0")
    assert (ack.version, ack.world_size, ack.independent, ack.agreement) == (2, 2, True, "")
    assert Checkpointer(env={**env, "SLURM_SNAP_INDEPENDENT": "0"}).independent is False
