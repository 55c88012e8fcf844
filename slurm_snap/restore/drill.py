"""Restore drills: prove a snapshot set restores, then say so in the inventory.

A drill clones every snapshot of a set into a spare namespace (never the live
paths), runs the job's resume command there as the job's owner (never root),
waits for the program's first successful step (restore/runner.py), removes
the clones, and moves the set to VERIFIED or FAILED_RESTORE. Only VERIFIED
sets count for RPO, so a set whose latest drill failed stops counting at once.

The drill is in parts, each its own file: what it will do (plan.py, with
placement.py for where its ranks run), the crash journal it keeps
(journal.py), its verdict and record (outcome.py), and the sweep after
drills that did not finish (sweep.py). This file runs one: bring the parts a
placed drill needs, clone, run the command (here, or as a Slurm job of the
owner: submit.py), judge, clean up.

Placed on other nodes, each rank's node-local part is first brought to its
drill node and cloned there; a part that cannot be brought fails the drill
with the part named: a drill that ran without a rank's state would prove
nothing. Every copy brought and every clone is listed in the journal with
its node before it is made, and removed on that node after.

Order matters for crash safety: the RestoreTest row (RUNNING, with its
namespace) is committed first and the journal is written before every clone,
so a drill killed anywhere is found by the next drill's sweep, its clones
removed and its test closed as interrupted; the set's state is only changed
by a drill that finished.
"""
from __future__ import annotations

import json
import logging
import os
import pwd
from typing import Callable

from .. import errors, progress
from ..access import Caller, current_caller
from ..clock import utcnow
from ..protocol import nodelocal
from . import namespace as nsmod
from .guard import check_target
from .journal import Clone, Copy, Journal, JournalFile
from .outcome import Outcome, record, verdict
from .parts import BackendFor, backend_resolver, ref_from_row
from .placement import Placement, usable_nodes as slurm_usable_nodes
from .plan import Plan, make_plan
from .runner import run_program
from .live import LiveDrills
from .sweep import Sweep

log = logging.getLogger(__name__)

# Errors that say nothing about the set: they abort the drill instead of failing the set.
NOT_THE_SETS_FAULT = (errors.ConfigError, errors.ToolMissing, errors.Unsupported, errors.TransportError)
PROGRAM_PATH = "/usr/local/bin:/usr/bin:/bin"


def program_env(owner: pwd.struct_passwd, restore_map: dict, per_class: dict, marker: str,
                set_id: int, checkpoint_step: int | None) -> dict[str, str]:
    """A small fixed environment: nothing of root's (or the caller's) leaks into the user's program."""
    env = {"PATH": PROGRAM_PATH, "HOME": owner.pw_dir, "USER": owner.pw_name, "LOGNAME": owner.pw_name,
           "LANG": "C.UTF-8", "SLURM_SNAP_RESTORE": "1", "SLURM_SNAP_RESTORE_SET": str(set_id),
           "SLURM_SNAP_RESTORE_MAP": json.dumps(restore_map, sort_keys=True),
           "SLURM_SNAP_RESTORE_MARKER": marker}
    if checkpoint_step is not None:
        env["SLURM_SNAP_RESTORE_STEP"] = str(checkpoint_step)
    for vclass, path in per_class.items():
        env["SLURM_SNAP_RESTORE_" + vclass.upper().replace("-", "_")] = path
    return env


class Drill:
    """One restore drill against an inventory.

    `live`: the drills this process runs now; one shared by every drill that
    runs in a thread of the same process (the schedule runner's), so that
    none sweeps another as dead."""

    def __init__(self, cfg, inventory, *, backend_for: BackendFor | None = None, caller: Caller | None = None,
                 submitter=None, backend_on=None, usable_nodes: Callable[[], list[str]] | None = None,
                 live: LiveDrills | None = None):
        self.cfg = cfg
        self.inv = inventory
        self.backend_for = backend_for or backend_resolver(cfg)
        self.caller = caller or current_caller()
        self.submitter = submitter
        if backend_on is None:
            from ..backends.factory import backend_on_node

            backend_on = lambda vclass, node: backend_on_node(cfg, vclass, node)  # noqa: E731
        # (class, node) -> a node-local class's backend on that node: where a
        # placed drill's copies and clones are made and removed.
        self.backend_on = backend_on
        self.usable_nodes = usable_nodes or slurm_usable_nodes
        self.live = live if live is not None else LiveDrills()
        self.sweeper = Sweep(cfg, inventory, caller=self.caller, submitter=submitter, backend_for=self.backend_for,
                             backend_on=backend_on, live=self.live)

    def plan(self, selector: str, *, command: str | None = None, deadline: float | None = None,
             target: str | None = None, placement: Placement | None = None) -> Plan:
        return make_plan(self.cfg, self.inv, self.caller, selector, command=command, deadline=deadline,
                         target=target, placement=placement, usable=self.usable_nodes)

    def run(self, selector: str, *, command: str | None = None, deadline: float | None = None,
            target: str | None = None, keep: bool = False, submit: bool = False, wait: bool = True,
            placement: Placement | None = None) -> Outcome:
        plan = self.plan(selector, command=command, deadline=deadline, target=target, placement=placement)
        if plan.placed is not None:
            submit = True   # the command must run on the drill's nodes: Slurm puts it there
        if not wait and not submit:
            raise errors.UsageError("not waiting only makes sense with --submit")
        if submit and self.submitter is None:
            raise errors.ConfigError(path=self.cfg.path, key="restore-test --submit", why="no Slurm submitter")
        self.sweeper.sweep()
        with self.inv.session() as repo:
            busy = repo.running_restore_tests(plan.set_id)
            if busy:
                raise errors.Busy(what="snapshot set", value=str(plan.set_id),
                                  why=f"restore test {busy[0].id} is running ({busy[0].target})")
            rt = repo.start_restore_test(plan.set_id, plan.command, target="")
            test_id = rt.id
            ns = nsmod.namespace_path(plan.base, plan.set_id, test_id)
            repo.set_restore_test_target(test_id, ns)
            repo.event("restore_test", f"restore test {test_id} of set {plan.set_id} started in {ns}",
                       job_id=plan.job_id, set_id=plan.set_id)
        outcome = Outcome(set_id=plan.set_id, job_id=plan.job_id, test_id=test_id, passed=False, reason="",
                          namespace=ns, kept=keep, nodes=list(plan.placed.nodes) if plan.placed else [])
        self.live.add(test_id)
        try:
            self._drill(plan, outcome, submit, wait)
        except BaseException as exc:
            # Our setup, the network or an interruption, not the set: close the
            # test, remove the clones, leave the set's state alone.
            why = (f"drill aborted: {exc}" if isinstance(exc, errors.SnapError)
                   else f"interrupted: {type(exc).__name__}: {exc}")
            self._abandon(plan, outcome, why)
            self.live.discard(test_id)
            raise
        try:
            return self._finish(plan, outcome, keep)
        finally:
            self.live.discard(test_id)

    def _finish(self, plan: Plan, outcome: Outcome, keep: bool) -> Outcome:
        ns = outcome.namespace
        if outcome.pending:
            return outcome  # collected later by sweep() (restore-test --collect, or the next drill)
        if not keep:
            outcome.cleanup_errors = self.sweeper.remove(ns, plan.snapshots)
        record(self.inv, outcome)
        return outcome

    def _drill(self, plan: Plan, out: Outcome, submit: bool, wait: bool = True) -> None:
        ns = out.namespace
        marker_dir = nsmod.make_namespace(plan.base, ns, plan.creds.uid, plan.creds.gid,
                                          base_must_be_ours=plan.base_must_be_ours)
        marker = os.path.join(marker_dir, nsmod.MARKER_FILE)
        placed = plan.placed
        jf = JournalFile(ns, Journal(set_id=plan.set_id, test_id=out.test_id, host=nsmod.this_host(),
                                     pid=os.getpid(), started_at=utcnow().isoformat(),
                                     nodes=tuple(placed.nodes) if placed is not None else ()))
        nodes_per_class: dict[str, set] = {}
        progress.phase("clone", total=len(plan.snapshots))
        for snap in plan.snapshots:
            nodes_per_class.setdefault(snap.volume.volume_class, set()).add(snap.node)
        restore_map: dict[str, str] = {}
        per_class: dict[str, str] = {}
        if placed is not None and not self._bring(plan, out, jf):
            return
        for snap in plan.snapshots:
            vclass = snap.volume.volume_class
            on = placed.target.get(snap.id) if placed is not None else None
            # Placed: each node holds one clone of its class at the same path
            # (next to the snapshot, on the node's own disk), as each node
            # holds its own live scratch at the same path.
            name = vclass if on else nsmod.clone_name(vclass, snap.node, len(nodes_per_class[vclass]) > 1)
            try:
                if on:
                    got = self._clone_on(on, snap, name, plan, jf)
                else:
                    got = self._clone(self.backend_for(snap), snap, name, plan, jf)
            except NOT_THE_SETS_FAULT:
                raise
            except errors.SnapError as exc:
                where = f" on {on}" if on else ""
                out.reason = f"clone of {snap.volume.path} from snapshot {snap.ref}{where} failed: {exc}"
                return
            key = snap.volume.path if snap.volume.path not in restore_map else f"{snap.node}:{snap.volume.path}"
            restore_map[key] = got
            progress.advance()
            per_class.setdefault(vclass, got)
        out.restore_map = restore_map
        env = program_env(plan.owner, restore_map, per_class, marker, plan.set_id, plan.checkpoint_step)
        if placed is not None:
            # Which of the job's nodes each drill node stands in for.
            env["SLURM_SNAP_RESTORE_NODES"] = json.dumps(placed.node_map, sort_keys=True)
        progress.phase("drill job" if submit else "resume command")
        if submit:
            def submitted(job_id: int) -> None:
                out.slurm_job_id = job_id
                jf.record(jf.current.submitted(job_id, detached=not wait, deadline=plan.deadline,
                                               checkpoint_step=plan.checkpoint_step))
                with self.inv.session() as repo:
                    repo.set_restore_test_job(out.test_id, job_id)

            where = {"nodes": placed.nodes} if placed is not None else {}
            if not wait:
                submitted(self.submitter.submit(argv=plan.argv, env=env, marker_dir=marker_dir, marker_file=marker,
                                                deadline=plan.deadline, owner=plan.owner, creds=plan.creds,
                                                job_name=f"slurm-snap-restore-{plan.set_id}", **where))
                out.pending = True
                return
            result = self.submitter.run(argv=plan.argv, env=env, marker_dir=marker_dir, marker_file=marker,
                                        deadline=plan.deadline, owner=plan.owner, creds=plan.creds,
                                        job_name=f"slurm-snap-restore-{plan.set_id}", on_submitted=submitted,
                                        **where)
        else:
            result = run_program(plan.argv, env=env, cwd=marker_dir, deadline=plan.deadline,
                                 marker_file=marker, creds=plan.creds if os.geteuid() == 0 else None)
        out.passed, out.reason = verdict(result, plan.checkpoint_step, plan.deadline)
        out.first_step, out.time_to_first_step = result.first_step, result.time_to_first_step

    def _clone(self, backend, snap, name: str, plan: Plan, jf: JournalFile) -> str:
        """Clone into the namespace; if the backend's tool fails there (e.g. the
        restore root is on another filesystem), once more next to the snapshot."""
        ref, ns = ref_from_row(snap), jf.ns

        def attempt(where: str) -> str:
            path = os.path.join(where, name)
            # Before the clone exists: cleanup must know it may.
            jf.record(jf.current.with_clone(Clone(snapshot_id=snap.id, path=path, ns=where, live=snap.volume.path,
                                                  volume_class=snap.volume.volume_class, node=snap.node)))
            return backend.clone(ref, path)

        try:
            return attempt(ns)
        except (errors.CommandFailed, errors.OtherFilesystem) as first:
            # Next to the snapshot where it is a path (btrfs, reflink copies);
            # next to the volume where it is not (a zfs dataset@name): both
            # are on the filesystem the clone must be made on.
            near = snap.ref if snap.ref.startswith("/") else snap.volume.path
            if not near.startswith("/") or "mkdir" not in backend.tools:
                raise
            alt = nsmod.alt_namespace(near, ns)
            try:
                check_target(alt, plan.live, self.cfg, protected=plan.protected)
            except errors.BadValueError:
                raise first from None  # never onto live data
            nsmod.remove_clone(backend, os.path.join(ns, name), ns)  # what the failed tool left
            jf.record(jf.current.with_namespace(alt))
            try:
                backend.mkdir_p(alt)
                return attempt(alt)
            except errors.SnapError as second:
                raise errors.BackendError(backend=backend.name,
                                          why=f"{first}; and next to the snapshot: {second}") from None

    def _bring(self, plan: Plan, out: Outcome, jf: JournalFile) -> bool:
        """Bring each rank's node-local part to its drill node; False (the
        drill failed, the part named in out.reason) if one cannot be."""
        placed = plan.placed
        if placed.unplaceable:
            out.reason = "cannot place the drill on " + ",".join(placed.nodes) + ": " + "; ".join(placed.unplaceable)
            return False
        # Listed before they exist: cleanup (also a later sweep) must know it may.
        jf.record(jf.current.with_copies(
            Copy(snapshot_id=m.part.snapshot_id, on=m.to_node, volume_class=m.part.volume_class,
                 backend=m.part.backend, volume=m.part.volume, name=m.part.name, ref=m.part.ref, path=m.part.path,
                 source=m.source_node) for m in placed.moves))
        progress.phase("bring parts", total=len(placed.moves))
        records = nodelocal.execute(self.cfg, placed.moves, budget=plan.deadline, for_restart=None, purpose="drill",
                                    backend_on=self.backend_on)
        progress.advance(len(records))
        classes = {m.part.snapshot_id: m.part.volume_class for m in placed.moves}
        with self.inv.session() as repo:
            repo.record_copies(plan.set_id, records)
            for c in records:
                text = nodelocal.describe(c, classes[c.snapshot_id])
                repo.event("restore_test", f"restore test {out.test_id} of set {plan.set_id}: {text}",
                           job_id=plan.job_id, set_id=plan.set_id, node=c.node, level="info" if c.ok else "error")
        out.moved = [nodelocal.describe(c, classes[c.snapshot_id]) for c in records if c.ok]
        failed = [nodelocal.describe(c, classes[c.snapshot_id]) for c in records if not c.ok]
        if failed:
            out.reason = "node-local state not brought to the drill's nodes: " + "; ".join(failed)
            return False
        return True

    def _clone_on(self, node: str, snap, name: str, plan: Plan, jf: JournalFile) -> str:
        """A placed clone: on `node`, next to the snapshot (or the copy brought
        there, at the same path), never in the shared namespace."""
        backend = self.backend_on(snap.volume.volume_class, node)
        if not snap.ref.startswith("/") or "mkdir" not in backend.tools:
            raise errors.Unsupported(backend=backend.name, verb="a clone placed on another node")
        alt = nsmod.alt_namespace(snap.ref, jf.ns)
        check_target(alt, plan.live, self.cfg, protected=plan.protected)
        path = os.path.join(alt, name)
        # Before the clone exists: cleanup must know it may.
        jf.record(jf.current.with_namespace(alt).with_clone(
            Clone(snapshot_id=snap.id, path=path, ns=alt, live=snap.volume.path,
                  volume_class=snap.volume.volume_class, node=snap.node, on=node)))
        backend.mkdir_p(alt)
        return backend.clone(ref_from_row(snap), path)

    def _abandon(self, plan: Plan, out: Outcome, reason: str) -> None:
        """Close a test that did not finish; clones go, the set's state stays."""
        try:
            errs = self.sweeper.remove(out.namespace, plan.snapshots) if os.path.isdir(out.namespace) else []
            with self.inv.session() as repo:
                repo.finish_restore_test(out.test_id, passed=False, first_step=None, time_to_first_step=None,
                                         reason=reason + (f"; cleanup left: {'; '.join(errs)}" if errs else ""))
        except Exception as exc:  # the original error matters more; the next sweep retries
            log.warning("restore test %s: cleanup after interruption failed: %s", out.test_id, exc)
