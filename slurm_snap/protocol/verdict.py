"""How good is a snapshot set? Pure functions, no I/O, injected times.

The coordinator (on demand), the Epilog finalizer (at preemption) and
`repair` all label a set through `decide`, so a set cannot be called
app-consistent by one path and crash-consistent by another for the same facts.

The rules (docs/design.md, PRIOR-ART requirements 2, 3, 7, 8):
  app-consistent  every node of the job completed its barrier (all local ranks
                  acknowledged this epoch) after the request and no later than
                  the start of every cut that could contain its data, every
                  declared volume on every node was cut, every acknowledged
                  file lies in a declared volume and was found in the
                  snapshot with its acknowledged size;
  crash-consistent  every volume was cut but the barrier rule failed (only if
                  the configuration allows; otherwise FAILED), or crash was asked;
  PARTIAL         some declared volume has no snapshot: the reason names them;
  FAILED          nothing was cut, or app was required and not achieved.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .. import states as S

# A rank's clock may be a little behind the coordinator's: an acknowledgement
# carrying this set's fresh epoch cannot predate the request except by skew.
CLOCK_SLACK = dt.timedelta(seconds=1)
MAX_REASON_ITEMS = 8


@dataclass(frozen=True)
class ExpectedPart:
    """One volume that must be in the set; volume_id None = declared but never
    recorded (a node's Prolog did not record its node-local volume)."""

    volume_id: int | None
    node: str          # "" for shared volumes
    path: str
    scope: str
    volume_class: str = ""

    @property
    def label(self) -> str:
        return f"{self.volume_class or self.path}@{self.node}" if self.node else (self.volume_class or self.path)


@dataclass(frozen=True)
class PartOutcome:
    """What happened to one expected part. ok=False: attempted and failed."""

    volume_id: int
    ok: bool
    cut_started_at: dt.datetime | None = None
    cut_at: dt.datetime | None = None
    manifest_ok: bool | None = None
    manifest_why: str = ""
    error: str = ""


@dataclass(frozen=True)
class AckFact:
    node: str
    rank: int
    local_rank: int
    local_size: int
    step: int
    written_at: dt.datetime
    # When the coordinator (or a hook) first saw it: its own clock, an upper bound.
    seen_at: dt.datetime


@dataclass(frozen=True)
class NodeBarrier:
    node: str
    complete: bool
    first_written: dt.datetime | None
    complete_seen_at: dt.datetime | None
    steps: frozenset[int]


@dataclass(frozen=True)
class Verdict:
    state: str
    consistency: str
    reason: str
    failed_nodes: tuple[str, ...] = ()
    skew_seconds: float | None = None
    checkpoint_step: int | None = None
    manifest_ok: bool | None = None
    barrier_ok: bool = False
    missing: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.state == S.COMPLETE


def expected_parts(volumes: Iterable, nodes: Sequence[str]) -> list[ExpectedPart]:
    """Every (volume, node) the set must contain.

    `volumes` are inventory rows (id, path, scope, node, volume_class). A
    node-local class recorded for some nodes but not for a node of the job is
    still expected there (volume_id None): a set that silently leaves a node
    out is exactly the failure users complain about (restic #340).
    """
    out: list[ExpectedPart] = []
    local_classes: dict[str, set[str]] = {}
    for v in volumes:
        out.append(ExpectedPart(v.id, v.node or "", v.path, v.scope, v.volume_class))
        if v.scope == "node-local":
            local_classes.setdefault(v.volume_class, set()).add(v.node)
    for cls in sorted(local_classes):
        for node in nodes:
            if node not in local_classes[cls]:
                out.append(ExpectedPart(None, node, "", "node-local", cls))
    return out


def node_barriers(acks: Iterable[AckFact], complete_nodes: Iterable[str]) -> dict[str, NodeBarrier]:
    """Per node: completeness (decided by the client's node_barrier_complete,
    passed in) and the times that matter for ordering."""
    done = set(complete_nodes)
    by_node: dict[str, list[AckFact]] = {}
    for a in acks:
        by_node.setdefault(a.node, []).append(a)
    out = {}
    for node, items in by_node.items():
        complete = node in done
        out[node] = NodeBarrier(
            node=node, complete=complete,
            first_written=min(a.written_at for a in items),
            complete_seen_at=max(a.seen_at for a in items) if complete else None,
            steps=frozenset(a.step for a in items))
    return out


def skew(outcomes: Iterable[PartOutcome]) -> float | None:
    """Last cut end minus first cut start over the parts that were cut."""
    cut = [o for o in outcomes if o.ok and o.cut_started_at and o.cut_at]
    if not cut:
        return None
    return (max(o.cut_at for o in cut) - min(o.cut_started_at for o in cut)).total_seconds()


def _list(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= MAX_REASON_ITEMS:
        return ", ".join(items)
    return ", ".join(items[:MAX_REASON_ITEMS]) + f" and {len(items) - MAX_REASON_ITEMS} more"


def barrier_problems(*, nodes: Sequence[str], barriers: Mapping[str, NodeBarrier],
                     parts: Sequence[ExpectedPart], outcomes: Mapping[int, PartOutcome],
                     requested_at: dt.datetime) -> tuple[list[str], list[str]]:
    """(problems, nodes at fault) of the barrier rule; empty when it holds."""
    problems: list[str] = []
    bad_nodes: list[str] = []
    missing = [n for n in nodes if n not in barriers or not barriers[n].complete]
    if missing:
        problems.append(f"barrier incomplete on {len(missing)} of {len(nodes)} nodes ({_list(missing)})")
        bad_nodes.extend(missing)
    early = [n for n in nodes if n in barriers and barriers[n].first_written is not None
             and barriers[n].first_written < requested_at - CLOCK_SLACK]
    if early:
        problems.append(f"acknowledgements written before the request on {_list(early)}")
        bad_nodes.extend(early)
    # A volume may hold the data of one node (node-local) or of all (shared):
    # each of those nodes' barriers must have been seen before that cut began.
    late: set[str] = set()
    for p in parts:
        o = outcomes.get(p.volume_id) if p.volume_id is not None else None
        if o is None or not o.ok or o.cut_started_at is None:
            continue
        writers = [p.node] if p.scope == "node-local" else list(nodes)
        for n in writers:
            b = barriers.get(n)
            if b is not None and b.complete and b.complete_seen_at is not None \
                    and b.complete_seen_at > o.cut_started_at:
                late.add(n)
    if late:
        problems.append(f"barrier completed after a cut began on {_list(sorted(late))}")
        bad_nodes.extend(sorted(late))
    return problems, bad_nodes


def decide(*, wanted: str, nodes: Sequence[str], parts: Sequence[ExpectedPart],
           outcomes: Mapping[int, PartOutcome], barriers: Mapping[str, NodeBarrier],
           requested_at: dt.datetime, allow_crash: bool, extra_reasons: Sequence[str] = (),
           outside: Sequence[str] = ()) -> Verdict:
    """The label of a set whose cut phase is over (nothing more will be cut)."""
    cut_ok, missing = [], []
    for p in parts:
        o = outcomes.get(p.volume_id) if p.volume_id is not None else None
        (cut_ok if o is not None and o.ok else missing).append(p)
    sk = skew(outcomes.values())
    reasons = list(extra_reasons)
    failed_nodes: set[str] = {p.node for p in missing if p.node}
    if missing:
        details = []
        for p in missing:
            o = outcomes.get(p.volume_id) if p.volume_id is not None else None
            if p.volume_id is None:
                details.append(f"{p.label} (never recorded by the node's Prolog)")
            elif o is not None and o.error:
                details.append(f"{p.label} ({o.error})")
            else:
                details.append(f"{p.label} (not cut)")
        reasons.insert(0, f"missing {len(missing)} of {len(parts)} volumes: {_list(details)}")
        if not any(p.scope == "shared" for p in missing) and failed_nodes:
            reasons.insert(1, f"nodes without a complete cut: {_list(sorted(failed_nodes))}")

    # Manifests: every file a rank acknowledged must be in the set.
    manifest_bad = [p.label + (f": {outcomes[p.volume_id].manifest_why}" if outcomes[p.volume_id].manifest_why else "")
                    for p in cut_ok if outcomes[p.volume_id].manifest_ok is False]
    manifest_unknown = [p.label for p in cut_ok if outcomes[p.volume_id].manifest_ok is None]
    manifest_ok = None if manifest_unknown and not manifest_bad else not manifest_bad
    if not cut_ok:
        manifest_ok = None

    # Ranks that checkpoint independently stop at their own next step; each
    # rank's checkpoint is still durable and in the set. Whether mixed steps
    # can be resumed is the application's business: say so, do not downgrade.
    all_steps = set().union(*(b.steps for b in barriers.values())) if barriers else set()
    step = min(all_steps) if all_steps else None
    if len(all_steps) > 1:
        reasons.append(f"note: ranks acknowledged different steps ({_list([str(x) for x in sorted(all_steps)])})")

    if wanted == "app":
        problems, bad_nodes = barrier_problems(nodes=nodes, barriers=barriers, parts=parts,
                                               outcomes=outcomes, requested_at=requested_at)
        if manifest_bad:
            problems.append(f"manifest check failed on {_list(manifest_bad)}")
        if manifest_unknown:
            problems.append(f"manifest could not be checked on {_list(manifest_unknown)}")
        problems.extend(outside)
        failed_nodes.update(bad_nodes)
        barrier_ok = not problems
    else:
        problems, barrier_ok = [], False

    def verdict(state: str, consistency: str, why: list[str]) -> Verdict:
        return Verdict(state=state, consistency=consistency, reason="; ".join(w for w in why if w),
                       failed_nodes=tuple(sorted(failed_nodes)), skew_seconds=sk, checkpoint_step=step,
                       manifest_ok=manifest_ok, barrier_ok=barrier_ok,
                       missing=tuple(p.label for p in missing))

    if not cut_ok:
        return verdict(S.FAILED, S.NONE, ["no volume was cut"] + reasons + problems)
    label = S.APP if wanted == "app" and barrier_ok else S.CRASH
    if missing:
        if label == S.CRASH and wanted == "app" and not allow_crash:
            label = S.NONE
        return verdict(S.PARTIAL, label, reasons + problems)
    if wanted == "crash":
        return verdict(S.COMPLETE, S.CRASH, reasons + ["crash-consistent as requested (no signal, no barrier)"])
    if barrier_ok:
        return verdict(S.COMPLETE, S.APP, reasons)
    if not allow_crash:
        return verdict(S.FAILED, S.NONE, reasons + problems
                       + ["not app-consistent and protocol.allow_crash_consistent is false"])
    return verdict(S.COMPLETE, S.CRASH, reasons + problems)
