"""The snapshot-set state machine: pure data, used by the repository to refuse
any state change that is not drawn here (docs/design.md has the picture);
and the states of a set's parts and of their copies, spelled once.

A set only moves forward. COMPLETE is reachable only through CUT, and only the
finalizer that has checked every barrier, every volume and every manifest may
take that step, so a crash anywhere before it leaves the set in a non-terminal
state that `repair` can find.
"""
from __future__ import annotations

PENDING = "PENDING"            # requested, nothing done yet
QUIESCING = "QUIESCING"        # signal sent, waiting for the barriers
CUTTING = "CUTTING"            # cutting the volumes
CUT = "CUT"                    # every part recorded, not yet finalized
COMPLETE = "COMPLETE"          # finalized; the consistency label says how good
PARTIAL = "PARTIAL"            # some declared volume has no snapshot
FAILED = "FAILED"              # nothing usable
ROLLED_BACK = "ROLLED_BACK"    # aborted and its snapshots removed (repair)
VERIFIED = "VERIFIED"          # a restore drill passed
FAILED_RESTORE = "FAILED_RESTORE"  # the latest restore drill failed
DELETING = "DELETING"          # prune started removing its snapshots
DELETED = "DELETED"            # pruned; the row stays for the record

STATES = (PENDING, QUIESCING, CUTTING, CUT, COMPLETE, PARTIAL, FAILED, ROLLED_BACK,
          VERIFIED, FAILED_RESTORE, DELETING, DELETED)

ACTIVE = frozenset({PENDING, QUIESCING, CUTTING, CUT})
RESTORABLE = frozenset({COMPLETE, VERIFIED, FAILED_RESTORE})
TERMINAL_GONE = frozenset({DELETED})

TRANSITIONS: dict[str, frozenset[str]] = {
    PENDING: frozenset({QUIESCING, CUTTING, FAILED, ROLLED_BACK}),
    QUIESCING: frozenset({CUTTING, FAILED, ROLLED_BACK}),
    CUTTING: frozenset({CUT, PARTIAL, FAILED, ROLLED_BACK}),
    CUT: frozenset({COMPLETE, PARTIAL, FAILED}),
    # -> PARTIAL: a node was lost with the only copy of a node-local part (repair).
    COMPLETE: frozenset({VERIFIED, FAILED_RESTORE, PARTIAL, DELETING}),
    VERIFIED: frozenset({VERIFIED, FAILED_RESTORE, PARTIAL, DELETING}),
    FAILED_RESTORE: frozenset({VERIFIED, FAILED_RESTORE, PARTIAL, DELETING}),
    PARTIAL: frozenset({DELETING}),
    FAILED: frozenset({DELETING}),
    ROLLED_BACK: frozenset({DELETING}),
    DELETING: frozenset({DELETED}),
    DELETED: frozenset(),
}

# A part's states (one snapshot row of a set: one volume on one node).
PART_CUT = "CUT"            # the volume's snapshot exists
PART_MISSING = "MISSING"    # it could not be cut; the row's error says why
PART_LOST = "LOST"          # its node or disk is gone (protocol.nodeloss); a copy elsewhere may survive
PART_DELETED = "DELETED"    # removed (prune, or repair's rollback)
PART_STATES = (PART_CUT, PART_MISSING, PART_LOST, PART_DELETED)
# Parts a restore may still use: cut, or lost with a copy on another node.
PART_HELD = frozenset({PART_CUT, PART_LOST})

# A part copy's states (a node-local part put on another node: part_copy rows).
COPY_OK = "OK"              # the copy is there
COPY_FAILED = "FAILED"      # the copy could not be made; its error says why
COPY_LOST = "LOST"          # the node holding it is gone
COPY_DELETED = "DELETED"    # removed (prune, or the drill that placed it ended)
COPY_STATES = (COPY_OK, COPY_FAILED, COPY_LOST, COPY_DELETED)

# A drill node's states (restore_node rows: one node of a drill run as a Slurm
# job, whose Prolog makes that node's clones and whose Epilog removes them).
NODE_PLANNED = "PLANNED"          # the drill listed it; its Prolog has not reported
NODE_READY = "READY"              # its Prolog made every clone of the node
NODE_FAILED = "FAILED"            # its Prolog could not; the row's error says why
NODE_STATES = (NODE_PLANNED, NODE_READY, NODE_FAILED)
# ...and what its Epilog reported ("" before it did).
NODE_CLEANED = "CLEANED"          # every clone of the node is gone
NODE_LEFT = "LEFT"                # some could not be removed (cleanup_error); the node agent retries
NODE_CLEANUPS = (NODE_CLEANED, NODE_LEFT)

# A node task's states (node_task rows: work a node's agent pulls, nodetasks/).
TASK_PENDING = "PENDING"          # waiting for the node's agent
TASK_LISTENING = "LISTENING"      # a receive, listening for its sender's agent
TASK_DONE = "DONE"
TASK_FAILED = "FAILED"            # error says why
TASK_OPEN = (TASK_PENDING, TASK_LISTENING)
TASK_STATES = (TASK_PENDING, TASK_LISTENING, TASK_DONE, TASK_FAILED)

# Consistency labels: honest, never optimistic.
APP = "app-consistent"
CRASH = "crash-consistent"
NONE = "none"
LABELS = (APP, CRASH, NONE)
# Labels that hold a restorable point: what a restore drill may use and
# retention counts as restorable ("none" holds nothing).
DRILLABLE = frozenset({APP, CRASH})

# What a job or a request may ask for (--snapshot-consistency, snapshot
# --consistency, protocol.default_consistency): the label is earned, not asked.
WANT_APP = "app"
WANT_CRASH = "crash"
WANTED = (WANT_APP, WANT_CRASH)

# What triggered a set.
TRIGGERS = ("preempt", "manual", "periodic", "epilog")


def allowed(old: str, new: str) -> bool:
    return new in TRANSITIONS.get(old, frozenset())


def drillable(state: str, consistency: str) -> bool:
    """A set a restore drill may use: restorable and holding a consistent point."""
    return state in RESTORABLE and consistency in DRILLABLE
