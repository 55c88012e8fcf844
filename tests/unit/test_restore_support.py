"""A directory-copy test backend and a small world for restore/prune tests.

DirCopyBackend registers through the real backends registry (as a third-party
backend would) so drills and prune build it through backends.factory like any
other. Its snapshots and clones are plain copies that keep owners and modes.
The world lives under /tmp in a 0755 directory: the drilled program runs as
`nobody`, which must be able to reach its clone and the test program.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import os
import shutil
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from realcomponents import venv_python
from slurm_snap import config as config_mod
from slurm_snap import errors
from slurm_snap.backends import factory
from slurm_snap.backends.base import Backend, Capabilities, SnapshotRef, check_abs_path, check_name
from slurm_snap.backends.registry import default_registry
from slurm_snap.inventory.repository import SnapshotRecord
from slurm_snap.jobrecords import VolumeRecord
from slurm_snap import states as S

NAME = "test-dircopy"
OWNER = "nobody"
PYTHON = venv_python()


def copy_tree(src: str, dst: str) -> None:
    """Like cp -a for what tests use: contents, modes and owners."""
    shutil.copytree(src, dst, symlinks=True)
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        for n in [".", *dirnames, *filenames]:
            s = os.path.normpath(os.path.join(dirpath, n))
            d = os.path.normpath(os.path.join(dst, rel, n))
            st = os.lstat(s)
            os.lchown(d, st.st_uid, st.st_gid)
            if not os.path.islink(d):
                os.chmod(d, st.st_mode & 0o7777)


class DirCopyBackend(Backend):
    name = NAME
    OPTIONS = {"snapdir": (str, None)}

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(atomic=False, read_only=False, instant=False, per_file_cost=True, scope="volume",
                            needs_root=False, can_clone=True)

    def snapdir(self, volume: str) -> str:
        return self.options["snapdir"] or os.path.join(os.path.dirname(volume), ".snapshots")

    def create(self, volume: str, name: str) -> SnapshotRef:
        check_name(name)
        volume = check_abs_path("volume", volume)
        target = os.path.join(self.snapdir(volume), name)
        if not os.path.isdir(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            copy_tree(volume, target)
        return self.ref(volume, name, target, target)

    def list(self, volume: str) -> list[SnapshotRef]:
        d = self.snapdir(volume)
        return [self.ref(volume, n, os.path.join(d, n), os.path.join(d, n)) for n in sorted(os.listdir(d))]

    def exists(self, ref: SnapshotRef) -> bool:
        return os.path.isdir(ref.ref)

    def delete(self, ref: SnapshotRef) -> bool:
        if not self.exists(ref):
            return False
        shutil.rmtree(ref.ref)
        return True

    def clone(self, ref: SnapshotRef, target: str) -> str:
        target = check_abs_path("clone target", target)
        if os.path.lexists(target):
            raise errors.AlreadyExists(what="clone target", value=target)
        if not self.exists(ref):
            raise errors.NotFound(what="snapshot", value=ref.ref)
        copy_tree(ref.ref, target)
        return target


default_registry().register(NAME, DirCopyBackend)


def tree_digest(root: str) -> dict[str, str]:
    """Path -> sha256 (files) or mode/owner (everything), to prove a tree unchanged."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in sorted(dirnames + filenames):
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            out[rel] = f"{st.st_mode:o}:{st.st_uid}:{st.st_size}:{st.st_mtime_ns}"
            if os.path.isfile(p) and not os.path.islink(p):
                out[rel] += ":" + hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


# The drilled program: restores from the checkpoint its clone holds, proves the
# clone is writable, says who it ran as, then reports its first step.
PROGRAM = textwrap.dedent('''
    import json, os, sys, time
    mode = sys.argv[1]
    report = sys.argv[2]
    restored = json.loads(os.environ["SLURM_SNAP_RESTORE_MAP"])
    with open(os.path.join(report, "seen.json"), "w") as f:
        json.dump({"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "map": restored,
                   "env": {k: v for k, v in os.environ.items() if k.startswith(("SLURM_SNAP_", "HOME", "USER"))}}, f)
    if mode == "hang":
        time.sleep(3600)
    root = os.environ["SLURM_SNAP_RESTORE_SCRATCH"]
    ckpt = os.path.join(root, "ckpt", "latest")
    if not os.path.exists(ckpt):
        print(f"cannot resume: checkpoint {ckpt} missing", file=sys.stderr)
        sys.exit(3)
    step = int(open(ckpt).read())
    with open(os.path.join(root, "ckpt", "resumed"), "w") as f:
        f.write("written in the clone")
    first = 1 if mode == "stale" else step + 1
    if mode == "exit0":
        sys.exit(0)
    if mode == "marker-file":
        with open(os.environ["SLURM_SNAP_RESTORE_MARKER"], "w") as f:
            f.write(f"SLURM_SNAP_FIRST_STEP {first}\\n")
    else:
        print("resuming", flush=True)
        print(f"SLURM_SNAP_FIRST_STEP {first}", flush=True)
    time.sleep(3600)  # a training run goes on; the drill stops it after the first step
''')


@dataclass
class World:
    base: Path
    cfg: object
    live: str
    snapdir: str
    restore_root: str
    report: str
    program: str
    uid: int
    gid: int

    def command(self, mode: str) -> str:
        return f"{PYTHON} {self.program} {mode} {self.report}"


def make_world() -> World:
    import pwd

    pw = pwd.getpwnam(OWNER)
    base = Path(tempfile.mkdtemp(prefix="slurm-snap-restore-test-", dir="/tmp"))
    base.chmod(0o755)
    live = base / "scratch" / "jobs" / "42"
    (live / "ckpt").mkdir(parents=True)
    (live / "ckpt" / "latest").write_text("100")
    (live / "data.bin").write_bytes(os.urandom(4096))
    for p in [live, live / "ckpt", live / "ckpt" / "latest", live / "data.bin"]:
        os.chown(p, pw.pw_uid, pw.pw_gid)
    report = base / "report"
    report.mkdir()
    report.chmod(0o1777)
    program = base / "resume.py"
    program.write_text(PROGRAM)
    program.chmod(0o644)
    cfg_path = base / "slurm-snap.toml"
    data = {
        "inventory": {"url": f"sqlite:///{base}/inventory.db"},
        "paths": {"restore_root": str(base / "restore")},
        # In this process: these tests are about the drill itself, not where
        # Slurm runs it (test_restore_jobs.py is).
        "restore": {"mode": "local"},
        "volume_class": [{"name": "scratch", "prefix": str(base / "scratch"), "scope": "shared",
                          "backend": NAME, "options": {"snapdir": str(base / "scratch" / ".snapshots")}}],
    }
    cfg = config_mod.from_dict(data, str(cfg_path))
    cfg_path.write_text(_toml(data))
    factory.reset_cache()
    return World(base=base, cfg=cfg, live=str(live), snapdir=str(base / "scratch" / ".snapshots"),
                 restore_root=str(base / "restore"), report=str(report), program=str(program),
                 uid=pw.pw_uid, gid=pw.pw_gid)


def _toml(data: dict) -> str:
    out = []
    for section in ("inventory", "paths", "restore"):
        out.append(f"[{section}]")
        out += [f'{k} = "{v}"' for k, v in data[section].items()]
    for vc in data["volume_class"]:
        out.append("[[volume_class]]")
        out += [f'{k} = "{v}"' for k, v in vc.items() if k != "options"]
        out.append(f'options = {{ snapdir = "{vc["options"]["snapdir"]}" }}')
    return "\n".join(out) + "\n"


@pytest.fixture
def world():
    w = make_world()
    yield w
    factory.reset_cache()
    shutil.rmtree(w.base, ignore_errors=True)


T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)


def add_set(inv, w: World, *, job_id: int = 42, epoch: str = "e1", state: str = S.COMPLETE,
            consistency: str = S.APP, step: int | None = 100, at: dt.datetime = T0, snapshot: bool = True,
            uid: int | None = None, user: str = OWNER, options: dict | None = None) -> int:
    """A job run with one scratch volume and one finished set; returns the set id."""
    backend = factory.backend_for_class(w.cfg, w.cfg.volume_class("scratch"), None)
    live = w.live if job_id == 42 else os.path.join(os.path.dirname(w.live), str(job_id))
    if not os.path.isdir(live):
        copy_tree(w.live, live)
    with inv.session() as repo:
        run = repo.record_job_run(job_id=job_id, restart_count=0, user_name=user,
                                  uid=w.uid if uid is None else uid, options=options or {})
        (vol,) = repo.add_volumes(run, [VolumeRecord(path=live, scope="shared", volume_class="scratch",
                                                   backend=NAME)])
        st, _ = repo.create_set(run, epoch=epoch, trigger="manual", requested_at=at)
        set_id = st.id
        repo.transition(set_id, S.CUTTING, at=at)
        repo.transition(set_id, S.CUT, at=at + dt.timedelta(seconds=1))
        if snapshot:
            ref = backend.create(live, f"j{job_id}-{epoch}")
            repo.record_parts(set_id, [SnapshotRecord(
                volume_id=vol.id, backend=NAME, name=ref.name, ref=ref.ref, path=ref.path or "", node="",
                cut_started_at=at, cut_at=at + dt.timedelta(seconds=1))])
        final = state if state in (S.COMPLETE, S.PARTIAL, S.FAILED) else S.COMPLETE
        if state not in S.ACTIVE:
            repo.transition(set_id, final, consistency=consistency, checkpoint_step=step)
            if state not in (S.COMPLETE, S.PARTIAL, S.FAILED):
                repo.transition(set_id, state)
        elif state != S.CUT:
            raise ValueError(state)
    return set_id


def add_node_local_set(inv, w, *, nodes=("n1",)) -> int:
    """Job 42 ran on `nodes`; its set has one node-local scratch part per node
    (all at the world's snapshot: every stand-in node is this host)."""
    backend = factory.backend_for_class(w.cfg, w.cfg.volume_class("scratch"), None)
    with inv.session() as repo:
        run = repo.record_job_run(job_id=42, restart_count=0, user_name=OWNER, uid=w.uid, nodes=list(nodes),
                                  options={})
        vols = repo.add_volumes(run, [VolumeRecord(path=w.live, scope="node-local", volume_class="scratch",
                                                 backend=NAME, node=n) for n in nodes])
        st, _ = repo.create_set(run, epoch="e1", trigger="manual", requested_at=T0)
        repo.transition(st.id, S.CUTTING, at=T0)
        repo.transition(st.id, S.CUT, at=T0 + dt.timedelta(seconds=1))
        records = []
        for n, vol in zip(nodes, vols):
            ref = backend.create(w.live, f"j42-e1-{n}")
            records.append(SnapshotRecord(volume_id=vol.id, backend=NAME, name=ref.name, ref=ref.ref,
                                          path=ref.path or "", node=n, cut_started_at=T0,
                                          cut_at=T0 + dt.timedelta(seconds=1)))
        repo.record_parts(st.id, records)
        repo.transition(st.id, S.COMPLETE, consistency=S.APP, checkpoint_step=100)
        return st.id


def test_dircopy_backend_clone_is_a_writable_copy_with_owners(world):
    b = factory.backend_for_class(world.cfg, world.cfg.volume_class("scratch"), None)
    ref = b.create(world.live, "s1")
    target = os.path.join(world.base, "clone")
    assert b.clone(ref, target) == target
    assert tree_digest(target).keys() == tree_digest(world.live).keys()
    assert os.stat(os.path.join(target, "ckpt", "latest")).st_uid == world.uid
    with pytest.raises(errors.AlreadyExists):
        b.clone(ref, target)
    assert b.delete(ref) is True and b.delete(ref) is False


def node_local(w: World) -> World:
    """The world with its scratch class node-local (each stand-in node is this
    host, its scratch at the same path, as live node-local scratch is on
    every node) and a barrier directory for the drill jobs' Prologs."""
    import dataclasses

    snapdir = str(w.base / "scratch" / "jobs" / ".snapshots")   # where a per-job class keeps them
    vc = w.cfg.volume_class("scratch")
    vc = dataclasses.replace(vc, scope="node-local", options={**vc.options, "snapdir": snapdir})
    barriers = str(w.base / "barriers")
    cfg = dataclasses.replace(w.cfg, volume_classes=(vc,),
                              paths=dataclasses.replace(w.cfg.paths, barrier_dir=barriers),
                              restore=dataclasses.replace(w.cfg.restore, mode="job"))
    factory.reset_cache()
    return dataclasses.replace(w, cfg=cfg, snapdir=snapdir)


class SlurmHere:
    """Stands in for Slurm under the real SlurmSubmitter: the spec and the
    batch script are written as for sbatch, and "sbatch" runs the drill job
    at once on stand-in nodes (this host): each node's Prolog (the real
    restore/onnode.py, as root), the batch script as the owner (the real
    in-job runner), each node's Epilog. It remembers what sbatch was asked."""

    def __init__(self, cfg, inventory, *, before_epilog=None, prolog=True):
        from slurm_snap.restore.submit import SlurmSubmitter

        outer = self

        class Submitter(SlurmSubmitter):
            def _sbatch(self, cmd, owner, creds):
                return outer.sbatch(cmd, owner, creds, self._slurm_env(owner))

            def finished(self, job_id, owner=None):
                return True, "COMPLETED"

            def cancel(self, job_id):
                outer.cancelled.append(job_id)

        self.cfg, self.inv = cfg, inventory
        self.submitter = Submitter(cfg, poll=0.05)
        self.asked: list[list[str]] = []
        self.cancelled: list[int] = []
        self.job_id = 9000
        self.before_epilog = before_epilog
        self.prolog = prolog

    def hook_env(self, test_id: int, node: str, nodes: list[str], owner) -> dict:
        return {"SPANK_SLURM_SNAP": "1", "SPANK_SLURM_SNAP_DRILL": str(test_id), "SLURM_JOB_ID": str(self.job_id),
                "SLURM_JOB_UID": str(owner.pw_uid), "SLURM_JOB_GID": str(owner.pw_gid), "SLURMD_NODENAME": node,
                "SLURM_JOB_NODELIST": ",".join(nodes), "SLURM_JOB_USER": owner.pw_name}

    def sbatch(self, cmd, owner, creds, env) -> int:
        import subprocess

        from slurm_snap.restore import onnode
        from slurm_snap.slurm.jobenv import from_environ

        self.job_id += 1
        self.asked.append(cmd)
        opt = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in cmd if a.startswith("--") and "=" in a}
        test_id = int(opt["--snapshot-drill"])
        nodes = opt["--nodelist"].split(",") if "--nodelist" in opt else ["n1"]
        jobs = [from_environ(self.hook_env(test_id, n, nodes, owner)) for n in nodes]
        if self.prolog:
            for job in jobs:
                try:
                    onnode.prepare(self.cfg, self.inv, job)
                except errors.SnapError:
                    pass   # the hook's policy: recorded, exit 0; the node's file says why
        run_env = dict(env, SLURM_JOB_ID=str(self.job_id), SLURM_JOB_NODELIST=",".join(sorted(nodes)),
                       SLURMD_NODENAME=sorted(nodes)[0])
        subprocess.run([cmd[-1]], env=run_env, user=creds.uid, group=creds.gid, extra_groups=list(creds.groups),
                       cwd=os.path.dirname(cmd[-1]), stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
        if self.before_epilog:
            self.before_epilog(self)
        for job in jobs:
            try:
                onnode.cleanup(self.cfg, self.inv, job)
            except errors.SnapError:
                pass
        return self.job_id
