"""Where a drill may restore to: never onto live data, never out of residency.

A drill writes (the clones are writable, the program runs in them), so its
namespace must not be, lie inside, or contain any volume a job declared, nor
the per-job volume trees where future jobs' volumes will appear. Paths are
compared after resolving symlinks, component by component.
"""
from __future__ import annotations

import fnmatch
import os
from typing import Iterable

from ..errors import BadValueError, PermissionDenied


def _parts(path: str) -> list[str]:
    return [p for p in os.path.realpath(path).split("/") if p]


def _template_parts(prefix: str) -> list[str]:
    # "{node}" in a node-local prefix matches any one component.
    return [p.replace("{node}", "*") for p in prefix.split("/") if p]


def _match(pattern: str, component: str) -> bool:
    return fnmatch.fnmatchcase(component, pattern) if "*" in pattern else pattern == component


def relation(target: str, live: str, *, template: bool = False) -> str | None:
    """'is', 'is inside', 'contains' or None, for target vs a live path (or prefix template)."""
    t = _parts(target)
    lv = _template_parts(live) if template else _parts(live)
    n = min(len(t), len(lv))
    if not all(_match(p, c) for p, c in zip(lv[:n], t[:n])):
        return None
    if len(t) == len(lv):
        return "is"
    return "is inside" if len(t) > len(lv) else "contains"


def check_target(target: str, live: Iterable[tuple[str, int]], cfg, *, protected: Iterable[str] = ()) -> str:
    """Refuse (BadValueError naming the target and the live path) or return the resolved target."""
    if not isinstance(target, str) or not os.path.isabs(target):
        raise BadValueError(what="restore target", value=target, why="must be an absolute path")
    if any(c in target for c in "\0\n\r"):
        raise BadValueError(what="restore target", value=target, why="must not contain NUL or newlines")
    for path, job_id in live:
        rel = relation(target, path)
        if rel:
            raise BadValueError(what="restore target", value=target,
                                why=f"{rel} live volume {path} of job {job_id}; drills never write live data")
    for path in protected:
        rel = relation(target, path)
        if rel:
            raise BadValueError(what="restore target", value=target,
                                why=f"{rel} snapshot {path}; snapshots are read-only")
    for vc in cfg.volume_classes:
        if not vc.per_job:
            continue
        jobs_tree = f"{vc.prefix}/jobs"
        rel = relation(target, jobs_tree, template=True)
        if rel == "is inside":
            # Only <jobs>/<job id>... is (or will be) live; <jobs>/.snapshots is not.
            depth = len(_template_parts(jobs_tree))
            rel = rel if _parts(target)[depth][:1].isdigit() else None
        if rel:
            raise BadValueError(what="restore target", value=target,
                                why=f"{rel} {jobs_tree}, where class {vc.name!r} creates jobs' live volumes")
    return os.path.realpath(target)


def check_caller_may_write(target: str, uid: int, name: str) -> None:
    """A target a non-operator names must be one they could create themselves.

    The drill runs as root: without this, `restore-test --target /etc` through
    the sudo rule would make root create directories and clones anywhere.
    Judged on the nearest existing ancestor of the resolved target (symlinks
    the caller controls are already resolved by check_target).
    """
    import pwd

    probe = os.path.realpath(target)
    while not os.path.lexists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    st = os.stat(probe)
    try:
        pw = pwd.getpwuid(uid)
        groups = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except KeyError:
        groups = set()
    if st.st_uid == uid:
        ok = bool(st.st_mode & 0o200)
    elif st.st_gid in groups:
        ok = bool(st.st_mode & 0o020)
    else:
        ok = bool(st.st_mode & 0o002)
    if not ok:
        raise PermissionDenied(why=f"restore target {target!r}: {name} may not write {probe} "
                                   "(a drill only restores where its caller could write)")


def check_residency(cfg, target: str, snapshots) -> None:
    """With restore.enforce_residency, every snapshot's site/region must be this restore host's."""
    if not cfg.restore.enforce_residency:
        return
    for snap in snapshots:
        for key in ("site", "region"):
            want = getattr(snap, key, "") or ""
            if not want:
                vc = cfg.volume_class(snap.volume.volume_class) if getattr(snap, "volume", None) else None
                want = getattr(vc, key, "") if vc else ""
            have = getattr(cfg.restore, key)
            if want and want != have:
                raise BadValueError(
                    what="restore target", value=target,
                    why=f"is in {key} {have or '(restore.' + key + ' unset)'} but snapshot {snap.ref} "
                        f"must stay in {key} {want!r} (restore.enforce_residency)")
