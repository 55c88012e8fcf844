"""`slurm-snap snapshot JOBID`: an on-demand snapshot set of a running job."""
from __future__ import annotations

import json

import click

from .. import errors
from .. import states as S
from .context import DurationType, JobIdType


@click.command("snapshot")
@click.argument("job_id", type=JobIdType(), metavar="JOBID")
@click.option("--consistency", type=click.Choice(S.WANTED), default=None,
              help="app: signal the ranks and wait for every barrier; crash: cut at once, no signal "
                   "[default: protocol.default_consistency].")
@click.option("--deadline", type=DurationType(bare_seconds=True, positive=True), default=None, metavar="DURATION",
              help="How long the ranks have to acknowledge: seconds (30, 0.5) or a duration (2min) "
                   "[default: timeouts.barrier].")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def command(ctx, job_id, consistency, deadline, as_json):
    """Snapshot every declared volume of JOBID as one labelled set.

    Exit status: 8 when the barrier deadline passed before every rank
    acknowledged (app consistency asked), whatever label the set got; the
    set is still cut and recorded. Otherwise 0 when the set is COMPLETE (its
    label says how consistent), 7 when it ended PARTIAL or FAILED, 6 when
    another set of the job or of one of its volumes is in flight.
    """
    from ..protocol.coordinator import Barrier, Coordinator

    out = Coordinator(ctx.config, ctx.inventory).snapshot(job_id, consistency=consistency, deadline=deadline)
    if as_json:
        click.echo(json.dumps(out.as_dict(), indent=2, sort_keys=True, default=str))
    else:
        click.echo(f"set {out.set_id} job {out.job_id} {out.state} {out.consistency}"
                   + (f" step {out.checkpoint_step}" if out.checkpoint_step is not None else "")
                   + (f" skew {out.skew_seconds:.3f}s" if out.skew_seconds is not None else ""))
        if out.reason:
            click.echo(f"reason: {out.reason}")
        if out.failed_nodes:
            click.echo(f"failed nodes: {', '.join(out.failed_nodes)}")
        click.echo("time used: " + ", ".join(f"{k} {v:.3f}s" for k, v in out.phases.items()))
    if out.barrier is Barrier.INCOMPLETE:
        raise errors.BarrierTimeout(set_id=out.set_id, job_id=out.job_id, state=out.state,
                                    consistency=out.consistency, reason=out.reason)
    if out.state == S.COMPLETE:
        return
    raise errors.SetIncomplete(set_id=out.set_id, job_id=out.job_id, state=out.state, reason=out.reason)
