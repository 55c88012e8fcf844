"""The snapshot-set state machine: pure data, used by the repository to refuse
any state change that is not drawn here (docs/design.md has the picture);
and the states of a set's parts and of their copies, spelled once.

A set only moves forward. COMPLETE is reachable only through CUT, and only the
finalizer that has checked every barrier, every volume and every manifest may
take that step, so a crash anywhere before it leaves the set in a non-terminal
state that `repair` (or the service's sweeper) can find. The one way back from
a finalized state is a late part (LATE_JOIN below): a node that cut its part
while the service or the database was away delivers it from its spool after
the sweeper finalized the set; the same verdict then judges the set again
with the part in it.
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

# The edges only a late part may take (protocol.recorder's deliver, under the
# set's row lock, after recording the part; `transition(..., late=True)`):
# the verdict over every recorded part decides, so PARTIAL -> COMPLETE only
# when the set's app-consistency evidence (every barrier before every cut,
# every manifest) holds with the part in it, and an event names the node
# whose part came late. DELETED -> DELETING: the part of a set pruned before
# it arrived; prune removes it.
LATE_JOIN = frozenset({(PARTIAL, COMPLETE), (FAILED, COMPLETE), (FAILED, PARTIAL), (DELETED, DELETING)})

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

# Consistency labels: honest, never optimistic. A set's label
# (`consistency`) says what the set is as a point to restore from: a set that
# is not one (PARTIAL, FAILED, ROLLED_BACK: NOT_A_POINT) is always `none`.
# What the parts that were cut are is their own label (`parts_consistency`):
# a PARTIAL set's parts may well be app-consistent (every barrier arrived,
# one node's part missing), which an operator may salvage by hand, but no
# user scanning report's Consistency column should take for a restore point.
APP = "app-consistent"
CRASH = "crash-consistent"
NONE = "none"
LABELS = (APP, CRASH, NONE)
NOT_A_POINT = frozenset({PARTIAL, FAILED, ROLLED_BACK})
# Labels that hold a restorable point: what a restore drill may use and
# retention counts as restorable ("none" holds nothing).
DRILLABLE = frozenset({APP, CRASH})

# What a job or a request may ask for (--snapshot-consistency, snapshot
# --consistency, protocol.default_consistency): the label is earned, not asked.
WANT_APP = "app"
WANT_CRASH = "crash"
WANTED = (WANT_APP, WANT_CRASH)

# What triggered a set.
TRIGGERS = ("preempt", "timelimit", "manual", "periodic", "epilog")
# The sets Slurm's hooks open and cut (no coordinator): the job was preempted,
# or stopped before its time limit (--snapshot-before-timelimit).
HOOK_TRIGGERS = ("preempt", "timelimit")


def allowed(old: str, new: str, *, late: bool = False) -> bool:
    """The table's edges; with `late`, also a late part's (LATE_JOIN)."""
    return new in TRANSITIONS.get(old, frozenset()) or (late and (old, new) in LATE_JOIN)


def drillable(state: str, consistency: str) -> bool:
    """A set a restore drill may use: restorable and holding a consistent point."""
    return state in RESTORABLE and consistency in DRILLABLE


def resumable(state: str, consistency: str) -> bool:
    """A requeued run resumes from this set (protocol.resume takes the newest
    such set): restorable and app-consistent. report's Resumable column,
    show and the JSON documents say this, never the raw label alone."""
    return state in RESTORABLE and consistency == APP


def labels_for(state: str, earned: str) -> tuple[str, str]:
    """(the set's label, its parts' label) for a set entering `state` with the
    label its verdict earned: the one rule, applied by the repository's
    transition, that keeps "app-consistent" off a set that is no point."""
    return (NONE if state in NOT_A_POINT else earned), earned
