"""Who is asking, and may they act on this job?

The rule is Slurm's own: the job's owner or an operator, nobody else.
Operators are root, the configured users (SlurmUser among them on most sites)
and members of the configured group. When slurm-snap runs as root through a
sudo rule, the caller is the user sudo names, not root: otherwise a sudo rule
meant to let users snapshot their own jobs would make everyone an operator.
"""
from __future__ import annotations

import grp
import os
import pwd

from .record import record
from .errors import PermissionDenied


@record
class Caller:
    uid: int
    name: str
    via_sudo: bool = False


# Set once in a slurm-snap service child that runs one user's request: the
# caller is who MUNGE vouched for, not the (root) process running it.
_acting_for: Caller | None = None


def act_for(caller: Caller) -> None:
    global _acting_for
    _acting_for = caller


def current_caller(environ=None) -> Caller:
    if _acting_for is not None:
        return _acting_for
    env = os.environ if environ is None else environ
    uid = os.getuid()
    via_sudo = False
    raw = env.get("SUDO_UID", "")
    # ASCII digits only: str.isdigit() also takes other scripts' digits ("١٢" -> 12).
    if uid == 0 and raw.isascii() and raw.isdigit():
        uid = int(env["SUDO_UID"])
        via_sudo = True
    return Caller(uid=uid, name=user_name(uid), via_sudo=via_sudo)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def is_operator(cfg, caller: Caller) -> bool:
    if caller.uid == 0 and not caller.via_sudo:
        return True
    if caller.name in cfg.access.operator_users:
        return True
    group = cfg.access.operator_group
    if group:
        try:
            g = grp.getgrnam(group)
        except KeyError:
            return False
        if caller.name in g.gr_mem:
            return True
        try:
            return pwd.getpwuid(caller.uid).pw_gid == g.gr_gid
        except KeyError:
            return False
    return False


def require_owner_or_operator(cfg, caller: Caller, *, owner_uid: int | None, owner_name: str, what: str) -> None:
    if is_operator(cfg, caller):
        return
    if (owner_uid is not None and caller.uid == owner_uid) or caller.name == owner_name:
        return
    raise PermissionDenied(why=f"{what} belongs to {owner_name}; {caller.name} is neither its owner nor an operator")


def require_jobs(cfg, caller: Caller, owners) -> None:
    """Refuse unless the caller is an operator or owns every run of every job.

    `owners` maps job id -> owner names of its runs, as the inventory has them
    (Repository.report_job_owners): the one check behind every form that
    names a job, so that "not yours" is exit 4 whichever command asks, and
    is decided before anything about the job (whether it has a set) is said.
    """
    if is_operator(cfg, caller):
        return
    for job_id, names in sorted(owners.items()):
        foreign = sorted(set(names) - {caller.name})
        if foreign:
            raise PermissionDenied(why=f"job {job_id} belongs to {foreign[0]}; "
                                       f"{caller.name} is neither its owner nor an operator")
