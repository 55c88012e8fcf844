"""The one error tree of slurm-snap.

Every error a user or admin can cause is a subclass of SnapError with a message
template and an exit code. Library code raises these; the CLI maps them to an
exit status at one boundary (slurm_snap.forwarding.run, which cli.main wraps). Anything else escaping is a
bug and exits with INTERNAL.
"""
from __future__ import annotations

# Exit codes are part of the interface: scripts and hooks test them. The README
# lists them; never renumber.
OK = 0
INTERNAL = 1
USAGE = 2
CONFIG = 3
PERMISSION = 4
NOT_FOUND = 5
CONFLICT = 6
BACKEND = 7
TIMEOUT = 8
INVENTORY = 9
UNSUPPORTED = 10
CONTROLLER = 11

EXIT_CODES = {
    OK: "success",
    INTERNAL: "internal error (a bug: please report it)",
    USAGE: "bad command-line argument or input value",
    CONFIG: "configuration file invalid or inconsistent with the system",
    PERMISSION: "not allowed: the caller is neither the job's owner nor an operator",
    NOT_FOUND: "job, set, volume or snapshot not found",
    CONFLICT: "conflict: another operation holds the job or volume, or a state change is not allowed",
    BACKEND: "a snapshot backend's tool failed",
    TIMEOUT: "a deadline passed (barrier, backend call, restore drill)",
    INVENTORY: "the inventory database is unreachable, failed, not readable by this user (users go through the "
               "slurm-snap service), or not initialised (run `slurm-snap db upgrade`)",
    UNSUPPORTED: "the backend does not support this operation",
    CONTROLLER: "this command runs on the controller: this host reaches the inventory only through the "
                "slurm-snap service",
}


class SnapError(Exception):
    """Base of every expected error. `template` is formatted with the kwargs."""

    exit_code = INTERNAL
    template = "{message}"

    def __init__(self, message: str | None = None, **kwargs):
        self.kwargs = kwargs
        if message is None:
            try:
                message = self.template.format(**kwargs)
            except (KeyError, IndexError):
                message = f"{self.template} {kwargs}"
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:  # one line, no traceback, for the CLI
        return self.message


class UsageError(SnapError):
    exit_code = USAGE


class CheckpointDirError(UsageError):
    """No volume the job declared can hold its checkpoints (client/checkpoint_dir.py)."""

    template = "no place for the checkpoints of job {job}: {why}"


class BadValueError(UsageError):
    """A user-supplied value is wrong; the message names the value."""

    template = "invalid {what} {value!r}: {why}"


class PathError(BadValueError):
    template = "invalid path {value!r}: {why}"

    def __init__(self, value, why: str):
        super().__init__(what="path", value=value, why=why)


class VolumesRefused(BadValueError):
    """The node Prolog refused declared volumes (the user's declaration, not
    the node, is at fault): recorded, told to the job, the job runs without them."""

    template = "prolog on {node} refused {count} declared volume(s), the job runs without their snapshots: {first}"

    def __init__(self, node: str, refused, *, recorded: bool = False):
        first = "; ".join(f"{r.path!r}: {r.why}" for r in refused)
        SnapError.__init__(self, node=node, count=len(refused), first=first, what="--snapshot-volumes",
                           value=refused[0].path if refused else "", why=first)
        self.refused = list(refused)
        # True when the refusal is in the inventory already (the hook runner
        # then adds no second, less precise, failure record).
        self.recorded = recorded


class ConfigError(SnapError):
    exit_code = CONFIG
    template = "{path}: {key}: {why}"


class PermissionDenied(SnapError):
    exit_code = PERMISSION
    template = "permission denied: {why}"


class NotFound(SnapError):
    exit_code = NOT_FOUND
    template = "{what} {value!r} not found"


class Conflict(SnapError):
    exit_code = CONFLICT


class InvalidTransition(Conflict):
    template = "snapshot set {set_id}: state change {old} -> {new} is not allowed"


class Busy(Conflict):
    template = "{what} {value!r} is busy: {why}"


class AlreadyExists(Conflict):
    template = "{what} {value!r} already exists"


class SnapshotCollision(Conflict):
    template = "{backend}: snapshot name {name!r} is already used by {other!r}, not {volume!r}"


class BackendError(SnapError):
    exit_code = BACKEND
    template = "{backend}: {why}"


class ToolMissing(BackendError):
    exit_code = CONFIG
    template = "{backend}: required tool {tool!r} not found{where}"

    def __init__(self, backend: str, tool: str, where: str = ""):
        super().__init__(backend=backend, tool=tool, where=f" on {where}" if where else "")


class CommandFailed(BackendError):
    template = "{argv0} exited with status {status}: {stderr}"


class OtherFilesystem(BackendError):
    """A clone cannot go where it was asked (another filesystem or pool); a
    restore drill then clones next to the volume instead."""
    template = "{backend}: clone target {value!r} {why}"


class Unsupported(SnapError):
    exit_code = UNSUPPORTED
    template = "{backend} does not support {verb}"


class Timeout(SnapError):
    exit_code = TIMEOUT
    template = "{what} did not finish within {seconds:g} s"


class TransportError(BackendError):
    template = "{host}: {why}"


class SetIncomplete(BackendError):
    """A snapshot set ended PARTIAL or FAILED; it is recorded with this reason."""

    template = "snapshot set {set_id} of job {job_id} ended {state}: {reason}"


class BarrierTimeout(Timeout):
    """The barrier deadline passed before every rank acknowledged; the set is
    recorded with the label it earned (crash-consistent, or FAILED when
    crash-consistent sets are not allowed)."""

    template = "snapshot set {set_id} of job {job_id} ended {state} {consistency}: {reason}"


class InventoryError(SnapError):
    exit_code = INVENTORY
    template = "inventory {url}: {why}"


class InventoryNotInitialised(InventoryError):
    """The inventory is missing, empty, or at an older schema: only `db
    upgrade` creates or migrates it, so every other command says so."""

    template = "inventory {url}: not initialised: run `slurm-snap db upgrade` ({why})"


class InventoryNotReadable(InventoryError):
    """A SQLite inventory this user may not open: it is root's, as it must be
    (it maps every user's jobs to their data). Users reach it through the
    slurm-snap service instead."""

    template = ("inventory {url}: {user} cannot read it ({why}); it is root's: users run report, show, snapshot "
                "and restore-test through the slurm-snap service (the admin runs `slurm-snap serve` on the "
                "controller and gives users a config whose [inventory] url is slurm-snap://ADDR:PORT; README, "
                "admin step 7), everything else runs as root on the controller")


class ControllerOnly(SnapError):
    """A command that opens the inventory itself, on a host whose config names
    the slurm-snap service (a login host, a node): it runs on the controller,
    whoever asks (the job's owner, an operator or root alike)."""

    exit_code = CONTROLLER
    template = ("{command} runs on the controller: this host reaches the inventory only through the slurm-snap "
                "service ({url}), which runs report, show, snapshot and restore-test for users and the hooks' "
                "recording; run `slurm-snap {command}` on the controller")


class ServiceUnavailable(SnapError):
    """This host reaches the inventory only through the slurm-snap service on
    the controller, and that did not work; the message says what to install
    or start, in one sentence."""

    exit_code = INVENTORY
    template = "{why}"


class SpoolError(SnapError):
    """A node could not keep what it cut in its spool (slurm_snap/spool): the
    directory is full past its bound, its disk is full with no reserve left,
    or it is not writable. The part itself is cut; the message says where."""

    exit_code = INVENTORY
    template = "spool {directory}: {why}"


class RestoreFailed(Conflict):
    """A restore drill ran and the set did not restore: the set is FAILED_RESTORE."""

    template = "restore test {test_id} of set {set_id} failed: {reason}"
