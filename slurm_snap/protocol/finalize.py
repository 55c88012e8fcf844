"""Label a set from what the inventory holds: its acks, its parts, the job's
volumes and nodes. The one finalizer the coordinator, the preemption Epilog
and repair share; it runs inside the caller's transaction with the set row
locked, so two finalizers cannot both win (the loser sees a terminal state)."""
from __future__ import annotations

import datetime as dt
from typing import Sequence

from ..inventory.records import SnapshotRecord

from .. import states as S
from ..jobrecords import VolumeRecord
from .cutter import assign_manifests
from .verdict import Verdict, judge


def verdict_for(repo, st, *, allow_crash: bool, extra_reasons: Sequence[str] = ()) -> Verdict:
    run = st.job_run
    volumes = repo.volumes(run)
    acks = repo.ack_records(st.id)
    _entries, outside = assign_manifests([VolumeRecord.of(v) for v in volumes], [(a.node, a.manifest) for a in acks])
    return judge(wanted=st.wanted, volumes=volumes, nodes=list(run.nodes or []), acks=acks,
                 parts=[SnapshotRecord.of(p) for p in repo.snapshots(st.id)], requested_at=st.requested_at,
                 allow_crash=allow_crash, outside=outside, extra_reasons=extra_reasons)


def apply(repo, st, v: Verdict, *, at: dt.datetime | None = None, late: bool = False) -> None:
    """Move the set to the verdict's state through the states the machine
    requires (COMPLETE only through CUT), with every field it decided.
    `late`: a late part judged the finalized set again (states.LATE_JOIN)."""
    for step in (S.CUTTING, S.CUT):
        if S.allowed(st.state, v.state, late=late):
            break
        if S.allowed(st.state, step):
            repo.transition(st.id, step, at=at)
    # The earned label: the repository's transition derives the set's own
    # from it and the state (states.labels_for).
    fields = dict(consistency=v.parts_consistency, reason=v.reason[:8000], failed_nodes=list(v.failed_nodes),
                  skew_seconds=v.skew_seconds, checkpoint_step=v.checkpoint_step, manifest_ok=v.manifest_ok)
    repo.transition(st.id, v.state, at=at, late=late, **fields)
