"""Restore drills: prove a snapshot set restores, then say so in the inventory.

A drill clones every snapshot of a set into a spare namespace (never the live
paths), runs the job's resume command there as the job's owner (never root),
waits for the program's first successful step (restore/runner.py), removes
the clones, and moves the set to VERIFIED or FAILED_RESTORE. Only VERIFIED
sets count for RPO, so a set whose latest drill failed stops counting at once.

Placed on other nodes (`Placement`: restore-test --other-nodes / --nodelist,
and the schedule runner's drills with partner copies), a drill proves the hard
case of a requeue: each rank's node-local part is first brought to the node at
its rank's position in the drill's node list (protocol.nodelocal, the same
mapping as a requeued run's Prolog), cloned there, and the command runs as a
Slurm job of the owner on exactly those nodes. A part that cannot be brought
fails the drill with the part named: a drill that ran without a rank's state
would prove nothing. Every copy brought and every clone is listed in
drill.json with its node before it is made, and removed on that node after.

Order matters for crash safety: the RestoreTest row (RUNNING, with its
namespace) is committed first and drill.json is written before every clone,
so a drill killed anywhere is found by the next drill's sweep(), its clones
removed and its test closed as interrupted; the set's state is only changed
by a drill that finished.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import pwd
import shlex
import signal
from dataclasses import dataclass, field
from typing import Callable

from ..clock import utcnow
from .. import errors, progress
from ..access import Caller, current_caller, is_operator, require_owner_or_operator
from .. import states as S
from ..protocol import nodelocal
from . import namespace as nsmod
from .guard import check_caller_may_write, check_residency, check_target
from .parts import BackendFor, backend_resolver, ref_from_row
from .runner import Credentials, RunResult, run_program

log = logging.getLogger(__name__)

# Errors that say nothing about the set: they abort the drill instead of failing the set.
NOT_THE_SETS_FAULT = (errors.ConfigError, errors.ToolMissing, errors.Unsupported, errors.TransportError)
# A RUNNING test without drill.json younger than this may still be setting up.
STALE_AFTER = 120.0
PROGRAM_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class Placement:
    """Run a drill's ranks on other nodes than the ones that cut the set.

    `nodes`: the drill's node list, position k taking the ranks of the job's
    node k; empty: usable nodes Slurm has that cut nothing of the set, in
    sinfo's order. `prefer_copies`: bring a part from a copy (a partner's)
    when one exists, proving the copy. `only_node_local`: a set without
    node-local parts is drilled the ordinary way (the schedule runner)."""
    nodes: tuple[str, ...] = ()
    prefer_copies: bool = False
    only_node_local: bool = False


@dataclass
class Placed:
    """A placement resolved against one set (Plan.placed)."""
    nodes: list                 # the drill's node list
    node_map: dict              # the job's node -> the drill's node, by position
    moves: list                 # nodelocal.Move: parts to bring first
    unplaceable: list           # why a part cannot be brought (fails the drill)
    target: dict                # snapshot id -> node its clone goes on


@dataclass
class Outcome:
    set_id: int
    job_id: int
    test_id: int
    passed: bool
    reason: str
    first_step: int | None = None
    time_to_first_step: float | None = None
    namespace: str = ""
    restore_map: dict = field(default_factory=dict)
    kept: bool = False
    cleanup_errors: list = field(default_factory=list)
    slurm_job_id: int | None = None
    pending: bool = False   # submitted with --no-wait: no verdict yet
    nodes: list = field(default_factory=list)    # placed drills: where the ranks ran
    moved: list = field(default_factory=list)    # placed drills: one line per part brought


@dataclass
class Plan:
    set_id: int
    job_id: int
    job_label: str
    command: str
    argv: list
    deadline: float
    base: str
    checkpoint_step: int | None
    owner: pwd.struct_passwd
    creds: Credentials
    snapshots: list
    live: list = field(default_factory=list)
    protected: list = field(default_factory=list)
    # The configured restore_root must be ours alone; a target an operator or
    # (when allowed) the owner names is theirs to vouch for.
    base_must_be_ours: bool = True
    placed: Placed | None = None


def parse_command(command: str) -> list[str]:
    """shlex, no shell: the words are the argv."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise errors.BadValueError(what="command", value=command, why=str(exc)) from None
    if not argv:
        raise errors.BadValueError(what="command", value=command, why="is empty")
    return argv


def parse_selector(text: str) -> tuple[str, int]:
    """`set:ID` -> ("set", ID); `JOB` -> ("job", JOB)."""
    kind, value = ("set", text[4:]) if text.startswith("set:") else ("job", text)
    # ASCII digits, and a number the inventory can hold (not an OverflowError deep in SQLite).
    if not (value.isascii() and value.isdigit()) or int(value) > 2**32 - 1:
        raise errors.BadValueError(what="restore-test target", value=text, why="expected a job id or set:ID")
    return kind, int(value)


def verdict(result: RunResult, checkpoint_step: int | None, deadline: float) -> tuple[bool, str]:
    if not result.started:
        return False, result.error or "the command did not start"
    if result.first_step is not None:
        if checkpoint_step is not None and result.first_step < checkpoint_step:
            return False, (f"resumed at step {result.first_step}, before the set's checkpoint step "
                           f"{checkpoint_step}: the program did not resume from the snapshot")
        return True, ""
    tail = _tail(result.stderr_tail)
    if result.error:
        return False, result.error + tail
    if result.timed_out:
        return False, f"deadline: no first step within {deadline:g} s" + tail
    status = result.exit_status
    if status == 0:
        return False, "exited with status 0 without reporting a first step (SLURM_SNAP_FIRST_STEP <step>)" + tail
    if status is not None and status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = str(-status)
        return False, f"killed by {name} before the first step" + tail
    return False, f"exit status {status} before the first step" + tail


def _tail(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()][-3:]
    return f"; stderr: {' | '.join(lines)[-600:]}" if lines else ""


def owner_credentials(uid: int, name: str) -> tuple[pwd.struct_passwd, Credentials]:
    if uid == 0:
        raise errors.BadValueError(what="job owner", value=name or "root",
                                   why="a restore drill never runs a command as root")
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise errors.BadValueError(what="job owner uid", value=uid, why="unknown on this host") from None
    groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != 0)
    return pw, Credentials(uid=pw.pw_uid, gid=pw.pw_gid, groups=groups)


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


# sinfo's node states a drill may be placed on (it waits in the queue for a busy one).
USABLE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})


def _usable_nodes() -> list[str]:
    from ..slurm.commands import node_states

    return [n for n, (state, _why) in node_states().items() if state.lower() in USABLE_STATES]


def place(snapshots, old_nodes: list[str], acks, copies, placement: Placement,
          usable: Callable[[], list[str]]) -> Placed:
    """Resolve a placement against a set: the drill's nodes, and the moves
    that put each rank's node-local parts on its node (nodelocal.follow, the
    requeue's mapping). Raises when no such node list exists (not the set's
    fault); a part that cannot be brought is listed in `unplaceable`."""
    local = [s for s in snapshots if s.volume.scope == "node-local"]
    old_nodes = list(old_nodes) or sorted({s.node for s in local})
    cut = {s.node for s in local}
    if placement.nodes:
        nodes = list(placement.nodes)
        if len(set(nodes)) != len(nodes):
            raise errors.BadValueError(what="--nodelist", value=",".join(nodes), why="names a node twice")
        # Root reaches these hosts over SSH to bring the parts: only nodes
        # Slurm has and would run the drill on, never any host a user types.
        known = set(usable())
        strange = [n for n in nodes if n not in known]
        if strange:
            raise errors.BadValueError(what="--nodelist", value=",".join(nodes),
                                       why=f"{', '.join(strange)}: not a usable Slurm node")
        # A part's copy has its original's path: on a node that cut another
        # part of the set it would land on that part.
        clash = [n for k, n in enumerate(nodes) if n in cut and (k >= len(old_nodes) or old_nodes[k] != n)]
        if clash:
            raise errors.BadValueError(what="--nodelist", value=",".join(nodes),
                                       why=f"{', '.join(clash)} cut another rank's part of the set; a node of the "
                                           "set may only keep its own position")
    else:
        nodes = [n for n in usable() if n not in cut and n not in old_nodes][:len(old_nodes)]
    if len(nodes) < len(old_nodes):
        raise errors.Conflict(f"the drill needs {len(old_nodes)} node(s) at the job's positions "
                              f"({','.join(old_nodes)}) but has {','.join(nodes) or 'none'}"
                              + ("" if placement.nodes else " usable outside the nodes that cut the set"))
    nodes = nodes[:len(old_nodes)]
    # One rank per node when the set has no acknowledgements (crash-consistent):
    # position k stands for the job's node k.
    rank_old = {a.rank: a.node for a in acks} or dict(enumerate(old_nodes))
    held: dict[int, set[str]] = {}
    for c in copies:
        held.setdefault(c.snapshot_id, set()).add(c.node)
    lost = frozenset(s.node for s in local if s.state == "LOST")
    views = [nodelocal.PartView.of(s) for s in local]
    rank_new, moves, unplaceable = nodelocal.follow(views, old_nodes, nodes, rank_old, held, lost,
                                                    prefer_copies=placement.prefer_copies)
    target: dict[int, str] = {}
    for s in local:
        news = sorted({rank_new.get(r) for r, n in rank_old.items() if n == s.node} - {None})
        if not news:
            if not any(n == s.node for n in rank_old.values()):
                unplaceable.append(f"{s.volume.volume_class} part cut on {s.node}: no rank of the job ran there "
                                   "to place it by")
            continue
        # There when cloned: its own node, a copy already held there, or the move's.
        target[s.id] = news[0]
    node_map = {o: nodes[k] for k, o in enumerate(old_nodes)}
    return Placed(nodes=nodes, node_map=node_map, moves=moves, unplaceable=unplaceable, target=target)


def _owns(caller: Caller, run) -> bool:
    return caller.uid == run.uid or caller.name == run.user_name


# Restore tests this process is running now, by id. A drill whose state names
# this process's pid is otherwise taken for a leftover of an earlier process
# that had the pid; the schedule runner runs several drills in threads.
_LIVE: set[int] = set()
_LIVE_LOCK = threading.Lock()


class Drill:
    """One restore drill (or a sweep of dead ones) against an inventory."""

    def __init__(self, cfg, inventory, *, backend_for: BackendFor | None = None, caller: Caller | None = None,
                 submitter=None, backend_on=None, usable_nodes: Callable[[], list[str]] | None = None):
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
        self.usable_nodes = usable_nodes or _usable_nodes

    # -- planning -------------------------------------------------------------
    def plan(self, selector: str, *, command: str | None = None, deadline: float | None = None,
             target: str | None = None, placement: Placement | None = None) -> Plan:
        kind, value = parse_selector(selector)
        with self.inv.session() as repo:
            if kind == "set":
                st = repo.get_set(value)
            else:
                run = repo.job_run(value)  # NotFound names the job
                # Before saying whether it has a drillable set: that is the owner's business.
                require_owner_or_operator(self.cfg, self.caller, owner_uid=run.uid, owner_name=run.user_name,
                                          what=f"job {run.label}")
                st = repo.drillable_set(value)
                if st is None:
                    raise errors.NotFound(what="drillable snapshot set of job", value=str(value))
            run = st.job_run
            require_owner_or_operator(self.cfg, self.caller, owner_uid=run.uid, owner_name=run.user_name,
                                      what=f"job {run.label}")
            if st.state not in S.RESTORABLE:
                raise errors.Conflict(f"snapshot set {st.id} is {st.state}; only COMPLETE, VERIFIED or "
                                      "FAILED_RESTORE sets can be drilled")
            if st.consistency not in S.DRILLABLE:
                raise errors.Conflict(f"snapshot set {st.id} is labelled {st.consistency}; only app- or "
                                      "crash-consistent sets can be drilled")
            command = command or (run.options or {}).get("resume_cmd") or ""
            if not command:
                raise errors.BadValueError(what="command", value="",
                                           why=f"no --command given and job {run.label} recorded no resume "
                                               "command at submit (--snapshot-resume-cmd)")
            argv = parse_command(command)
            owner, creds = owner_credentials(run.uid, run.user_name)
            if os.geteuid() not in (0, creds.uid):
                raise errors.PermissionDenied(why=f"running the command as {owner.pw_name} needs root "
                                                  "(run restore-test through sudo)")
            snapshots = repo.snapshots(st.id)
            if not snapshots:
                raise errors.Conflict(f"snapshot set {st.id} has no snapshots to restore")
            protected = [p for s in snapshots for p in (s.ref, s.path) if p and p.startswith("/")]
            live = repo.live_volume_paths()
            base = check_target(target or self.cfg.paths.restore_root, live, self.cfg, protected=protected)
            if target is not None and not is_operator(self.cfg, self.caller):
                if not self.cfg.restore.user_targets:
                    raise errors.PermissionDenied(
                        why=f"restore target {target!r}: only operators choose a drill's target "
                            f"(restore.user_targets = false); drills go to {self.cfg.paths.restore_root}")
                check_caller_may_write(base, self.caller.uid, self.caller.name)
            check_residency(self.cfg, base, snapshots)
            deadline = float(deadline if deadline is not None else self.cfg.timeouts.restore)
            if deadline <= 0:
                raise errors.BadValueError(what="deadline", value=deadline, why="must be positive")
            placed = None
            if placement is not None and not (placement.only_node_local and
                                              not any(s.volume.scope == "node-local" for s in snapshots)):
                placed = place(snapshots, list(run.nodes or []), repo.acks(st.id),
                               repo.copies(st.id, states=("OK",)), placement, self.usable_nodes)
            return Plan(set_id=st.id, job_id=st.job_id, job_label=run.label, command=command, argv=argv,
                        deadline=deadline, base=base, checkpoint_step=st.checkpoint_step, owner=owner,
                        creds=creds, snapshots=snapshots, live=live, protected=protected,
                        base_must_be_ours=target is None, placed=placed)

    # -- the drill -------------------------------------------------------------
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
        self.sweep()
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
        with _LIVE_LOCK:
            _LIVE.add(test_id)
        try:
            self._drill(plan, outcome, submit, wait)
        except BaseException as exc:
            # Our setup, the network or an interruption, not the set: close the
            # test, remove the clones, leave the set's state alone.
            why = (f"drill aborted: {exc}" if isinstance(exc, errors.SnapError)
                   else f"interrupted: {type(exc).__name__}: {exc}")
            self._abandon(plan, outcome, why)
            with _LIVE_LOCK:
                _LIVE.discard(test_id)
            raise
        try:
            return self._finish(plan, outcome, keep)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(test_id)

    def _finish(self, plan: Plan, outcome: Outcome, keep: bool) -> Outcome:
        ns = outcome.namespace
        if outcome.pending:
            return outcome  # collected later by sweep() (restore-test --collect, or the next drill)
        if not keep:
            outcome.cleanup_errors = self._cleanup(ns, plan.snapshots)
        self._record(plan.set_id, plan.job_id, outcome)
        return outcome

    def _drill(self, plan: Plan, out: Outcome, submit: bool, wait: bool = True) -> None:
        ns = out.namespace
        marker_dir = nsmod.make_namespace(plan.base, ns, plan.creds.uid, plan.creds.gid,
                                          base_must_be_ours=plan.base_must_be_ours)
        marker = os.path.join(marker_dir, nsmod.MARKER_FILE)
        state = {"version": 1, "set_id": plan.set_id, "test_id": out.test_id, "host": nsmod.this_host(),
                 "pid": os.getpid(), "started_at": utcnow().isoformat(), "clones": []}
        nsmod.write_state(ns, state)
        nodes_per_class: dict[str, set] = {}
        progress.phase("clone", total=len(plan.snapshots))
        for snap in plan.snapshots:
            nodes_per_class.setdefault(snap.volume.volume_class, set()).add(snap.node)
        restore_map: dict[str, str] = {}
        per_class: dict[str, str] = {}
        state["namespaces"] = []
        state["copies"] = []
        placed = plan.placed
        if placed is not None:
            state["nodes"] = placed.nodes
            if not self._bring(plan, out, state):
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
                    got = self._clone_on(on, snap, name, plan, ns, state)
                else:
                    got = self._clone(self.backend_for(snap), snap, name, plan, ns, state)
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
                state["slurm_job_id"] = job_id
                state["detached"] = not wait
                state["deadline"] = plan.deadline
                state["checkpoint_step"] = plan.checkpoint_step
                nsmod.write_state(ns, state)
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

    def _clone(self, backend, snap, name: str, plan: Plan, ns: str, state: dict) -> str:
        """Clone into the namespace; if the backend's tool fails there (e.g. the
        restore root is on another filesystem), once more next to the snapshot."""
        ref = ref_from_row(snap)

        def attempt(where: str) -> str:
            path = os.path.join(where, name)
            state["clones"].append({"snapshot_id": snap.id, "path": path, "ns": where,
                                    "live": snap.volume.path, "class": snap.volume.volume_class, "node": snap.node})
            nsmod.write_state(ns, state)  # before the clone exists: cleanup must know it may
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
            state["namespaces"].append(alt)
            nsmod.write_state(ns, state)
            try:
                backend.mkdir_p(alt)
                return attempt(alt)
            except errors.SnapError as second:
                raise errors.BackendError(backend=backend.name,
                                          why=f"{first}; and next to the snapshot: {second}") from None

    def _bring(self, plan: Plan, out: Outcome, state: dict) -> bool:
        """Bring each rank's node-local part to its drill node; False (the
        drill failed, the part named in out.reason) if one cannot be."""
        placed, ns = plan.placed, out.namespace
        if placed.unplaceable:
            out.reason = "cannot place the drill on " + ",".join(placed.nodes) + ": " + "; ".join(placed.unplaceable)
            return False
        for m in placed.moves:
            # Listed before it exists: cleanup (also a later sweep) must know it may.
            state["copies"].append({"snapshot_id": m.part.snapshot_id, "on": m.to_node, "class": m.part.volume_class,
                                    "backend": m.part.backend, "volume": m.part.volume, "name": m.part.name,
                                    "ref": m.part.ref, "path": m.part.path, "from": m.source_node})
        nsmod.write_state(ns, state)
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

    def _clone_on(self, node: str, snap, name: str, plan: Plan, ns: str, state: dict) -> str:
        """A placed clone: on `node`, next to the snapshot (or the copy brought
        there, at the same path), never in the shared namespace."""
        backend = self.backend_on(snap.volume.volume_class, node)
        if not snap.ref.startswith("/") or "mkdir" not in backend.tools:
            raise errors.Unsupported(backend=backend.name, verb="a clone placed on another node")
        alt = nsmod.alt_namespace(snap.ref, ns)
        check_target(alt, plan.live, self.cfg, protected=plan.protected)
        if alt not in state["namespaces"]:
            state["namespaces"].append(alt)
        path = os.path.join(alt, name)
        state["clones"].append({"snapshot_id": snap.id, "path": path, "ns": alt, "live": snap.volume.path,
                                "class": snap.volume.volume_class, "node": snap.node, "on": node})
        nsmod.write_state(ns, state)  # before the clone exists: cleanup must know it may
        backend.mkdir_p(alt)
        return backend.clone(ref_from_row(snap), path)

    def _entry_backend(self, snapshots):
        return nsmod.resolver_for_entries(self.backend_for, {s.id: s for s in snapshots}, self.backend_on)

    def _cleanup(self, ns: str, snapshots) -> list[str]:
        """Remove the drill's clones and the copies it brought, each on its
        node; the copies removed no longer count as held (part_copy DELETED)."""
        state = nsmod.read_state(ns) or {}
        errs = nsmod.cleanup_namespace(ns, self._entry_backend(snapshots), self.backend_on)
        copies = state.get("copies") or []
        if copies:
            with self.inv.session() as repo:
                for c in copies:
                    if not any(e.startswith(nsmod.copy_error_prefix(c)) for e in errs):
                        repo.mark_copy_deleted(int(state["set_id"]), node=c["on"], ref=c["ref"], purpose="drill")
        return errs

    def _record(self, set_id: int, job_id: int, out: Outcome) -> None:
        with self.inv.session() as repo:
            repo.finish_restore_test(out.test_id, passed=out.passed, first_step=out.first_step,
                                     time_to_first_step=out.time_to_first_step, reason=out.reason,
                                     slurm_job_id=out.slurm_job_id)
            st = repo.get_set(set_id)
            if st.state not in S.RESTORABLE:
                # Pruned (or otherwise moved on) while we ran: record the test only.
                repo.event("restore_test", f"restore test {out.test_id}: set is {st.state} now; state unchanged",
                           job_id=job_id, set_id=set_id, level="warning")
            elif out.passed:
                # verified_at is the latest passing drill; a reason left by an
                # earlier failed drill no longer applies, any other reason does.
                reason = "" if st.reason.startswith("restore test ") else st.reason
                repo.transition(set_id, S.VERIFIED, verified_at=utcnow(), reason=reason)
            else:
                # A failed drill revokes the verification: RPO must not count this set.
                repo.transition(set_id, S.FAILED_RESTORE, verified_at=None,
                                reason=f"restore test {out.test_id}: {out.reason}"[:4000])
            msg = (f"restore test {out.test_id} of set {set_id}: "
                   + (f"PASSED, first step {out.first_step} after {out.time_to_first_step:.2f} s"
                      if out.passed else f"FAILED: {out.reason}"))
            if out.cleanup_errors:
                msg += f"; cleanup left: {'; '.join(out.cleanup_errors)}"
            repo.event("restore_test", msg, job_id=job_id, set_id=set_id,
                       level="info" if out.passed and not out.cleanup_errors else "warning")

    def _abandon(self, plan: Plan, out: Outcome, reason: str) -> None:
        """Close a test that did not finish; clones go, the set's state stays."""
        try:
            errs = self._cleanup(out.namespace, plan.snapshots) if os.path.isdir(out.namespace) else []
            with self.inv.session() as repo:
                repo.finish_restore_test(out.test_id, passed=False, first_step=None, time_to_first_step=None,
                                         reason=reason + (f"; cleanup left: {'; '.join(errs)}" if errs else ""))
        except Exception as exc:  # the original error matters more; the next sweep retries
            log.warning("restore test %s: cleanup after interruption failed: %s", out.test_id, exc)

    # -- cleanup of dead drills ---------------------------------------------------
    def sweep(self, *, include_kept: bool = False) -> list[str]:
        """Clean up after drills that died (and, with include_kept, after --keep ones).

        Returns messages about what was cleaned or could not be.
        """
        messages: list[str] = []
        operator = is_operator(self.cfg, self.caller)
        with self.inv.session() as repo:
            running = [(rt.id, rt.set_id, rt.target, rt.started_at) for rt in repo.running_restore_tests()]
            if not operator:
                # A sweep names no job: a user's covers their own drills, never
                # another's (cancelling its Slurm job, failing its set).
                runs = {set_id: repo.get_set(set_id).job_run for _, set_id, _, _ in running}
                running = [r for r in running if _owns(self.caller, runs[r[1]])]
            rows = {rt_set: repo.snapshots(rt_set, include_deleted=True) for _, rt_set, _, _ in running}
        now = utcnow()
        for test_id, set_id, ns, started in running:
            with _LIVE_LOCK:
                if test_id in _LIVE:
                    continue   # another thread of this process runs it (the schedule runner's drills)
            state = nsmod.read_state(ns) if ns else None
            if state is not None and state.get("detached"):
                messages += self._collect(test_id, set_id, ns, state, rows[set_id])
                continue
            if state is not None:
                if state.get("host") != nsmod.this_host():
                    continue  # another host's drill: only that host can tell whether it lives
                if nsmod.pid_alive(int(state.get("pid", 0))) and int(state.get("pid", 0)) != os.getpid():
                    continue
            elif (now - started).total_seconds() < STALE_AFTER:
                continue
            if state and state.get("slurm_job_id") and self.submitter is not None:
                self.submitter.cancel(int(state["slurm_job_id"]))
            errs = self._cleanup(ns, rows[set_id]) if ns and os.path.isdir(ns) else []
            if errs:
                messages.append(f"restore test {test_id}: cleanup incomplete: {'; '.join(errs)}")
                continue
            with self.inv.session() as repo:
                repo.finish_restore_test(test_id, passed=False, first_step=None, time_to_first_step=None,
                                         reason="interrupted: the drill process is gone; clones cleaned up")
                repo.event("restore_test", f"restore test {test_id}: interrupted drill cleaned up",
                           set_id=set_id, level="warning")
            messages.append(f"restore test {test_id}: interrupted drill cleaned up ({ns})")
        if include_kept:
            messages += self._sweep_kept()
        return messages

    def _collect(self, test_id: int, set_id: int, ns: str, state: dict, rows) -> list[str]:
        """Finish a --no-wait drill whose Slurm job has ended: verdict, cleanup, record."""
        job = int(state["slurm_job_id"])
        if self.submitter is None:
            return []
        try:
            done, last = self.submitter.finished(job)
        except errors.SnapError as exc:
            return [f"restore test {test_id}: cannot ask Slurm about job {job}: {exc}"]
        deadline = float(state.get("deadline") or self.cfg.timeouts.restore)
        if not done:
            started = dt.datetime.fromisoformat(state["started_at"])
            if (utcnow() - started).total_seconds() < self.submitter.queue_timeout + deadline + 30:
                return [f"restore test {test_id}: Slurm job {job} is {last}"]
            self.submitter.cancel(job)
            result = RunResult(started=last == "RUNNING", timed_out=True,
                               error=f"deadline: Slurm job {job} did not finish in time (last state {last})")
        else:
            result = self.submitter.result(job, os.path.join(ns, nsmod.MARKER_DIR), last)
        out = Outcome(set_id=set_id, job_id=0, test_id=test_id, passed=False, reason="", namespace=ns,
                      slurm_job_id=job)
        out.passed, out.reason = verdict(result, state.get("checkpoint_step"), deadline)
        out.first_step, out.time_to_first_step = result.first_step, result.time_to_first_step
        out.cleanup_errors = self._cleanup(ns, rows)
        with self.inv.session() as repo:
            out.job_id = repo.get_set(set_id).job_id
        self._record(set_id, out.job_id, out)
        return [f"restore test {test_id} of set {set_id}: " + ("PASSED" if out.passed else f"FAILED: {out.reason}")]

    def _sweep_kept(self) -> list[str]:
        messages = []
        root = self.cfg.paths.restore_root
        try:
            entries = sorted(os.listdir(root))
        except FileNotFoundError:
            return messages
        for entry in entries:
            ns = os.path.join(root, entry)
            state = nsmod.read_state(ns)
            if state is None:
                continue
            with self.inv.session() as repo:
                try:
                    rt = repo.restore_test(int(state.get("test_id", 0)))
                except errors.NotFound:
                    continue
                if rt.result == "RUNNING":
                    continue
                rows = repo.snapshots(int(state["set_id"]), include_deleted=True)
            errs = self._cleanup(ns, rows)
            messages.append(f"{ns}: " + ("removed" if not errs else "cleanup incomplete: " + "; ".join(errs)))
        return messages

