"""What a drill will do, decided before it does anything: the set, the
command and its owner, the restore target, the placement (placement.py).

`make_plan` reads the inventory and checks every refusal (access, the set's
state and label, a command, never root, a target off live data, residency,
the deadline) so that a drill that starts has nothing left to refuse.
"""
from __future__ import annotations

import os
import pwd
import shlex
from dataclasses import dataclass, field
from typing import Callable

from .. import errors
from ..access import Caller, is_operator, require_owner_or_operator
from .. import states as S
from .guard import check_caller_may_write, check_residency, check_target
from .placement import Placed, Placement, Position, place, positions, positions_of, usable_nodes
from .runner import Credentials


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
    # A drill run as a Slurm job: its nodes by the job's position ([]: the
    # set has no node-local parts, any node of the partition will do), the
    # job's node count, partition and recorded options (its GRES).
    on_job: bool = False
    positions: list[Position] = field(default_factory=list)
    job_nodes: list = field(default_factory=list)
    partition: str = ""
    options: dict = field(default_factory=dict)


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


def make_plan(cfg, inventory, caller: Caller, selector: str, *, command: str | None = None,
              deadline: float | None = None, target: str | None = None, placement: Placement | None = None,
              usable: Callable[[], list[str]] = usable_nodes, on_job: bool = False) -> Plan:
    """Everything a drill needs to know before it touches anything, checked:
    who may drill the set, its state and label, the command and as whom it
    runs, where the clones go (never onto live data), and (placed) on which
    nodes. Reads the inventory, writes nothing."""
    kind, value = parse_selector(selector)
    with inventory.session() as repo:
        if kind == "set":
            st = repo.get_set(value)
        else:
            run = repo.job_run(value)  # NotFound names the job
            # Before saying whether it has a drillable set: that is the owner's business.
            require_owner_or_operator(cfg, caller, owner_uid=run.uid, owner_name=run.user_name,
                                      what=f"job {run.label}")
            st = repo.drillable_set(value)
            if st is None:
                raise errors.NotFound(what="drillable snapshot set of job", value=str(value))
        run = st.job_run
        require_owner_or_operator(cfg, caller, owner_uid=run.uid, owner_name=run.user_name,
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
        base = check_target(target or cfg.paths.restore_root, live, cfg, protected=protected)
        if target is not None and not is_operator(cfg, caller):
            if not cfg.restore.user_targets:
                raise errors.PermissionDenied(
                    why=f"restore target {target!r}: only operators choose a drill's target "
                        f"(restore.user_targets = false); drills go to {cfg.paths.restore_root}")
            check_caller_may_write(base, caller.uid, caller.name)
        check_residency(cfg, base, snapshots)
        deadline = float(deadline if deadline is not None else cfg.timeouts.restore)
        if deadline <= 0:
            raise errors.BadValueError(what="deadline", value=deadline, why="must be positive")
        placed = None
        if placement is not None and placement.moves and not (
                placement.only_node_local and not any(s.volume.scope == "node-local" for s in snapshots)):
            placed = place(snapshots, list(run.nodes or []), repo.acks(st.id),
                           repo.copies(st.id, states=(S.COPY_OK,)), placement, usable)
            on_job = True   # the command must run on the drill's nodes: Slurm puts it there
        where: list[Position] = []
        if placed is not None:
            where = positions_of(placed, snapshots)
        elif on_job:
            where = positions(snapshots, list(run.nodes or []), repo.copies(st.id, states=(S.COPY_OK,)),
                              prefer_copies=bool(placement and placement.prefer_copies), usable=usable)
        return Plan(set_id=st.id, job_id=st.job_id, job_label=run.label, command=command, argv=argv,
                    deadline=deadline, base=base, checkpoint_step=st.checkpoint_step, owner=owner,
                    creds=creds, snapshots=snapshots, live=live, protected=protected,
                    base_must_be_ours=target is None, placed=placed, on_job=on_job, positions=where,
                    job_nodes=list(run.nodes or []), partition=run.partition or "",
                    options=dict(run.options or {}))
