"""`slurm-snap node-agent`: one pass of this node's agent (slurm_snap/nodeagent)."""
from __future__ import annotations

import json
import os
import signal
import time

import click

from .. import errors
from .context import DurationType


def _report_lines(report) -> list[str]:
    if report.skipped:
        return [report.skipped]
    out = []
    for r in report.results:
        head = f"{r.name}: {r.done} done, {r.left} waiting"
        out.append(head + (f"; the service is away: {r.away}" if r.away else ""))
        out += [f"  {line}" for line in r.lines]
        out += [f"  refused: {e}" for e in r.errors]
    return out


def _as_dict(report) -> dict:
    return {"skipped": report.skipped or None, "away": report.away or None,
            "state": report.state.to_json(),
            "passes": [{"name": r.name, "done": r.done, "left": r.left, "away": r.away or None,
                        "lines": list(r.lines), "errors": list(r.errors)} for r in report.results]}


@click.command("node-agent")
@click.option("--now", is_flag=True, help="Try at once, whatever the backoff after the service was away says.")
@click.option("--status", is_flag=True, help="Say what waits in this node's spool and the backoff; change nothing.")
@click.option("--loop", type=DurationType(bare_seconds=True, positive=True), metavar="DURATION",
              help="Run a pass every DURATION (at least 1 s; bare seconds too) until stopped (the dev "
                   "cluster's stand-in for the systemd timer).")
@click.option("--pidfile", metavar="FILE", help="With --loop: write the loop's PID here (removed on exit).")
@click.option("--json", "as_json", is_flag=True, help="Print the pass as JSON.")
@click.option("--quiet", is_flag=True, help="Print nothing (a hook's background pass).")
@click.pass_obj
def command(ctx, now, status, loop, pidfile, as_json, quiet):
    """Deliver this node's spool to the inventory, oldest first: what its
    Epilogs cut while the slurm-snap service or the database did not answer.
    One pass, then exit: run by etc/slurm-snap-node-agent.timer every 30 s
    and at boot, and started by every slurm-snap hook on the node when the
    spool holds something. After a pass that found the service away the
    next waits 5 s, doubling to 60 s (--now ignores it). Exit 0 when the
    pass ran (whatever it could deliver), 9 when the service was away.
    Root only (the spool is root's)."""
    from ..nodeagent.agent import run_once
    from ..spool.outbox import Outbox

    cfg = ctx.config
    if os.geteuid() != 0:
        raise errors.PermissionDenied(why="the node agent reads root's spool and speaks for the node's hooks: "
                                          "run it as root")
    if status:
        outbox = Outbox.of(cfg)
        names = outbox.names()
        state = outbox.read_state()
        doc = {"directory": cfg.spool.directory, "entries": names, "bytes": outbox.used_bytes(),
               "state": state.to_json()}
        if as_json:
            click.echo(json.dumps(doc, indent=2, sort_keys=True))
        else:
            click.echo(f"{len(names)} entries ({doc['bytes']} bytes) in {cfg.spool.directory}")
            if state.failures:
                click.echo(f"the service was away {state.failures} time(s) in a row: {state.last_error}")
        return
    if loop:
        if loop < 1.0:
            raise errors.BadValueError(what="--loop", value=str(loop), why="at least 1 s between passes")
        _loop(cfg, loop, pidfile)
        return
    report = run_once(cfg, force=now)
    if as_json:
        click.echo(json.dumps(_as_dict(report), indent=2, sort_keys=True))
    elif not quiet:
        for line in _report_lines(report):
            click.echo(line)
    if report.away:
        raise errors.ServiceUnavailable(why=f"entries remain in {cfg.spool.directory}: {report.away}")


def _loop(cfg, every: float, pidfile: str | None) -> None:
    """Passes every `every` seconds until SIGTERM; each pass's failures are
    its own (logged to stderr), never the loop's end."""
    from ..fsio import atomic_write
    from ..nodeagent.agent import run_once

    stop = {"now": False}

    def on_term(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if pidfile:
        atomic_write(pidfile, f"{os.getpid()}\n".encode(), mode=0o644)
    try:
        while not stop["now"]:
            try:
                report = run_once(cfg)
                for line in _report_lines(report) if (report.results and any(
                        r.done or r.errors or r.away for r in report.results)) else []:
                    click.echo(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", err=True)
            except errors.SnapError as exc:
                click.echo(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} slurm-snap node-agent: {exc}", err=True)
            deadline = time.monotonic() + every
            while not stop["now"] and time.monotonic() < deadline:
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    finally:
        if pidfile:
            try:
                os.unlink(pidfile)
            except OSError:
                pass
