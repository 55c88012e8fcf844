"""Turn report's sacct-style options into a SetFilter, under the access rule.

Access: a user sees only their own jobs. Operators (access.is_operator) see
everyone's. As in sacct, root sees all users by default, any other caller
(an operator included) sees their own unless -a/--allusers or -u is given;
-a and -u for someone else are refused for non-operators, and so is -j for a
job that belongs to someone else (rather than silently printing nothing, so
the user learns why).

Window: -S/-E bound the time a set was requested. Without -j the default
start is midnight today (local time), like sacct; with -j there is no
default bound. -E defaults to no upper bound.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .. import access
from ..errors import BadValueError, NotFound, PermissionDenied
from ..inventory.repository import SetFilter
from .. import states as S
from ..slurm.jobenv import MAX_ID, is_sluid
from ..slurm.slurmtime import parse_time


@dataclass(frozen=True)
class Selection:
    jobs: str | None = None
    users: str | None = None
    start: str | None = None
    end: str | None = None
    states: str | None = None
    all_users: bool = False
    partitions: str | None = None


def split_sluids(text: str) -> tuple[str, list[str]]:
    """The job list without its SLUIDs (Slurm 25.11+: "s" + 13 base32
    characters, one run as JOBID.RESTART is), and the SLUIDs."""
    items = _items(text, "job list")
    sluids = [i for i in items if is_sluid(i)]
    return ",".join(i for i in items if not is_sluid(i)), sluids


def parse_jobs(text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """'1001,1002.3' -> ([1001], [(1002, 3)]): a bare id means every run of the job."""
    ids, runs = [], []
    if not text:
        return ids, runs
    for item in _items(text, "job list"):
        head, dot, tail = item.partition(".")
        refuse_array_or_het(item, head)
        if not (head.isascii() and head.isdigit()) or (dot and not (tail.isascii() and tail.isdigit())):
            raise BadValueError(what="job id", value=item, why="expected JOBID or JOBID.RESTART")
        if int(head) > MAX_ID or (dot and int(tail) > MAX_ID):
            raise BadValueError(what="job id", value=item, why=f"larger than Slurm's largest id {MAX_ID}")
        if dot:
            runs.append((int(head), int(tail)))
        else:
            ids.append(int(head))
    return ids, runs


def refuse_array_or_het(item: str, head: str, what: str = "job id") -> None:
    """sacct's ARRAYJOB_TASK and HETJOB+COMPONENT have no meaning here: every
    array task and het component runs its own Prolog under its own
    SLURM_JOB_ID, which is what slurm-snap records it by."""
    if "_" in head or "+" in head:
        kind = "array task" if "_" in head else "heterogeneous job component"
        raise BadValueError(what=what, value=item,
                            why=f"slurm-snap records each {kind} under its own job id (its SLURM_JOB_ID, "
                                "which squeue and sacct print as JobIDRaw): pass that id")


def parse_states(text: str) -> list[str]:
    from .rows import UNPROTECTED

    known = S.STATES + (UNPROTECTED,)
    out = []
    for item in _items(text, "state list"):
        state = item.upper()
        if state not in known:
            raise BadValueError(what="state", value=item, why=f"unknown state; one of {', '.join(known)}")
        out.append(state)
    return out


def parse_users(text: str) -> list[str]:
    """Names or numeric UIDs, as sacct -u takes them; a UID becomes its name
    (sets record the owner's name). A name that is all digits wins over the
    UID, as Slurm's own lookup does."""
    import pwd

    out = []
    for item in _items(text, "user list"):
        if item.isascii() and item.isdigit():
            try:
                pwd.getpwnam(item)
            except KeyError:
                try:
                    item = pwd.getpwuid(int(item)).pw_name
                except (KeyError, OverflowError):
                    raise BadValueError(what="user", value=item, why="no user has this UID") from None
        out.append(item)
    return out


def parse_partitions(text: str) -> list[str]:
    return _items(text, "partition list")


def _items(text: str, what: str) -> list[str]:
    items = [i.strip() for i in text.split(",")]
    if not items or any(not i for i in items):
        raise BadValueError(what=what, value=text, why="empty item")
    return items


def build_filter(sel: Selection, *, cfg, caller: access.Caller, repo, now: dt.datetime,
                 tz: dt.tzinfo | None = None) -> SetFilter:
    # An option given empty (-j "") is an error naming it, not "no filter".
    job_ids, job_runs = [], []
    if sel.jobs is not None:
        plain, sluids = split_sluids(sel.jobs)
        job_ids, job_runs = parse_jobs(plain)
        known = repo.runs_for_sluids(sluids)
        for s in sluids:
            if s not in known:
                raise NotFound(what="job run with SLUID", value=s)
            job_runs.append(known[s])
    users = parse_users(sel.users) if sel.users is not None else []
    states = parse_states(sel.states) if sel.states is not None else []
    partitions = parse_partitions(sel.partitions) if sel.partitions is not None else []
    operator = access.is_operator(cfg, caller)
    if not operator:
        if sel.all_users:
            raise PermissionDenied(why=f"-a/--allusers is for operators; {caller.name} sees only their own jobs")
        others = [u for u in users if u != caller.name]
        if others:
            raise PermissionDenied(why=f"{caller.name} may not list the jobs of {others[0]}: "
                                       "only operators see other users' jobs")
        access.require_jobs(cfg, caller, repo.report_job_owners(job_ids + [j for j, _ in job_runs]))
        users = [caller.name]
    elif not users and not sel.all_users and not (job_ids or job_runs):
        if not (caller.uid == 0 and not caller.via_sudo):
            users = [caller.name]
    # past=True is what sacct passes for -S and -E. An empty -S is refused
    # (libslurm's "no time"), not read as "no bound".
    start = parse_time(sel.start, now=now, tz=tz, what="start time (-S)", past=True) if sel.start is not None else None
    end = parse_time(sel.end, now=now, tz=tz, what="end time (-E)", past=True) if sel.end is not None else None
    if start is None and not (job_ids or job_runs):
        start = parse_time("today", now=now, tz=tz, past=True)
    if start is not None and end is not None and end < start:
        raise BadValueError(what="end time (-E)", value=sel.end, why=f"is before the start time {sel.start or 'today'}")
    return SetFilter(job_ids=job_ids, job_runs=job_runs, users=users, states=states, partitions=partitions,
                     start=start, end=end)
