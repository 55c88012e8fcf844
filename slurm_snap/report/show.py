"""`show`: one set in full, for a person asking "what happened, and where did the time go?"."""
from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

from .. import states as S

from .rows import PHASE_TIMES, seconds
from .jsonout import envelope
from ..slurm.slurmtime import iso_utc
from .timeline import timeline

_PHASE_LABELS = {"requested": "requested", "signalled": "signalled", "barrier": "barrier", "released": "released",
                 "cut_started": "cut started", "cut_done": "cut done", "finished": "finished",
                 "verified": "verified"}


# How a preemption's nodes were given back (snapshot_set.release).
RELEASE_WORDS = {"early": "early: rank 0 requeued the job once every rank had acknowledged",
                 "grace": "at the end of GraceTime: Slurm killed the job",
                 "limit": "at the time limit: Slurm ended the job"}


def precise(t: dt.datetime | None, tz: dt.tzinfo | None) -> str:
    """Local time to the millisecond: phases of one set are often sub-second apart."""
    if t is None:
        return "-"
    local = t.astimezone(tz) if tz is not None else t.astimezone()
    return local.strftime("%Y-%m-%dT%H:%M:%S.") + f"{local.microsecond // 1000:03d}"


def ranks(values: Sequence[int]) -> str:
    """[0,1,2,3,6] -> '0-3,6', as Slurm writes rank and node ranges."""
    out, run = [], []
    for v in sorted(set(values)):
        if run and v == run[-1] + 1:
            run.append(v)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [v]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def cut_count(snaps) -> int:
    """Parts that were cut: a MISSING part is the record of a volume that was not."""
    return sum(1 for s in snaps if s.state != S.PART_MISSING)


def _ok(v) -> str:
    return "not checked" if v is None else ("ok" if v else "BAD")


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} s"


def _table(head: Sequence[tuple[str, int, str]], rows: Sequence[Sequence[str]]) -> list[str]:
    """Header and rows whose columns line up whatever the values' lengths:
    each column is as wide as its usual width or its longest value (a long
    path widens its column rather than pushing the rest of its line right).
    `head` is (title, usual width, alignment '<' or '>'); a title that starts
    with a blank gets two spaces before it; the last column is not padded."""
    widths = [max([width, len(title.strip())] + [len(r[i]) for r in rows]) for i, (title, width, _a) in enumerate(head)]

    def line(values: Sequence[str]) -> str:
        cells = []
        for i, ((title, _w, align), value) in enumerate(zip(head, values)):
            cell = value if i == len(head) - 1 else f"{value:{align}{widths[i]}}"
            cells.append((" " if title.startswith(" ") else "") + cell)
        return "  " + " ".join(cells)

    return [line([t.strip() for t, _w, _a in head])] + [line(r) for r in rows]


def _refusal_lines(refused: Sequence, declared: int) -> list[str]:
    if not refused:
        return []
    return ([f"  UNPROTECTED: the Prolog refused {len(refused)} of {declared} declared volumes; "
             "the job ran without their snapshots:"]
            + [f"    {r.node or '(shared)':<10} {r.path}: {r.why}" for r in refused])


def _refusal_docs(refused: Sequence) -> list[dict]:
    return [{"node": r.node, "path": r.path, "reason": r.why} for r in refused]


def survives_node_loss(st, copies: Sequence) -> bool | None:
    """Does every node-local part of the set have a complete copy on a second
    node, so that losing any one node loses no part? None: no node-local part."""
    local = [s for s in st.snapshots
             if s.state == S.PART_CUT and s.volume is not None and s.volume.scope == "node-local"]
    if not local:
        return None
    node_of = {s.id: s.node for s in local}
    elsewhere = {c.snapshot_id for c in copies
                 if c.state == S.COPY_OK and c.snapshot_id in node_of and c.node != node_of[c.snapshot_id]}
    return all(s.id in elsewhere for s in local)


def _copy_lines(copies: Sequence, st, tz) -> list[str]:
    out = ["", "Node-local parts on other nodes:"]
    if not copies:
        return out + ["  (none)"]
    by_id = {s.id: s for s in st.snapshots}
    rows = []
    for c in copies:
        part = by_id.get(c.snapshot_id)
        label = f"{part.volume.volume_class}@{part.node}" if part is not None and part.volume is not None else str(c.snapshot_id)
        mib = "-" if c.bytes is None else f"{c.bytes / (1 << 20):.1f}"
        rows.append([label, c.source_node, c.node, c.purpose, c.state, c.method or "-", mib, _secs(c.seconds),
                     (ranks(list(c.ranks or [])) if c.ranks else "-") + (f"  error: {c.error}" if c.error else "")])
    return out + _table([("PART", 24, "<"), ("FROM", 8, "<"), ("TO", 8, "<"), ("WHY", 8, "<"), ("STATE", 7, "<"),
                         ("METHOD", 17, "<"), ("MIB", 8, ">"), ("TOOK", 9, ">"), (" RANKS", 0, "<")], rows)


def render(st, events: Sequence, *, tz: dt.tzinfo | None = None, refused: Sequence = (),
           copies: Sequence = ()) -> list[str]:
    run = st.job_run
    acks, snaps, tests = list(st.acks), list(st.snapshots), list(st.restore_tests)
    out = [f"Set {st.id} of job {run.label} (user {st.user_name}, partition {run.partition or '-'}, "
           f"nodes {','.join(run.nodes) or '-'})",
           f"  trigger {st.trigger}, epoch {st.epoch}, wanted {st.wanted}",
           f"  state {st.state}, consistency {st.consistency}, resumable "
           + ("yes" if S.resumable(st.state, st.consistency) else "no")
           + (f" (the parts that were cut are {st.parts_consistency})"
              if st.parts_consistency != st.consistency and st.state in S.NOT_A_POINT else "")]
    if st.reason:
        out.append(f"  reason: {st.reason}")
    out += _refusal_lines(refused, len(run.volumes))
    step = "-" if st.checkpoint_step is None else st.checkpoint_step
    out.append(f"  checkpoint step {step}, skew {_secs(st.skew_seconds)}, manifest {_ok(st.manifest_ok)}, "
               f"volumes {cut_count(snaps)}/{st.expected_parts}")
    if st.failed_nodes:
        out.append(f"  failed nodes: {','.join(st.failed_nodes)}")
    survives = survives_node_loss(st, copies)
    if survives is not None:
        out.append("  survives the loss of any one node: " + ("yes (every node-local part has a copy on a "
                   "second node)" if survives else "no (a node-local part has its only copy on its node)"))

    out += ["", "Phases:"]
    for name, col in PHASE_TIMES:
        t = getattr(st, col)
        since = seconds(st.requested_at, t)
        if t is None and name == "released":
            continue   # only preemptions give nodes back
        out.append(f"  {_PHASE_LABELS[name]:<12} {precise(t, tz):<23}"
                   + ("" if since is None else f"  +{since:.3f} s")
                   + (f"  ({RELEASE_WORDS.get(st.release, st.release)})" if name == "released" and st.release else ""))
    if st.trigger in S.HOOK_TRIGGERS and st.barrier_at is not None:
        # What a site tunes GraceTime (or a job its time-limit margin) with
        # (doctor suggests a GraceTime from these).
        ack = seconds(st.requested_at, st.barrier_at)
        rel = seconds(st.requested_at, st.released_at)
        what = "preemption" if st.trigger == "preempt" else "time limit"
        out.append(f"  {what}: last acknowledgement {ack:.1f} s after the first signal"
                   + ("" if rel is None else f", nodes given back after {rel:.1f} s ({st.release or '?'})"))

    out += ["", "Barrier acknowledgements:"]
    if acks:
        rows = []
        for node in sorted({a.node for a in acks}):
            mine = [a for a in acks if a.node == node]
            steps = sorted({a.step for a in mine})
            step_s = str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"
            rows.append([node, ranks([a.rank for a in mine]), step_s, precise(max(a.written_at for a in mine), tz),
                         precise(max(a.received_at for a in mine), tz)])
        out += _table([("NODE", 12, "<"), ("RANKS", 10, "<"), ("STEP", 10, ">"), (" WRITTEN", 23, "<"),
                       (" RECEIVED", 23, "<")], rows)
    else:
        out.append("  (none)")

    out += ["", "Volumes:"]
    if snaps:
        out += _table([("NODE", 10, "<"), ("VOLUME", 28, "<"), ("BACKEND", 12, "<"), ("CUT AT", 23, "<"),
                       ("TOOK", 9, ">"), (" STATE", 8, "<"), ("MANIFEST", 11, "<"), ("NAME", 0, "<")],
                      [[s.node or "(shared)", s.volume.path if s.volume is not None else "?", s.backend,
                        precise(s.cut_at, tz), _secs(seconds(s.cut_started_at, s.cut_at)), s.state,
                        _ok(s.manifest_ok),
                        s.name + (f"  [{s.site}/{s.region}]" if s.site or s.region else "")
                        + (f"  error: {s.error}" if s.error else "")] for s in snaps])
    else:
        out.append("  (none)")

    if survives is not None or copies:
        out += _copy_lines(copies, st, tz)

    out += ["", "Restore tests:"]
    for t in tests:
        ttfs = "-" if t.time_to_first_step is None else f"{t.time_to_first_step:.3f} s"
        out.append(f"  #{t.id} {t.result} started {precise(t.started_at, tz)} finished {precise(t.finished_at, tz)} "
                   f"first step {'-' if t.first_step is None else t.first_step} after {ttfs}"
                   + (f"  slurm job {t.slurm_job_id}" if t.slurm_job_id else "")
                   + (f"  reason: {t.reason}" if t.reason else ""))
    if not tests:
        out.append("  (none)")

    out += _event_lines(events, tz)

    out += ["", "Timeline:"]
    out += ["  " + line for line in timeline(st, acks, snaps)]
    return [line.rstrip() for line in out]


def _event_lines(events: Sequence, tz: dt.tzinfo | None) -> list[str]:
    out = ["", "Events:"]
    out += [f"  {precise(e.at, tz)} {e.level:<7} {e.node or '-':<10} {e.kind}: {e.message}" for e in events]
    return out if events else out + ["  (none)"]


def render_job(run, volumes: Sequence, refused: Sequence, events: Sequence, *,
               tz: dt.tzinfo | None = None) -> list[str]:
    """`show JOB` of a run that has no set: what was declared, what the
    Prolog refused, and the job's events, rather than "not found"."""
    out = [f"Job {run.label} (user {run.user_name}, partition {run.partition or '-'}, "
           f"nodes {','.join(run.nodes) or '-'}): no snapshot set"]
    out += _refusal_lines(refused, len(volumes))
    out += ["", "Volumes:"]
    if volumes:
        out += _table([("NODE", 10, "<"), ("VOLUME", 28, "<"), ("CLASS", 10, "<"), ("BACKEND", 12, "<"),
                       ("STATE", 0, "<")],
                      [[v.node or "(shared)", v.path, v.volume_class, v.backend,
                        f"REFUSED: {v.refusal}" if v.refused_at is not None else "declared"] for v in volumes])
    else:
        out.append("  (none)")
    out += _event_lines(events, tz)
    return [line.rstrip() for line in out]


def job_doc(run, volumes: Sequence, refused: Sequence, events: Sequence) -> dict[str, Any]:
    """show --json of a run without a set: "set" is null."""
    return {
        **envelope("show"),
        "version": 1,
        "job": {"job": run.label, "job_id": run.job_id, "restart_count": run.restart_count,
                "user": run.user_name, "partition": run.partition, "nodes": list(run.nodes),
                "volumes": [{"node": v.node, "path": v.path, "class": v.volume_class, "backend": v.backend,
                             "refused": v.refusal if v.refused_at is not None else None} for v in volumes]},
        "set": None,
        "refused": _refusal_docs(refused),
        "events": [{"at": iso_utc(e.at), "level": e.level, "node": e.node, "kind": e.kind, "message": e.message}
                   for e in events],
    }


def show_doc(st, events: Sequence, *, refused: Sequence = (), copies: Sequence = ()) -> dict[str, Any]:
    """show --json: the set's report document plus acks, parts, drills and events (version 1)."""
    run = st.job_run
    return {
        **envelope("show"),
        "version": 1,
        "set": {
            "set_id": st.id, "job": run.label, "job_id": st.job_id, "restart_count": run.restart_count,
            "user": st.user_name, "partition": run.partition, "nodes": list(run.nodes), "epoch": st.epoch,
            "trigger": st.trigger, "wanted": st.wanted, "consistency": st.consistency,
            "parts_consistency": st.parts_consistency, "resumable": S.resumable(st.state, st.consistency),
            "state": st.state,
            "reason": st.reason, "times": {name: iso_utc(getattr(st, col)) for name, col in PHASE_TIMES},
            "release": st.release or None,
            "skew_seconds": st.skew_seconds, "checkpoint_step": st.checkpoint_step,
            "manifest_ok": st.manifest_ok, "expected_parts": st.expected_parts,
            "volumes": {"cut": cut_count(st.snapshots), "expected": st.expected_parts},
            "failed_nodes": list(st.failed_nodes or []),
            "refused": _refusal_docs(refused),
            "survives_node_loss": survives_node_loss(st, copies),
        },
        "copies": [{"snapshot_id": c.snapshot_id, "node": c.node, "from": c.source_node, "purpose": c.purpose,
                    "for_restart": c.for_restart, "ranks": list(c.ranks or []), "state": c.state,
                    "method": c.method, "bytes": c.bytes, "seconds": c.seconds, "ref": c.ref, "error": c.error}
                   for c in copies],
        "acks": [{"node": a.node, "rank": a.rank, "local_rank": a.local_rank, "local_size": a.local_size,
                  "step": a.step, "written_at": iso_utc(a.written_at), "received_at": iso_utc(a.received_at)}
                 for a in st.acks],
        "snapshots": [{"snapshot_id": s.id, "node": s.node, "volume_path": s.volume.path if s.volume else None,
                       "backend": s.backend, "name": s.name, "ref": s.ref, "state": s.state,
                       "cut_started": iso_utc(s.cut_started_at), "cut_at": iso_utc(s.cut_at),
                       "site": s.site, "region": s.region, "manifest_ok": s.manifest_ok, "error": s.error}
                      for s in st.snapshots],
        "restore_tests": [{"id": t.id, "result": t.result, "started_at": iso_utc(t.started_at),
                           "finished_at": iso_utc(t.finished_at), "first_step": t.first_step,
                           "time_to_first_step": t.time_to_first_step, "reason": t.reason,
                           "slurm_job_id": t.slurm_job_id} for t in st.restore_tests],
        "events": [{"at": iso_utc(e.at), "level": e.level, "node": e.node, "kind": e.kind, "message": e.message}
                   for e in events],
    }
