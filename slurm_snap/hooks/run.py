"""Run one named Slurm hook for the job in the environment, under the failure
policy, and return its exit status. Shared by `slurm-snap hook NAME` and the
fast path in slurm_snap.cli.entry (hooks sit on every job's start path, so
they skip click's import)."""
from __future__ import annotations

import os
import sys

from .. import config as config_mod
from .. import errors


class _LazyInventory:
    """Opens the inventory (and imports SQLAlchemy) only if the hook uses it:
    the node Prolog of a first run never does, and must stay cheap."""

    def __init__(self, cfg):
        self._cfg = cfg
        self._inv = None

    def __getattr__(self, name):
        if self._inv is None:
            from ..inventory.repository import Inventory

            self._inv = Inventory.from_config(self._cfg)
        return getattr(self._inv, name)


def run_named(config_path: str | None, name: str) -> int:
    from ..slurm.jobenv import from_environ
    from .jobhooks import HOOKS
    from .policy import run_hook

    if name not in HOOKS:
        raise errors.BadValueError(what="hook", value=name, why=f"one of {', '.join(sorted(HOOKS))}")
    try:
        cfg = config_mod.load(config_path)
    except errors.SnapError as exc:  # no config: still never drain the node
        print(f"slurm-snap: {name}: {exc} (policy open)", file=sys.stderr)
        return 0
    from ..slurm.commands import adopt_bin_dir, adopt_conf

    adopt_conf(cfg.slurm.conf)
    adopt_bin_dir(cfg.slurm.bin_dir)
    state = {"job": None, "inv": None}

    def body():
        job = state["job"] = from_environ()
        if not job.opted_in:
            return "job did not opt in"
        state["inv"] = _LazyInventory(cfg)
        try:
            if job.drill is not None:
                from .drillhooks import DRILL_HOOKS

                return DRILL_HOOKS[name](cfg, state["inv"], job)
            return HOOKS[name](cfg, state["inv"], job)
        except errors.VolumesRefused as exc:
            state["recorded"] = exc.recorded
            raise

    def record_failure(hook, detail):
        if state.get("recorded"):
            return  # the hook recorded its failure itself, precisely
        if state["inv"] is not None and state["job"] is not None:
            from ..protocol.recorder import recorder_for

            recorder_for(cfg, state["inv"]).hook_failed(hook=hook, detail=detail, job_id=state["job"].job_id,
                                                        node=state["job"].node)

    raw_id = os.environ.get("SLURM_JOB_ID", "")
    job_id = int(raw_id) if raw_id.isascii() and raw_id.isdigit() else None
    status = run_hook(name, body, cfg=cfg, job_id=job_id, node=os.environ.get("SLURMD_NODENAME", ""),
                      record_failure=record_failure)
    # Every hook on its way out: if this node's spool holds what an Epilog
    # cut while the inventory was away, start the node agent's pass in the
    # background (one scandir when it is empty: the opted-in Prolog's cost).
    from ..spool import has_entries

    if has_entries(cfg.spool.directory):
        from ..nodeagent.agent import kick

        kick(cfg)
    return status
