"""User-supplied paths, resolved without following symlinks out of the
allowed roots.

slurm-snap acts as root on paths users name. A path is accepted only if it is
absolute, clean (no "." or ".." components, no control characters, valid
UTF-8, bounded length) and lies below an allowed root with no symlink in any
component below that root: a symlink would let a user make root snapshot,
clone or delete something they do not own. The check walks the path with
openat(O_NOFOLLOW) so a symlink swapped in mid-walk is caught too; callers
that act later re-check right before acting.
"""
from __future__ import annotations

import errno
import os
import stat

from .record import record
from .errors import PathError

MAX_PATH = 4096
MAX_COMPONENT = 255


def check_syntax(path) -> str:
    """Reject what no filesystem check is needed for. Returns the path as str."""
    if isinstance(path, bytes):
        try:
            path = path.decode("utf-8")
        except UnicodeDecodeError:
            raise PathError(path, "not valid UTF-8") from None
    if not isinstance(path, str):
        raise PathError(path, "not a string")
    if path == "":
        raise PathError(path, "empty")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
        raise PathError(path[:64] + "...", f"longer than {MAX_PATH} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise PathError(path, "contains a control character (newline, tab, NUL ...)")
    if any(0xDC80 <= ord(c) <= 0xDCFF for c in path):
        raise PathError(path, "not valid UTF-8")
    if not path.startswith("/"):
        raise PathError(path, "not an absolute path")
    parts = path.split("/")[1:]
    if path != "/" and path.endswith("/"):
        parts = parts[:-1]
    for part in parts:
        if part in (".", ".."):
            raise PathError(path, f"contains a {part!r} component")
        if part == "":
            raise PathError(path, "contains an empty component (//)")
        if len(part.encode()) > MAX_COMPONENT:
            raise PathError(path, f"has a component longer than {MAX_COMPONENT} bytes")
    return path.rstrip("/") or "/"


def under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def root_for(path: str, roots) -> str | None:
    best = None
    for r in roots:
        if under(path, r) and (best is None or len(r) > len(best)):
            best = r.rstrip("/") or "/"
    return best


@record
class Resolved:
    path: str
    root: str
    uid: int
    gid: int
    mode: int
    exists: bool
    ino: int = -1


def resolve(path, roots, *, must_exist: bool = True) -> Resolved:
    """Validate `path` against `roots` walking it with O_NOFOLLOW.

    A missing final component is allowed when must_exist is False (the Prolog
    creates per-job volumes); a missing intermediate one is not.
    """
    path = check_syntax(path)
    root = root_for(path, roots)
    if root is None:
        raise PathError(path, f"outside the allowed roots ({', '.join(roots) or 'none configured'})")
    rel = [p for p in path[len(root):].split("/") if p]
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise PathError(path, f"allowed root {root} unusable: {exc.strerror}") from None
    try:
        for i, part in enumerate(rel):
            last = i == len(rel) - 1
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if last and not must_exist:
                    return Resolved(path, root, -1, -1, 0, False)
                raise PathError(path, f"{'/'.join([root.rstrip('/')] + rel[:i + 1])} does not exist") from None
            except OSError as exc:
                # EACCES: the submitting user cannot even look there (another user's 0700 directory).
                raise PathError(path, f"{'/'.join([root.rstrip('/')] + rel[:i + 1])}: {exc.strerror}") from None
            if stat.S_ISLNK(st.st_mode):
                raise PathError(path, f"{'/'.join([root.rstrip('/')] + rel[:i + 1])} is a symlink; "
                                      "symlinks below an allowed root are refused")
            if not stat.S_ISDIR(st.st_mode):
                raise PathError(path, "is not a directory" if last else
                                f"{'/'.join([root.rstrip('/')] + rel[:i + 1])} is not a directory")
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                # ELOOP/ENOTDIR here means the component changed under us.
                raise PathError(path, f"changed while being checked ({exc.strerror})") from None
            os.close(fd)
            fd = nfd
        st = os.fstat(fd)
        return Resolved(path, root, st.st_uid, st.st_gid, st.st_mode, True, st.st_ino)
    finally:
        os.close(fd)



def makedirs_nofollow(path: str, mode: int = 0o755) -> list[str]:
    """`mkdir -p` that never follows a symlink (see open_dirs_nofollow);
    returns the directories it created, outermost first."""
    fd, made = open_dirs_nofollow(path, mode)
    os.close(fd)
    return made


def open_dirs_nofollow(path: str, mode: int = 0o755) -> tuple[int, list[str]]:
    """Open the directory at the (already resolved) absolute `path`, creating
    what is missing, never following a symlink: every component is opened
    with O_NOFOLLOW from "/" and made with mkdirat where missing. A component
    that is (or was swapped for) a symlink or a non-directory raises
    PathError, so root creates exactly at the path that was checked, never
    where a link points. Returns (an O_DIRECTORY fd the caller closes, the
    directories created, outermost first)."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise PathError(path, "must be an absolute path")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise PathError(path, "must not contain '.' or '..' components")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    made: list[str] = []
    fd = os.open("/", flags)
    try:
        for i, part in enumerate(parts):
            here = "/" + "/".join(parts[:i + 1])
            try:
                os.mkdir(part, mode, dir_fd=fd)
                made.append(here)
            except FileExistsError:
                pass
            except OSError as exc:
                raise PathError(path, f"cannot create {here}: {exc.strerror}") from None
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                why = exc.strerror
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    # O_DIRECTORY|O_NOFOLLOW on a link gives ENOTDIR on Linux: look again to name it
                    try:
                        is_link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                    except OSError:
                        is_link = False
                    why = "is a symlink" if is_link else "is not a directory"
                raise PathError(path, f"{here} {why}; refusing to create through it") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, made
