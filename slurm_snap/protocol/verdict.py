"""How good is a snapshot set? Pure functions, no I/O, injected times.

The coordinator (on demand), the Epilog finalizer (at preemption) and
`repair` all label a set through `decide`, so a set cannot be called
app-consistent by one path and crash-consistent by another for the same facts.

The rules (docs/design.md, PRIOR-ART requirements 2, 3, 7, 8):
  app-consistent  every node of the job completed its barrier (all local ranks
                  acknowledged this epoch) after the request and no later than
                  the start of every cut that could contain its data, every
                  rank of the launcher's world acknowledged, all ranks chose
                  one step (or the job declared independent checkpoints) and
                  no rank's step agreement failed, every declared volume on
                  every node was cut, every acknowledged file lies in a
                  declared volume and was found in the snapshot with its
                  acknowledged size;
  crash-consistent  every volume was cut but the barrier rule failed (only if
                  the configuration allows; otherwise FAILED), or crash was asked;
  PARTIAL         some declared volume has no snapshot: the reason names them;
  FAILED          nothing was cut, or app was required and not achieved.
A PARTIAL or FAILED set is no point to restore from: its label is "none",
and what the parts that were cut earned is `parts_consistency`
(states.labels_for), so report never shows PARTIAL beside app-consistent.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .. import states as S
from ..inventory.records import SnapshotRecord
from ..jobrecords import Ack, VolumeRecord
from .barrier import node_barrier_complete

# A rank's clock may be a little behind the coordinator's: an acknowledgement
# carrying this set's fresh epoch cannot predate the request except by skew.
CLOCK_SLACK = dt.timedelta(seconds=1)
MAX_REASON_ITEMS = 8


@dataclass(frozen=True)
class NodeBarrier:
    node: str
    complete: bool
    first_written: dt.datetime | None
    complete_seen_at: dt.datetime | None
    steps: frozenset[int]
    # What the launcher said must answer on this node (the acks' local_size)
    # and which local ranks did not: "presence is not coherence".
    expected: frozenset[int] = frozenset()
    missing_local: tuple[int, ...] = ()

    def why_incomplete(self) -> str:
        if self.complete:
            return ""
        if len(self.expected) > 1:
            return f"{self.node}: ranks disagree on how many run there ({_list([str(x) for x in sorted(self.expected)])})"
        if self.missing_local:
            size = next(iter(self.expected))
            return (f"{self.node}: local ranks {_list([str(r) for r in self.missing_local])} of {size} "
                    "did not acknowledge")
        return f"{self.node}: acknowledgements do not describe one layout of the node"


@dataclass(frozen=True)
class Verdict:
    state: str
    consistency: str          # the set's label (states.labels_for: "none" unless a point)
    reason: str
    failed_nodes: tuple[str, ...] = ()
    skew_seconds: float | None = None
    checkpoint_step: int | None = None
    manifest_ok: bool | None = None
    barrier_ok: bool = False
    missing: tuple[str, ...] = ()
    parts_consistency: str = S.NONE   # what the parts that were cut earned

    @property
    def complete(self) -> bool:
        return self.state == S.COMPLETE

    @property
    def resumable(self) -> bool:
        return S.resumable(self.state, self.consistency)


def expected_parts(volumes: Iterable, nodes: Sequence[str]) -> list[VolumeRecord]:
    """Every (volume, node) the set must contain.

    `volumes` are inventory rows or VolumeRecords (id, path, scope, node,
    volume_class). A node-local class recorded for some nodes but not for a
    node of the job is still expected there (id None): a set that silently
    leaves a node out is exactly the failure users complain about (restic #340).
    """
    out: list[VolumeRecord] = []
    local_classes: dict[str, set[str]] = {}
    for v in volumes:
        out.append(VolumeRecord(path=v.path, scope=v.scope, volume_class=v.volume_class, node=v.node or "", id=v.id))
        if v.scope == "node-local":
            local_classes.setdefault(v.volume_class, set()).add(v.node)
    for cls in sorted(local_classes):
        for node in nodes:
            if node not in local_classes[cls]:
                out.append(VolumeRecord(path="", scope="node-local", volume_class=cls, node=node))
    return out


def node_barriers(acks: Iterable[Ack], complete_nodes: Iterable[str]) -> dict[str, NodeBarrier]:
    """Per node: completeness (decided by the client's node_barrier_complete,
    passed in) and the times that matter for ordering."""
    done = set(complete_nodes)
    by_node: dict[str, list[Ack]] = {}
    for a in acks:
        by_node.setdefault(a.node, []).append(a)
    out = {}
    for node, items in by_node.items():
        complete = node in done
        sizes = frozenset(a.local_size for a in items)
        missing: tuple[int, ...] = ()
        if len(sizes) == 1 and not complete:
            size = next(iter(sizes))
            heard = {a.local_rank for a in items}
            # local_size comes from a rank's file: name at most a screenful.
            missing = tuple(r for r in range(min(size, 4 * MAX_REASON_ITEMS + len(heard))) if r not in heard)
        out[node] = NodeBarrier(
            node=node, complete=complete,
            first_written=min(a.written_at for a in items),
            complete_seen_at=max(a.seen_at for a in items if a.seen_at) if complete else None,
            steps=frozenset(a.step for a in items), expected=sizes, missing_local=missing)
    return out


def skew(outcomes: Iterable[SnapshotRecord]) -> float | None:
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
                     parts: Sequence[VolumeRecord], outcomes: Mapping[int, SnapshotRecord],
                     requested_at: dt.datetime) -> tuple[list[str], list[str]]:
    """(problems, nodes at fault) of the barrier rule; empty when it holds."""
    problems: list[str] = []
    bad_nodes: list[str] = []
    missing = [n for n in nodes if n not in barriers or not barriers[n].complete]
    if missing:
        problems.append(f"barrier incomplete on {len(missing)} of {len(nodes)} nodes ({_list(missing)})")
        partial = [barriers[n].why_incomplete() for n in missing if n in barriers]
        if partial:
            more = f"; and {len(partial) - MAX_REASON_ITEMS} more nodes" if len(partial) > MAX_REASON_ITEMS else ""
            problems.append("; ".join(partial[:MAX_REASON_ITEMS]) + more)
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
        o = outcomes.get(p.id) if p.id is not None else None
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


def decide(*, wanted: str, nodes: Sequence[str], parts: Sequence[VolumeRecord],
           outcomes: Mapping[int, SnapshotRecord], barriers: Mapping[str, NodeBarrier],
           requested_at: dt.datetime, allow_crash: bool, extra_reasons: Sequence[str] = (),
           outside: Sequence[str] = (), acks: Sequence[Ack]) -> Verdict:
    """The label of a set whose cut phase is over (nothing more will be cut)."""
    cut_ok, missing = [], []
    for p in parts:
        o = outcomes.get(p.id) if p.id is not None else None
        (cut_ok if o is not None and o.ok else missing).append(p)
    sk = skew(outcomes.values())
    reasons = list(extra_reasons)
    failed_nodes: set[str] = {p.node for p in missing if p.node}
    if missing:
        details = []
        for p in missing:
            o = outcomes.get(p.id) if p.id is not None else None
            if p.id is None:
                details.append(f"{p.label} (never recorded by the node's Prolog)")
            elif o is not None and o.failure:
                details.append(f"{p.label} ({o.failure})")
            else:
                details.append(f"{p.label} (not cut)")
        reasons.insert(0, f"missing {len(missing)} of {len(parts)} volumes: {_list(details)}")
        if not any(p.scope == "shared" for p in missing) and failed_nodes:
            reasons.insert(1, f"nodes without a complete cut: {_list(sorted(failed_nodes))}")

    # Manifests: every file a rank acknowledged must be in the set.
    manifest_bad = [p.label + (f": {outcomes[p.id].manifest_why}" if outcomes[p.id].manifest_why else "")
                    for p in cut_ok if outcomes[p.id].manifest_ok is False]
    manifest_unknown = [p.label for p in cut_ok if outcomes[p.id].manifest_ok is None]
    manifest_ok = None if manifest_unknown and not manifest_bad else not manifest_bad
    if not cut_ok:
        manifest_ok = None

    all_steps = set().union(*(b.steps for b in barriers.values())) if barriers else set()
    step = min(all_steps) if all_steps else None
    lockstep = lockstep_problems(acks)
    if len(all_steps) > 1 and not lockstep:
        # Every rank declared independent checkpoints: each rank's checkpoint
        # is durable and in the set, and resuming each from its own step is
        # the job's design. Say so; do not downgrade.
        reasons.append(f"note: ranks acknowledged different steps ({_list([str(x) for x in sorted(all_steps)])}); "
                       "the job declared independent checkpoints")

    if wanted == "app":
        problems, bad_nodes = barrier_problems(nodes=nodes, barriers=barriers, parts=parts,
                                               outcomes=outcomes, requested_at=requested_at)
        if manifest_bad:
            problems.append(f"manifest check failed on {_list(manifest_bad)}")
        if manifest_unknown:
            problems.append(f"manifest could not be checked on {_list(manifest_unknown)}")
        problems.extend(outside)
        problems.extend(lockstep)
        failed_nodes.update(bad_nodes)
        barrier_ok = not problems
    else:
        problems, barrier_ok = [], False

    def verdict(state: str, earned: str, why: list[str]) -> Verdict:
        consistency, parts = S.labels_for(state, earned)
        return Verdict(state=state, consistency=consistency, parts_consistency=parts,
                       reason="; ".join(w for w in why if w),
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


def _ranks(ranks: Iterable[int]) -> str:
    return _list([str(r) for r in sorted(ranks)])


def lockstep_problems(acks: Sequence[Ack]) -> list[str]:
    """Why the ranks' acknowledgements are not one point of a lockstep job.

    Presence is not coherence: a data-parallel job's ranks hold one model, so
    a checkpoint taken at step 7 by one rank and step 8 by another is two
    points, unless every rank declared that it checkpoints on its own
    (`independent`). A rank whose step agreement failed chose its step alone.
    A rank count short of the launcher's world means ranks were never heard
    from even if every node looked complete (torchrun workers counted as one
    per node)."""
    problems: list[str] = []
    if not acks:
        return problems
    by_step: dict[int, list[int]] = {}
    for a in acks:
        by_step.setdefault(a.step, []).append(a.rank)
    if len(by_step) > 1 and not all(a.independent for a in acks):
        detail = "; ".join(f"step {s_}: ranks {_ranks(r)}" for s_, r in sorted(by_step.items()))
        problems.append(f"ranks acknowledged different steps ({detail}), so the checkpoints are not one point "
                        "(a job whose ranks checkpoint independently says so with independent=True)")
    failed = [a for a in acks if a.agreement_failed]
    if failed:
        problems.append(f"step agreement failed on ranks {_ranks(a.rank for a in failed)} "
                        f"({failed[0].agreement[:200]})")
    sizes = {a.world_size for a in acks if a.world_size is not None}
    if len(sizes) > 1:
        problems.append(f"ranks disagree on the world size ({_list([str(x) for x in sorted(sizes)])})")
    elif sizes:
        world = sizes.pop()
        heard = {a.rank for a in acks}
        if len(heard) < world:
            absent = sorted(set(range(world)) - heard)
            problems.append(f"{len(heard)} of {world} ranks acknowledged (missing ranks {_ranks(absent)})")
    return problems


def outside_problem(outside: Sequence[str]) -> list[str]:
    """The one wording for acknowledged files no declared volume holds."""
    if not outside:
        return []
    return [f"checkpoint files outside every declared volume: {_list(list(outside))}"]


def judge(*, wanted: str, volumes: Sequence, nodes: Sequence[str], acks: Sequence[Ack],
          parts: Iterable[SnapshotRecord], requested_at: dt.datetime, allow_crash: bool,
          outside: Sequence[str] = (), extra_reasons: Sequence[str] = ()) -> Verdict:
    """The verdict from facts alone: the coordinator (what it saw), the
    preemption Epilog and repair (what the inventory holds) all call this.

    `volumes` are the job's declared volumes (inventory rows or VolumeRecords),
    `outside` the acknowledged files that lie in none of them."""
    by_node: dict[str, list[Ack]] = {}
    for a in acks:
        by_node.setdefault(a.node, []).append(a)
    complete = [n for n, items in by_node.items() if node_barrier_complete(items)]
    return decide(wanted=wanted, nodes=nodes, parts=expected_parts(volumes, nodes),
                  outcomes={p.volume_id: p for p in parts}, barriers=node_barriers(acks, complete),
                  requested_at=requested_at, allow_crash=allow_crash, extra_reasons=extra_reasons,
                  outside=outside_problem(outside) if wanted == "app" else [], acks=acks)
