"""Shared setup for the protocol tests: a real SQLite inventory and a real
barrier directory in a temp dir, a job with node-local and shared volumes on
the copying test backend (registered through the backend registry)."""
from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field

from slurm_snap import access, config
from slurm_snap.jobdir import ack_filename
from slurm_snap.jobrecords import Ack, ManifestEntry
from slurm_snap.inventory.repository import Inventory
from slurm_snap.jobrecords import VolumeRecord

import dbtemplates
from testkit.doubles import register_test_backends

register_test_backends()

JOB_ID = 4242
ROOT = access.Caller(uid=0, name="root")


@dataclass
class Env:
    tmp: str
    cfg: config.Config
    inv: Inventory
    nodes: tuple[str, ...]
    job_id: int = JOB_ID
    local_paths: dict = field(default_factory=dict)
    shared_path: str = ""
    uid: int = 0

    @property
    def job_dir(self) -> str:
        return os.path.join(self.cfg.paths.barrier_dir, str(self.job_id))

    @property
    def ack_dir(self) -> str:
        return os.path.join(self.job_dir, "ack")

    def write_checkpoint(self, node: str, rank: int, step: int = 7, size: int = 100) -> ManifestEntry:
        base = self.local_paths[node] if node in self.local_paths else self.shared_path
        path = os.path.join(base, f"ckpt-rank{rank}.pt")
        with open(path, "wb") as f:
            f.write(b"x" * size)
        return ManifestEntry(path=path, size=size)

    def ack(self, node: str, rank: int, epoch: str, *, local_rank: int = 0, local_size: int = 1, step: int = 7,
            manifest=(), job_id=None, written_at=None, name=None, signalled_at=None) -> str:
        os.makedirs(self.ack_dir, exist_ok=True)
        data = Ack(job_id=str(job_id or self.job_id), epoch=epoch, node=node, rank=rank,
                   local_rank=local_rank, local_size=local_size, step=step,
                   written_at=written_at or dt.datetime.now(dt.timezone.utc), manifest=manifest,
                   signalled_at=signalled_at).to_bytes()
        path = os.path.join(self.ack_dir, name or ack_filename(node, rank))
        tmp = path + ".tmp-x"
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, path)
        return path

    def request_epoch(self) -> str:
        import json

        with open(os.path.join(self.job_dir, "request.json")) as f:
            return json.load(f)["epoch"]


def make_env(tmp_path, *, nodes=("n1", "n2"), allow_crash=True, local=True, shared=True,
             backend="test-copy", options=None, user="alice", uid=1000, record=True,
             barrier=5.0, backend_call=5.0, job_id=JOB_ID, restart_count=0, recorded_nodes=None,
             extra: dict | None = None) -> Env:
    tmp = str(tmp_path)
    classes = []
    if local:
        classes.append({"name": "scratch", "prefix": f"{tmp}/scratch/{{node}}", "scope": "node-local",
                        "backend": backend, "options": dict(options or {})})
    if shared:
        classes.append({"name": "pfs", "prefix": f"{tmp}/pfs", "scope": "shared",
                        "backend": backend, "options": dict(options or {})})
    data = {
        "inventory": {"url": f"sqlite:///{tmp}/inventory.db"},
        "paths": {"barrier_dir": f"{tmp}/barriers", "restore_root": f"{tmp}/restore", "log_dir": f"{tmp}/log"},
        "spool": {"directory": f"{tmp}/spool"},
        "protocol": {"allow_crash_consistent": allow_crash},
        "timeouts": {"barrier": barrier, "backend_call": backend_call, "hook_budget": 20.0},
        "volume_class": classes,
        **(extra or {}),
    }
    cfg_path = f"{tmp}/slurm-snap.toml"
    with open(cfg_path, "w") as f:
        f.write(to_toml(data))
    cfg = config.load(cfg_path)
    if not os.path.exists(f"{tmp}/inventory.db"):
        # Migrated, as `db upgrade` leaves it; a second env in the same
        # directory (protocol_killee.py's) opens the first one's.
        dbtemplates.sqlite(f"{tmp}/inventory.db")
    inv = Inventory(cfg.inventory.url)
    env = Env(tmp=tmp, cfg=cfg, inv=inv, nodes=tuple(nodes), job_id=job_id, uid=uid)
    specs = []
    for n in (recorded_nodes if recorded_nodes is not None else nodes):
        if local:
            p = cfg.volume_class("scratch").job_path(n, job_id)
            os.makedirs(p, exist_ok=True)
            env.local_paths[n] = p
            specs.append(VolumeRecord(path=p, scope="node-local", volume_class="scratch", backend=backend, node=n))
    if shared:
        p = cfg.volume_class("pfs").job_path(None, job_id)
        os.makedirs(p, exist_ok=True)
        env.shared_path = p
        specs.append(VolumeRecord(path=p, scope="shared", volume_class="pfs", backend=backend))
    if record:
        with inv.session() as repo:
            run = repo.record_job_run(job_id=job_id, restart_count=restart_count, user_name=user, uid=uid,
                                      nodes=list(nodes), options={"consistency": "app", "on_preempt": True})
            repo.add_volumes(run, specs, prepared=True)
    return env


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def to_toml(data: dict) -> str:
    """Just enough TOML for the test configurations (tomllib only reads)."""
    lines = []
    for section, values in data.items():
        if section == "volume_class":
            for vc in values:
                lines.append("[[volume_class]]")
                lines.extend(f"{k} = {_toml_value(v)}" for k, v in vc.items())
            continue
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
    return "\n".join(lines) + "\n"
