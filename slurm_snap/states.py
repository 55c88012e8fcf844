"""The snapshot-set state machine: pure data, used by the repository to refuse
any state change that is not drawn here (docs/design.md has the picture).

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
