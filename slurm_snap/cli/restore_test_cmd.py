"""`slurm-snap restore-test JOB|set:ID`: prove a snapshot set restores (docs/restore.md)."""
from __future__ import annotations

import json

import click

from .. import errors
from .context import DurationType


@click.command("restore-test")
@click.argument("selector", metavar="JOB|set:ID", required=False)
@click.option("--command", "command_text", metavar="CMD",
              help="Resume command (split like a shell would, never run by one) "
                   "[default: the one recorded at submit, --snapshot-resume-cmd].")
@click.option("--deadline", type=DurationType(bare_seconds=True, positive=True), metavar="DURATION",
              help="Time to the first step: seconds (120) or a duration (15min) [default: timeouts.restore].")
@click.option("--target", "target_dir", metavar="DIR",
              help="Restore into DIR/<set>-<test> instead of paths.restore_root.")
@click.option("--submit", is_flag=True, help="Run the command as a Slurm job of the job's owner.")
@click.option("--other-nodes", "other_nodes", is_flag=True,
              help="Run the ranks on nodes that cut nothing of the set: each rank's node-local part is brought "
                   "to its node first, cloned there, and removed after (implies --submit).")
@click.option("--nodelist", "nodelist", metavar="HOSTLIST",
              help="Like --other-nodes, on these nodes (position k takes the ranks of the job's node k).")
@click.option("--partition", metavar="P", help="With --submit: the partition for the drill job.")
@click.option("--queue-timeout", type=DurationType(bare_seconds=True, positive=True), default=600.0,
              show_default=True, metavar="DURATION",
              help="With --submit: how long the drill job may wait in the queue: seconds (600) or a duration (10min).")
@click.option("--no-wait", "no_wait", is_flag=True,
              help="With --submit: return once the job is submitted; finish later with --collect.")
@click.option("--collect", is_flag=True,
              help="Record and clean up drills whose Slurm job ended (and dead drills), then exit.")
@click.option("--keep", is_flag=True, help="Keep the clones for inspection (remove them later with --cleanup).")
@click.option("--cleanup", is_flag=True, help="Remove clones left by dead or --keep drills, then exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def command(ctx, selector, command_text, deadline, target_dir, submit, other_nodes, nodelist, partition,
            queue_timeout, no_wait, collect, keep, cleanup, as_json):
    """Clone the set into a spare namespace, run the resume command there as the
    job's owner, and mark the set VERIFIED or FAILED_RESTORE. With --other-nodes
    or --nodelist, on nodes other than the ones that cut the set (the hard case
    of a requeue)."""
    from ..restore.drill import Drill
    from ..restore.placement import Placement
    from ..restore.submit import SlurmSubmitter

    cfg = ctx.config
    submitter = SlurmSubmitter(cfg, queue_timeout=queue_timeout, partition=partition)
    drill = Drill(cfg, ctx.inventory, submitter=submitter)
    if cleanup:
        from ..access import is_operator

        if not is_operator(cfg, drill.caller):
            raise errors.PermissionDenied(why="--cleanup acts on every user's drills; operators only")
        for msg in drill.sweeper.sweep(include_kept=True):
            click.echo(msg)
        return
    if collect:
        for msg in drill.sweeper.sweep():
            click.echo(msg)
        return
    if not selector:
        raise errors.UsageError("restore-test needs JOB or set:ID (or --collect / --cleanup)")
    placement = None
    if other_nodes and nodelist:
        raise errors.UsageError("--other-nodes and --nodelist exclude each other")
    if other_nodes or nodelist:
        from ..slurm.hostlist import expand

        placement = Placement(nodes=tuple(expand(nodelist)) if nodelist else ())
        submit = True
    if no_wait and not submit:
        raise errors.UsageError("--no-wait needs --submit")
    from ..progress import Line

    with Line(f"restore-test {selector}", live=False if as_json else None):
        out = drill.run(selector, command=command_text, deadline=deadline, target=target_dir, keep=keep,
                        submit=submit, wait=not no_wait, placement=placement)
    if out.pending:
        msg = (f"restore test {out.test_id} of set {out.set_id} submitted as Slurm job {out.slurm_job_id}; "
               "record it with: slurm-snap restore-test --collect")
        click.echo(json.dumps({"test_id": out.test_id, "set_id": out.set_id, "result": "SUBMITTED",
                               "slurm_job_id": out.slurm_job_id}) if as_json else msg)
        return
    if as_json:
        click.echo(json.dumps({
            "set_id": out.set_id, "job_id": out.job_id, "test_id": out.test_id,
            "result": "PASSED" if out.passed else "FAILED", "reason": out.reason, "first_step": out.first_step,
            "time_to_first_step": out.time_to_first_step, "namespace": out.namespace, "kept": out.kept,
            "restore_map": out.restore_map, "slurm_job_id": out.slurm_job_id, "nodes": out.nodes,
            "moved": out.moved, "cleanup_errors": out.cleanup_errors}, indent=2, sort_keys=True))
    elif out.passed:
        where = f" on {','.join(out.nodes)}" if out.nodes else ""
        click.echo(f"restore test {out.test_id} of set {out.set_id} (job {out.job_id}): PASSED{where}, first step "
                   f"{out.first_step} after {out.time_to_first_step:.2f} s; set {out.set_id} is VERIFIED")
        for line in out.moved:
            click.echo(f"  {line}")
    if out.kept:
        click.echo(f"clones kept in {out.namespace} (remove with: slurm-snap restore-test --cleanup)", err=True)
    if out.cleanup_errors:
        raise errors.BackendError(backend="restore-test",
                                  why="cleanup incomplete (rerun `slurm-snap restore-test --cleanup`): "
                                      + "; ".join(out.cleanup_errors))
    if not out.passed:
        raise errors.RestoreFailed(test_id=out.test_id, set_id=out.set_id, reason=out.reason)
