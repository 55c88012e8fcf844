"""After drills that did not finish: the crash sweep.

A drill killed anywhere leaves its restore test RUNNING and its crash journal
(journal.py) in its namespace. Before each drill, and on `restore-test
--collect` / `--cleanup`, the sweep finds such tests and
  - finishes a --no-wait drill whose Slurm job has ended (verdict, cleanup,
    record: outcome.py), or cancels it past its deadline;
  - cleans up a drill whose process is gone (its host's, by pid; a drill of
    another host is left to that host) and closes its test as interrupted,
    leaving the set's state alone;
  - with include_kept, removes the namespaces of finished --keep drills.
A drill that this process runs now (in another thread: the schedule runner's
drills) is in `LiveDrills` and never swept; its pid alone cannot tell it from
a leftover of an earlier process that had the pid.
"""
from __future__ import annotations

import datetime as dt
import os

from .. import errors
from ..access import Caller, is_operator
from ..clock import utcnow
from . import journal as journal_mod
from . import namespace as nsmod
from .live import LiveDrills
from .outcome import Outcome, judge_job, record

# A RUNNING test without a journal younger than this may still be setting up.
STALE_AFTER = 120.0


def _owns(caller: Caller, run) -> bool:
    return caller.uid == run.uid or caller.name == run.user_name


class Sweep:
    """The sweep of one caller's view: an operator's covers every drill, a
    user's their own jobs' drills only."""

    def __init__(self, cfg, inventory, *, caller: Caller, submitter, backend_for, backend_on,
                 live: LiveDrills) -> None:
        self.cfg = cfg
        self.inv = inventory
        self.caller = caller
        self.submitter = submitter
        self.backend_for = backend_for
        self.backend_on = backend_on
        self.live = live

    def remove(self, ns: str, snapshots) -> list[str]:
        return nsmod.remove_drill(self.inv, ns, snapshots, self.backend_for, self.backend_on)

    def sweep(self, *, include_kept: bool = False) -> list[str]:
        """Clean up after drills that died (and, with include_kept, after --keep ones).

        Returns messages about what was cleaned or could not be.
        """
        messages: list[str] = []
        operator = is_operator(self.cfg, self.caller)
        with self.inv.session() as repo:
            running = [(rt.id, rt.set_id, rt.target, rt.started_at) for rt in repo.running_restore_tests()]
            if not operator:
                # A sweep names no job: a user's covers their own drills, never
                # another's (cancelling its Slurm job, failing its set).
                runs = {set_id: repo.get_set(set_id).job_run for _, set_id, _, _ in running}
                running = [r for r in running if _owns(self.caller, runs[r[1]])]
            rows = {rt_set: repo.snapshots(rt_set, include_deleted=True) for _, rt_set, _, _ in running}
        now = utcnow()
        for test_id, set_id, ns, started in running:
            if test_id in self.live:
                continue   # another thread of this process runs it (the schedule runner's drills)
            try:
                journal = journal_mod.read(ns) if ns else None
            except errors.BadValueError as exc:
                # Not a journal a drill wrote: what it lists cannot be trusted
                # for removal, so nothing is removed; an operator looks.
                messages.append(f"restore test {test_id}: left alone: {exc}")
                continue
            if journal is not None and journal.detached:
                messages += self._collect(test_id, set_id, ns, journal, rows[set_id])
                continue
            if journal is not None:
                if journal.host != nsmod.this_host():
                    continue  # another host's drill: only that host can tell whether it lives
                if nsmod.pid_alive(journal.pid) and journal.pid != os.getpid():
                    continue
            elif (now - started).total_seconds() < STALE_AFTER:
                continue
            if journal and journal.slurm_job_id and self.submitter is not None:
                self.submitter.cancel(journal.slurm_job_id)
            errs = self.remove(ns, rows[set_id]) if ns and os.path.isdir(ns) else []
            if errs:
                messages.append(f"restore test {test_id}: cleanup incomplete: {'; '.join(errs)}")
                continue
            with self.inv.session() as repo:
                repo.finish_restore_test(test_id, passed=False, first_step=None, time_to_first_step=None,
                                         reason="interrupted: the drill process is gone; clones cleaned up")
                repo.event("restore_test", f"restore test {test_id}: interrupted drill cleaned up",
                           set_id=set_id, level="warning")
            messages.append(f"restore test {test_id}: interrupted drill cleaned up ({ns})")
        if include_kept:
            messages += self._sweep_kept()
        return messages

    def _collect(self, test_id: int, set_id: int, ns: str, journal: journal_mod.Journal, rows) -> list[str]:
        """Finish a --no-wait drill whose Slurm job has ended: verdict, cleanup, record."""
        job = journal.slurm_job_id
        if self.submitter is None or job is None:
            return []
        try:
            done, last = self.submitter.finished(job)
        except errors.SnapError as exc:
            return [f"restore test {test_id}: cannot ask Slurm about job {job}: {exc}"]
        deadline = float(journal.deadline or self.cfg.timeouts.restore)
        out = Outcome(set_id=set_id, job_id=0, test_id=test_id, passed=False, reason="", namespace=ns,
                      slurm_job_id=job)
        try:
            if not done:
                started = dt.datetime.fromisoformat(journal.started_at)
                if (utcnow() - started).total_seconds() < self.submitter.wait_bound(deadline):
                    return [f"restore test {test_id}: Slurm job {job} is {last}"]
                self.submitter.cancel(job)
                result = self.submitter.overdue(job, last, deadline)
            else:
                result = self.submitter.result(job, os.path.join(ns, nsmod.MARKER_DIR), last)
            judge_job(self.inv, out, result, journal.checkpoint_step, deadline)
        except errors.SnapError as exc:
            # Not the set's fault (the queue, a node's setup): close the test, keep the set's state.
            errs = self.remove(ns, rows)
            with self.inv.session() as repo:
                repo.finish_restore_test(test_id, passed=False, first_step=None, time_to_first_step=None,
                                         reason=f"drill aborted: {exc}" + (f"; cleanup left: {'; '.join(errs)}"
                                                                           if errs else ""))
            return [f"restore test {test_id} of set {set_id}: aborted: {exc}"]
        out.cleanup_errors = out.cleanup_errors + self.remove(ns, rows)
        with self.inv.session() as repo:
            out.job_id = repo.get_set(set_id).job_id
        record(self.inv, out)
        return [f"restore test {test_id} of set {set_id}: " + ("PASSED" if out.passed else f"FAILED: {out.reason}")]

    def _sweep_kept(self) -> list[str]:
        messages = []
        root = self.cfg.paths.restore_root
        try:
            entries = sorted(os.listdir(root))
        except FileNotFoundError:
            return messages
        for entry in entries:
            ns = os.path.join(root, entry)
            try:
                journal = journal_mod.read(ns)
            except errors.BadValueError as exc:
                messages.append(f"{ns}: left alone: {exc}")
                continue
            if journal is None:
                continue
            with self.inv.session() as repo:
                try:
                    rt = repo.restore_test(journal.test_id)
                except errors.NotFound:
                    continue
                if rt.result == "RUNNING":
                    continue
                rows = repo.snapshots(journal.set_id, include_deleted=True)
            errs = self.remove(ns, rows)
            messages.append(f"{ns}: " + ("removed" if not errs else "cleanup incomplete: " + "; ".join(errs)))
        return messages
