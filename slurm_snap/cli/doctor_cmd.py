"""`slurm-snap doctor`: every missing or conflicting setting, one line each with its fix."""
from __future__ import annotations

import json
import os
import re

import click

from .. import doctor, errors
from ..slurm import commands, hooknames
from ..slurm.version import config_values


@click.command("doctor")
@click.option("--no-slurm", is_flag=True, help="Skip the checks that ask the running Slurm (and the nodes).")
@click.option("--no-nodes", is_flag=True, help="Do not run doctor's own checks on each node over SSH.")
@click.option("--local", "local_only", is_flag=True,
              help="Only the checks that need no Slurm and no other host: this host's backend tools, a "
                   "SQLite inventory, the barrier directory (what a fresh install can check).")
@click.option("--node", "node", metavar="NAME",
              help="Check this host as compute node NAME (what the controller's doctor runs on each node).")
@click.option("--json", "as_json", is_flag=True,
              help='Print {"version": 1, "findings": [{"ok", "what", "fix"}...], "ok", "problems"} instead of lines.')
@click.pass_obj
def command(ctx, no_slurm, no_nodes, local_only, node, as_json):
    """Check Slurm's and slurm-snap's configuration together.

    On the controller, node-local volume classes are checked on each node
    (over SSH), not on the controller's own disk; shared classes reached over
    SSH (a Lustre MGS) are checked on their host, over SSH; each preempting
    partition's GraceTime is checked against the checkpoints its preemptions
    took in the last 30 days (first signal -> last acknowledgement;
    suggested: slowest x 1.5 + 10 s). Slurm unreachable is a finding; the
    other checks still run. Exit 0 when every check passed, 3 otherwise."""
    cfg = ctx.config
    no_slurm = no_slurm or local_only
    findings = []
    nodes = None
    if not no_slurm:
        try:
            slurm = commands.show_config(timeout=cfg.timeouts.slurm_command)
            parts = commands.show_partitions(timeout=cfg.timeouts.slurm_command)
        except errors.SnapError as exc:  # scontrol missing, failing or hanging: say so, check the rest
            findings.append(doctor.slurm_unreachable(exc))
        else:
            findings += _slurm_checks(ctx, cfg, slurm, parts)
            try:
                nodes = commands.node_names(timeout=cfg.timeouts.slurm_command)
            except errors.SnapError as exc:
                findings.append(doctor.slurm_unreachable(exc))
    # With Slurm asked, this is the admin's view from the controller: the
    # nodes' scratch is checked on the nodes (check_topology), not here.
    # Slurm asked but silent: still the controller's view, without the nodes.
    controller = not no_slurm and not cfg.via_service and node is None
    findings += doctor.check_local(cfg, node=node, node_local=not controller, remote=not local_only)
    if controller and nodes is not None:
        findings += doctor.check_topology(cfg, nodes, run_on_node=None if no_nodes else _run_on_node(cfg))
    bad = sum(1 for f in findings if not f.ok)
    if as_json:
        click.echo(json.dumps({"version": 1, "ok": bad == 0, "problems": bad,
                               "findings": [{"ok": f.ok, "what": f.what, "fix": f.fix} for f in findings]},
                              indent=2))
    else:
        for f in findings:
            if f.ok:
                click.echo(f"ok    {f.what}")
            else:
                click.echo(f"FAIL  {f.what}\n      fix: {f.fix}")
        click.echo(f"{len(findings) - bad} ok, {bad} problem(s)")
    if bad:
        raise click.exceptions.Exit(errors.CONFIG)


def _slurm_checks(ctx, cfg, slurm, parts):
    findings = doctor.check_slurm(cfg, slurm, parts,
                                  _read(slurm.get("PlugStackConfig", "/etc/slurm/plugstack.conf")))
    if "lua" in slurm.get("CliFilterPlugins", "").lower():
        # Slurm reads the cli_filter.lua beside slurm.conf.
        path = os.path.join(os.path.dirname(slurm.get("SLURM_CONF", "/etc/slurm/slurm.conf")), "cli_filter.lua")
        findings += doctor.check_cli_filter(cfg, path, _read(path))
    if not cfg.via_service:
        findings += _grace_observed(ctx, cfg, parts)
    for value in config_values(slurm, "PrologSlurmctld"):
        entry = value.split()
        if entry and hooknames.entry_point_name("PrologSlurmctld") in entry[0]:
            text = _read(entry[0])
            named = re.search(r"^DEFAULTS=(\S+)", text or "", re.M)
            findings += doctor.check_entry_point(cfg, entry[0], text, _read(named.group(1)) if named else None)
    return findings


GRACE_DAYS = 30


def _grace_observed(ctx, cfg, parts):
    """GraceTime against the inventory's recent preemptions; nothing when the
    inventory cannot be read (check_local reports that on its own line)."""
    import datetime as dt

    from sqlalchemy.exc import SQLAlchemyError

    from ..clock import utcnow

    try:
        with ctx.inventory.session(readonly=True) as repo:
            observed = repo.preempt_checkpoint_times(utcnow() - dt.timedelta(days=GRACE_DAYS))
    except (errors.SnapError, SQLAlchemyError):  # check_local reports which, with its fix
        return []
    return doctor.check_grace_observed(cfg, parts, observed, GRACE_DAYS)


def _run_on_node(cfg):
    """Doctor's local checks on a node, over SSH (host key verified): the same
    slurm-snap and config path as here, as every host has them (etc/README.md)."""
    import sys

    from ..backends.ssh import SshTransport
    from ..backends.factory import ssh_host

    helper = os.path.join(os.path.dirname(sys.executable), "slurm-snap")

    def run(node):
        try:
            t = SshTransport(ssh_host(cfg, node), known_hosts=cfg.ssh.known_hosts, key_file=cfg.ssh.key,
                             user=cfg.ssh.user, port=cfg.ssh.port, connect_timeout=cfg.ssh.connect_timeout)
            r = t.run([helper, "--config", cfg.path, "doctor", "--no-slurm", "--node", node, "--json"], 120)
        except errors.SnapError as exc:
            return [doctor.Finding(False, f"{node}: doctor over SSH: {exc}", f"check {node}'s sshd and slurm-snap")]
        return node_findings(node, r.status, r.text, helper, r.stderr.decode(errors="replace"))
    return run


def node_findings(node: str, status: int, text: str, helper: str, stderr: str = "") -> list:
    """A node's `doctor --json` output as the controller's findings, each
    named by the node."""
    try:
        data = json.loads(text)
        found = [doctor.Finding(bool(f["ok"]), f"{node}: {f['what']}", str(f.get("fix", "")))
                 for f in data["findings"]]
    except (ValueError, KeyError, TypeError):
        said = (text.strip() or stderr.strip()).splitlines()
        head = said[0][:200] if said else "nothing"
        return [doctor.Finding(False, f"{node}: doctor --json printed no findings (status {status}: {head})",
                               f"install this slurm-snap at {helper} on {node}, with its config at the same path")]
    return found or [doctor.Finding(False, f"{node}: doctor --json printed no findings (status {status})",
                                    f"install this slurm-snap at {helper} on {node}")]


def _read(path: str) -> str | None:
    """A file Slurm reads (None when this host cannot read it: a finding says so)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None
