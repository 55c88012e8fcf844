"""`slurm-snap doctor`: every missing or conflicting setting, one line each with its fix.

This command only gathers (doctor/probes.py) and prints; every verdict is a
pure check of slurm_snap/doctor/.
"""
from __future__ import annotations

import json
import os
import re

import click

from .. import errors
from ..doctor import probes, security_checks, site_checks, slurm_checks
from ..slurm import api as slurm_api, clifilter, commands

GRACE_DAYS = 30


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
    suggested: slowest x 1.5 + 10 s). What each hook runs is read as slurmd
    runs it (a glob such as Prolog=/etc/slurm/prolog.d/* expanded); a site
    program that does not name slurm-snap's entry point cannot be verified
    here, and the line says how to check it by hand. The live setup is checked
    against SECURITY.md: the service's port against Slurm's (slurm.conf,
    slurmdbd.conf) and the ephemeral range, owners and modes of the
    configuration, the SQLite inventory, the SSH key and known_hosts and
    munge's key, SSH as root, a non-root SSH account's sudo rule on each
    host it logs in to (`sudo -n -l`). Slurm unreachable is a finding; the other
    checks still run. Exit 0 when every check passed, 3 otherwise."""
    cfg = ctx.config
    no_slurm = no_slurm or local_only
    findings = []
    nodes = None
    if not no_slurm:
        try:
            slurm = commands.show_config(timeout=cfg.timeouts.slurm_command)
            parts = commands.show_partitions(timeout=cfg.timeouts.slurm_command)
        except errors.SnapError as exc:  # scontrol missing, failing or hanging: say so, check the rest
            findings.append(slurm_checks.slurm_unreachable(exc))
        else:
            findings += _slurm_checks(ctx, cfg, slurm, parts)
            try:
                nodes = commands.node_names(timeout=cfg.timeouts.slurm_command)
            except errors.SnapError as exc:
                findings.append(slurm_checks.slurm_unreachable(exc))
    # With Slurm asked, this is the admin's view from the controller: the
    # nodes' scratch is checked on the nodes (topology), not here.
    # Slurm asked but silent: still the controller's view, without the nodes.
    controller = not no_slurm and not cfg.via_service and node is None
    findings += site_checks.check_local(cfg, probes.local(cfg, node=node, node_local=not controller,
                                                           remote=not local_only))
    findings += security_checks.check_files(cfg, probes.trusted_files(cfg))
    if not cfg.via_service and node is None and not local_only:
        # The account other hosts are reached with: not this host's own fact.
        findings += security_checks.check_ssh_account(cfg)
        hosts = security_checks.sudo_hosts(cfg, nodes if controller else None)
        if hosts:
            findings += security_checks.check_sudo_rules(cfg.ssh.user, probes.sudo_rules(cfg, hosts))
        # Where drills and root's reach go: a host with the inventory runs them.
        findings += site_checks.check_who_runs_what(cfg)
    if controller and nodes is not None:
        facts = probes.topology(cfg, nodes, node_doctor=None if no_nodes else probes.node_doctor)
        findings += site_checks.check_topology(cfg, facts)
    _print(findings, as_json)


def _slurm_checks(ctx, cfg, slurm, parts):
    hooks = probes.all_hook_scripts(slurm)
    findings = slurm_checks.check_slurm(cfg, slurm, parts,
                                        probes.read_text(slurm.get("PlugStackConfig", "/etc/slurm/plugstack.conf")),
                                        hooks)
    expedites = None
    if "lua" in slurm.get("CliFilterPlugins", "").lower():
        # Slurm reads the cli_filter.lua beside slurm.conf.
        path = os.path.join(os.path.dirname(slurm.get("SLURM_CONF", "/etc/slurm/slurm.conf")), "cli_filter.lua")
        text = probes.read_text(path)
        findings += slurm_checks.check_cli_filter(cfg, path, text)
        expedites = None if text is None else clifilter.expedites(text)
    findings += slurm_checks.check_requeue(slurm, expedites)
    findings.append(slurm_checks.check_slurm_api(slurm_api.chosen(), slurm_checks.running_version(slurm)))
    if not cfg.via_service:
        findings += _grace_observed(ctx, cfg, parts)
    if cfg.service.listen:
        findings += security_checks.check_service_port(cfg, probes.port_facts(slurm))
    entry = slurm_checks.our_script("PrologSlurmctld", hooks["PrologSlurmctld"])
    if entry is not None:
        text = probes.read_text(entry.path)
        named = re.search(r"^DEFAULTS=(\S+)", text or "", re.M)
        findings += slurm_checks.check_entry_point(cfg, entry.path, text,
                                                   probes.read_text(named.group(1)) if named else None)
    return findings


def _grace_observed(ctx, cfg, parts):
    """GraceTime against the inventory's recent preemptions; nothing when the
    inventory cannot be read (the local checks report that on their own line)."""
    observed = probes.checkpoint_times(ctx.inventory, GRACE_DAYS)
    return [] if observed is None else slurm_checks.check_grace_observed(cfg, parts, observed, GRACE_DAYS)


def _print(findings, as_json: bool) -> None:
    bad = sum(1 for f in findings if not f.ok)
    unverified = sum(1 for f in findings if f.ok and not f.verified)
    warned = sum(1 for f in findings if f.ok and f.verified and f.warning)
    if as_json:
        click.echo(json.dumps({"version": 1, "ok": bad == 0, "problems": bad,
                               "findings": [{"ok": f.ok, "what": f.what, "fix": f.fix,
                                             **({"warning": True} if f.warning else {})} for f in findings]},
                              indent=2))
    else:
        for f in findings:
            if not f.ok:
                click.echo(f"FAIL  {f.what}\n      fix: {f.fix}")
            elif not f.verified:
                click.echo(f"CHECK {f.what}\n      how: {f.fix}")
            elif f.warning:
                click.echo(f"WARN  {f.what}\n      why: {f.fix}")
            else:
                click.echo(f"ok    {f.what}")
        by_hand = f", {unverified} to check by hand" if unverified else ""
        warnings = f", {warned} warning(s)" if warned else ""
        click.echo(f"{len(findings) - bad - unverified - warned} ok{by_hand}{warnings}, {bad} problem(s)")
    if bad:
        raise click.exceptions.Exit(errors.CONFIG)
