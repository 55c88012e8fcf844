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
    for section in ("inventory", "paths"):
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
