"""The spare namespace a drill restores into, and how it is cleaned up.

    <restore_root>/<set>-<test>/            root-owned 0755: the user cannot rename or
                                            replace the clones (cleanup runs as root)
        drill.json                          the crash journal (journal.py): what was (or
                                            is being) cloned, by whom (host, pid)
        <class>[@<node>]/                   one writable clone per snapshot of the set
        .marker/                            owned by the job's user, 0700: marker file,
                                            --submit job script, spec and result

The journal is written before each clone is attempted, so a drill killed at
any point leaves a record from which a later run removes every clone it may
have made (`cleanup_namespace`); the clone verbs are idempotent in that
direction (a missing clone is fine). A drill placed on other nodes also lists
each clone's node (`Clone.on`) and the copies of node-local parts it brought
there (`Journal.copies`), removed on their node after the clones
(`remove_drill`, which also marks them deleted in the inventory).
"""
from __future__ import annotations

import os
import shutil
import socket
import stat

from ..backends.base import Backend, SnapshotRef
from ..backends.transport import LocalTransport
from ..errors import BackendError, BadValueError, Unsupported
from ..fsio import is_temporary
from ..paths import open_dirs_nofollow
from . import journal as journal_mod
from .journal import Clone
from .parts import BackendFor

ALT_PREFIX = ".slurm-snap-restore-"
MARKER_DIR = ".marker"
MARKER_FILE = "first-step"


def namespace_path(base: str, set_id: int, test_id: int) -> str:
    return os.path.join(base, f"{set_id}-{test_id}")


def clone_name(volume_class: str, node: str, multi_node: bool) -> str:
    return f"{volume_class}@{node}" if (node and multi_node) else volume_class


def this_host() -> str:
    return socket.gethostname()


def make_namespace(base: str, ns: str, uid: int, gid: int, *, base_must_be_ours: bool = False) -> str:
    """Create the namespace (refusing an existing one) and the owner's marker dir.

    `base` was checked after resolving symlinks; it is created without
    following any, so a component swapped for a link after the check makes
    this fail instead of making root create the namespace where the link
    points."""
    if os.path.dirname(ns.rstrip("/")) != base.rstrip("/"):
        raise BadValueError(what="drill namespace", value=ns, why=f"is not directly inside {base}")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    parent, _made = open_dirs_nofollow(base, 0o755)
    try:
        if base_must_be_ours:
            # restore_root often sits in a sticky world-writable dir (/var/tmp):
            # a user who created it first would own where root puts clones.
            st = os.fstat(parent)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise BadValueError(what="restore root", value=base,
                                    why=f"is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}; "
                                        f"it must be owned by uid {os.geteuid()} and writable by it alone")
        name = os.path.basename(ns.rstrip("/"))
        os.mkdir(name, 0o755, dir_fd=parent)   # FileExistsError: never reuse a namespace
        nsfd = os.open(name, flags, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        os.fchmod(nsfd, 0o755)  # whatever the umask
        os.mkdir(MARKER_DIR, 0o700, dir_fd=nsfd)
        os.chown(MARKER_DIR, uid, gid, dir_fd=nsfd, follow_symlinks=False)
    finally:
        os.close(nsfd)
    return os.path.join(ns, MARKER_DIR)


def _inside(path: str, ns: str) -> bool:
    return path.startswith(ns.rstrip("/") + "/")


def remove_clone(backend: Backend, path: str, ns: str) -> bool:
    """Remove one writable clone through its backend; False if it was already gone.

    Refuses anything that is not directly a real directory inside the
    namespace: a crafted drill.json must not make root delete a live volume.
    """
    if not _inside(path, ns) or os.path.dirname(path.rstrip("/")) != ns.rstrip("/"):
        raise BadValueError(what="clone path", value=path, why=f"is not directly inside the drill namespace {ns}")
    local = isinstance(backend.transport, LocalTransport)
    if local:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(st.st_mode):
            os.unlink(path)  # never follow it
            return True
    try:
        return bool(backend.delete_clone(path))
    except Unsupported:
        pass
    if local:
        shutil.rmtree(path)
        return True
    raise BackendError(backend=backend.name, why=f"cannot remove clone {path} on {backend.transport.where}")


def alt_namespace(snapshot_ref: str, ns: str) -> str:
    """Next to the snapshot, so on its filesystem: where a clone goes when the
    restore root is on another filesystem (btrfs and reflink clones cannot
    cross filesystems). Hidden, so backends' list() never mistakes it."""
    return os.path.join(os.path.dirname(snapshot_ref.rstrip("/")), f"{ALT_PREFIX}{os.path.basename(ns.rstrip('/'))}")


def cleanup_namespace(ns: str, backend_for_clone, backend_on=None) -> list[str]:
    """Remove every clone the journal lists, then the copies it brought, then the namespace(s).
    Returns errors (empty = clean).

    `backend_for_clone(clone)` builds the backend of one journal Clone;
    `backend_on(class, node)` a node-local class's backend on a node, for the copies.
    """
    errors: list[str] = []
    try:
        journal = journal_mod.read(ns)
    except BadValueError as exc:  # not one a drill wrote: remove nothing it names
        return [f"{ns}: {exc}"]
    clones = journal.clones if journal else ()
    copies = journal.copies if journal else ()
    allowed = {ns.rstrip("/"), *(a.rstrip("/") for a in (journal.namespaces if journal else ()))}
    # Keyed by host too: node-local volumes at the same path on several nodes
    # have their alternative namespaces at the same path on each node.
    alt_backend: dict[tuple[str, str], tuple[str, Backend]] = {}
    for clone in clones:
        where = clone.ns.rstrip("/")
        try:
            if where not in allowed:
                raise BadValueError(what="clone namespace", value=where, why=f"not listed in {journal_mod.FILE}")
            backend = backend_for_clone(clone)
            remove_clone(backend, clone.path, where)
            if where != ns.rstrip("/"):
                alt_backend.setdefault((where, backend.transport.where), (where, backend))
        except Exception as exc:  # keep going: one stuck clone must not leave the others
            errors.append(f"{clone.path}: {exc}")
    for copy in copies:
        # A copy is a received snapshot at its original's path on another
        # node; deleting it there is deleting a snapshot, through the backend.
        try:
            if backend_on is None:
                raise BadValueError(what="drill copies", value=copy.ref, why="no backend to remove them with")
            ref = SnapshotRef(backend=copy.backend, volume=copy.volume, name=copy.name, ref=copy.ref,
                              path=copy.path or None)
            backend_on(copy.volume_class, copy.on).delete(ref)
        except Exception as exc:
            errors.append(f"{copy.error_prefix()} {exc}")
    for alt, backend in alt_backend.values():
        try:
            _remove_empty_dir(backend, alt)
        except Exception as exc:
            errors.append(f"{alt}: {exc}")
    if errors:
        return errors
    try:
        # Only our own files remain: the marker dir (user-owned content, no
        # mounts, no subvolumes) and the journal.
        marker_dir = os.path.join(ns, MARKER_DIR)
        if os.path.lexists(marker_dir):
            shutil.rmtree(marker_dir)
        ours = [n for n in os.listdir(ns) if n == journal_mod.FILE or is_temporary(n, journal_mod.FILE)]
        leftovers = [n for n in os.listdir(ns) if n not in ours]
        if leftovers:
            return [f"{ns}: not removed, unexpected entries {sorted(leftovers)}"]
        for n in ours:
            os.unlink(os.path.join(ns, n))
        os.rmdir(ns)
    except FileNotFoundError:
        pass
    except OSError as exc:
        errors.append(f"{ns}: {exc}")
    return errors


def _remove_empty_dir(backend: Backend, path: str) -> None:
    if isinstance(backend.transport, LocalTransport):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
    elif "find" in backend.tools:
        backend.run("find", path, "-maxdepth", "0", "-empty", "-delete", ok=(0, 1))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def resolver_for_entries(backend_for: BackendFor, rows_by_id: dict, backend_on=None):
    """backend_for_clone for cleanup_namespace, from the inventory's snapshot
    rows; a clone made on another node than its snapshot's (`Clone.on`) through
    `backend_on(class, node)`."""
    def resolve(clone: Clone) -> Backend:
        if clone.on:
            if backend_on is None:
                raise BadValueError(what="clone node", value=clone.on, why="no backend for other nodes")
            return backend_on(clone.volume_class, clone.on)
        row = rows_by_id.get(clone.snapshot_id)
        if row is None:
            raise BadValueError(what="snapshot id", value=clone.snapshot_id,
                                why=f"listed in {journal_mod.FILE} but not in the inventory")
        return backend_for(row)
    return resolve


def remove_drill(inventory, ns: str, snapshots, backend_for: BackendFor, backend_on) -> list[str]:
    """Remove a drill's clones and the copies it brought, each on its node;
    the copies removed no longer count as held (part_copy DELETED). Returns
    errors (empty = clean)."""
    try:
        journal = journal_mod.read(ns)
    except BadValueError:
        journal = None   # cleanup_namespace says why and removes nothing
    errs = cleanup_namespace(ns, resolver_for_entries(backend_for, {s.id: s for s in snapshots}, backend_on),
                             backend_on)
    if journal is not None and journal.copies:
        with inventory.session() as repo:
            for c in journal.copies:
                if not any(e.startswith(c.error_prefix()) for e in errs):
                    repo.mark_copy_deleted(journal.set_id, node=c.on, ref=c.ref, purpose="drill")
    return errs
