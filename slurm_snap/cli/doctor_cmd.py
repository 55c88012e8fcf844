"""`slurm-snap doctor`: every missing or conflicting setting, one line each with its fix."""
from __future__ import annotations

import click

from .. import doctor, errors
from ..slurm import commands


@click.command("doctor")
@click.option("--no-slurm", is_flag=True, help="Skip the checks that ask the running Slurm.")
@click.pass_obj
def command(ctx, no_slurm):
    """Check Slurm's and slurm-snap's configuration together."""
    cfg = ctx.config
    findings = []
    if not no_slurm:
        slurm = commands.show_config(timeout=cfg.timeouts.slurm_command)
        parts = commands.show_partitions(timeout=cfg.timeouts.slurm_command)
        plug = slurm.get("PlugStackConfig", "/etc/slurm/plugstack.conf")
        try:
            with open(plug, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            text = None
        findings += doctor.check_slurm(cfg, slurm, parts, text)
        entry = slurm.get("PrologSlurmctld", "").split()
        if entry and "slurm-snap-prolog-slurmctld" in entry[0]:
            try:
                with open(entry[0], encoding="utf-8", errors="replace") as fh:
                    script = fh.read()
            except OSError:
                script = None
            findings += doctor.check_entry_point(cfg, entry[0], script)
    findings += doctor.check_local(cfg)
    bad = 0
    for f in findings:
        if f.ok:
            click.echo(f"ok    {f.what}")
        else:
            bad += 1
            click.echo(f"FAIL  {f.what}\n      fix: {f.fix}")
    click.echo(f"{len(findings) - bad} ok, {bad} problem(s)")
    if bad:
        raise click.exceptions.Exit(errors.CONFIG)
