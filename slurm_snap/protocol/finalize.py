"""Label a set from what the inventory holds: its acks, its parts, the job's
volumes and nodes. The one finalizer the coordinator, the preemption Epilog
and repair share; it runs inside the caller's transaction with the set row
locked, so two finalizers cannot both win (the loser sees a terminal state)."""
from __future__ import annotations

import datetime as dt
from typing import Sequence

from ..client.ack import Ack, node_barrier_complete
from .. import states as S
from .cutter import VolumeInfo, assign_manifests
from .verdict import AckFact, PartOutcome, Verdict, decide, expected_parts, node_barriers


def _as_client_ack(row, epoch: str) -> Ack:
    return Ack(version=1, job_id="", epoch=epoch, node=row.node, rank=row.rank, local_rank=row.local_rank,
               local_size=row.local_size, step=row.step, written_at=row.written_at, manifest=())


def verdict_for(repo, st, *, allow_crash: bool, extra_reasons: Sequence[str] = ()) -> Verdict:
    run = st.job_run
    nodes = list(run.nodes or [])
    volumes = repo.volumes(run)
    acks = repo.acks(st.id)
    parts = repo.snapshots(st.id)
    by_node: dict[str, list] = {}
    for a in acks:
        by_node.setdefault(a.node, []).append(a)
    complete = [n for n, rows in by_node.items()
                if node_barrier_complete([_as_client_ack(r, st.epoch) for r in rows])]
    facts = [AckFact(a.node, a.rank, a.local_rank, a.local_size, a.step, a.written_at, a.received_at) for a in acks]
    barriers = node_barriers(facts, complete)
    outcomes = {}
    for p in parts:
        ok = p.state == "CUT"
        why = p.error if ok else ""
        outcomes[p.volume_id] = PartOutcome(volume_id=p.volume_id, ok=ok, cut_started_at=p.cut_started_at,
                                            cut_at=p.cut_at, manifest_ok=p.manifest_ok if ok else None,
                                            manifest_why=why, error="" if ok else p.error)
    infos = [VolumeInfo.of(v) for v in volumes]
    _entries, outside = assign_manifests(infos, [(a.node, a.manifest or []) for a in acks])
    reasons = list(extra_reasons)
    problems = []
    if outside and st.wanted == "app":
        problems.append(f"checkpoint files outside every declared volume: {', '.join(outside[:8])}"
                        + (f" and {len(outside) - 8} more" if len(outside) > 8 else ""))
    v = decide(wanted=st.wanted, nodes=nodes, parts=expected_parts(volumes, nodes), outcomes=outcomes,
               barriers=barriers, requested_at=st.requested_at, allow_crash=allow_crash,
               extra_reasons=reasons, outside=problems)
    return v


def apply(repo, st, v: Verdict, *, at: dt.datetime | None = None) -> None:
    """Move the set to the verdict's state through the states the machine
    requires (COMPLETE only through CUT), with every field it decided."""
    for step in (S.CUTTING, S.CUT):
        if S.allowed(st.state, v.state):
            break
        if S.allowed(st.state, step):
            repo.transition(st.id, step, at=at)
    fields = dict(consistency=v.consistency, reason=v.reason[:8000], failed_nodes=list(v.failed_nodes),
                  skew_seconds=v.skew_seconds, checkpoint_step=v.checkpoint_step, manifest_ok=v.manifest_ok)
    repo.transition(st.id, v.state, at=at, **fields)
