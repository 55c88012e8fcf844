"""`slurm-snap resume-path`: inside a running job, what this run resumes
from (slurm_snap.client.resume_path, which is also what
`python -m slurm_snap.client.resume_path` runs where only the client is)."""
from __future__ import annotations

import click


@click.command("resume-path", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args):
    """Print what this run of the job resumes from (nothing on a fresh start);
    --step, --json, --rank N. Run inside the job (e.g. in the batch script)."""
    from ..client.resume_path import main

    raise click.exceptions.Exit(main(list(args), prog="slurm-snap resume-path"))
