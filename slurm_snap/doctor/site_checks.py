"""slurm-snap's own side and the cluster's topology: pure checks.

Each function judges facts the probes gathered (probes.py: the inventory
reached or not, each volume class's backend as built on a host, the service
answering, SSH host keys, what a node's own doctor printed) and returns
findings; nothing here opens, runs or reads anything.
"""
from __future__ import annotations

import json

from ..config import Config
from .facts import ClassTools, InventoryReach, LocalFacts, NodeReport, TopologyFacts
from .finding import Finding


def check_inventory(cfg: Config, reach: InventoryReach) -> list[Finding]:
    if reach.via_service and not reach.error:
        return [Finding(True, f"inventory reachable through the slurm-snap service "
                              f"({reach.where}, MUNGE uid {reach.uid})")]
    if not reach.error:
        return [Finding(True, f"inventory reachable ({reach.where})")]
    if reach.driver_error:   # a schema missing shows up as a driver error
        return [Finding(False, f"inventory: {reach.error}", "run `slurm-snap db upgrade`")]
    fix = ("start `slurm-snap serve` on the controller and munged here (etc/README.md, \"The service\")"
           if reach.via_service else "fix [inventory] url, run `slurm-snap db upgrade`")
    return [Finding(False, f"inventory: {reach.error}", fix)]


def check_class(cfg: Config, c: ClassTools) -> list[Finding]:
    """A volume class's backend on one host: its tools, the version or
    dialect they report, and whether its directory is the filesystem the
    backend snapshots (a scratch that is plain ext4 on one node cuts nothing
    there)."""
    if c.over_ssh == "shared":
        head, fix = (f"volume class {c.name} over SSH on {c.where}",
                     f"check {c.where}'s sshd, its host key in {cfg.ssh.known_hosts} and the tool there, "
                     f"or fix volume_class {c.name!r}")
    elif c.over_ssh == "node":
        head, fix = (f"{c.host}: volume class {c.name} over SSH",
                     f"install the tool on {c.host}, or fix [ssh] / volume_class {c.name!r}")
    else:
        head, fix = (f"volume class {c.name}", f"install the tool on this host, or fix volume_class {c.name!r}")
    if c.error:
        return [Finding(False, f"{head}: {c.error}", fix)]
    out = [Finding(True, f"{head}: backend {c.backend} tools present")]
    if c.tool_error:
        out.append(Finding(False, f"volume class {c.name} on {c.where}: cannot tell the {c.backend} tool's "
                                  f"version: {c.tool_error}",
                           f"run the {c.backend} tool by hand on {c.where} (docs/backends.md: what to check first)"))
    elif c.tool_report is not None:
        out.append(Finding(True, f"volume class {c.name} on {c.where}: backend {c.backend} found {c.tool_report}"))
    fs = c.fs
    if fs is not None and fs.want:
        if fs.error:
            out.append(Finding(False, f"volume class {c.name} on {c.where}: cannot stat {fs.prefix}: {fs.error}",
                               f"make {fs.prefix} exist on {c.where}"))
        else:
            out.append(Finding(fs.got in fs.want, f"volume class {c.name} on {c.where}: {fs.prefix} is {fs.got or '?'} "
                                                  f"(backend {c.backend} needs {' or '.join(fs.want)})",
                               f"mount the {fs.want[0]} filesystem at {fs.prefix} on {c.where}, "
                               f"or fix volume_class {c.name!r}"))
    return out


def check_who_runs_what(cfg: Config) -> list[Finding]:
    """Where users' programs and root's reach go (issue 31): drills as Slurm
    jobs of the owner, node-local work by root on the node, SSH only for
    what the site names (its account: security_checks.check_ssh_account)."""
    out = []
    if cfg.restore.mode == "local":
        out.append(Finding(True, "restore drills run the job's program in the drilling process, on this host "
                                 "([restore] mode = \"local\")",
                           "a single-host site's choice: elsewhere users' programs would run on the controller, "
                           "without the job's nodes, GPUs and node-local disks; set [restore] mode = \"job\"",
                           warning=True))
    else:
        out.append(Finding(True, "restore drills run as Slurm jobs of the job's owner on its nodes "
                                 "([restore] mode = \"job\")"))
    node_local = [vc for vc in cfg.volume_classes if vc.scope == "node-local"]
    cuts = [vc.name for vc in node_local if vc.transport == "ssh"]
    # SECURITY.md, "SSH to compute nodes": what still goes from here to a node.
    uses = []
    if cuts:
        uses.append(f"on-demand and periodic cuts of node-local class(es) {', '.join(cuts)} (transport = \"ssh\")")
    if node_local and cfg.restore.move_budget > 0:
        uses.append(f"a requeued run's node-local parts moved to its new nodes ([restore] move_budget = "
                    f"{cfg.restore.move_budget:g})")
    if uses:
        out.append(Finding(True, f"SSH from this host to compute nodes as {cfg.ssh.user!r} for: {'; '.join(uses)}",
                           "drills' clones, deletes and partner copies of node-local parts are done on the node "
                           "(Prolog, node tasks) whatever the transport; these, --other-nodes drills and repair's "
                           "probes still log in to nodes. For none: node-local classes at transport = \"local\" "
                           "without on-demand or periodic cuts, [restore] move_budget = 0 (SECURITY.md, "
                           "\"SSH to compute nodes\")",
                           warning=True))
    return out


def check_local(cfg: Config, facts: LocalFacts) -> list[Finding]:
    """slurm-snap's own side on this host: inventory, backends' tools, barrier directory."""
    out = check_inventory(cfg, facts.inventory) if facts.inventory is not None else []
    for c in facts.classes:
        out += check_class(cfg, c)
    out.append(Finding(facts.barrier_dir_exists, f"barrier directory {facts.barrier_dir} exists",
                       f"create {facts.barrier_dir} on a filesystem every node mounts"))
    return out


def check_topology(cfg: Config, facts: TopologyFacts) -> list[Finding]:
    """The controller's view of the cluster: where the inventory is, the
    service answering, every node's SSH host key, each node's node-local
    classes, and what each node's own doctor found."""
    out: list[Finding] = []
    others = [n for n in facts.nodes if n != facts.local_host]
    if cfg.inventory.url.startswith("sqlite") and others and not cfg.service.listen:
        out.append(Finding(False, f"SQLite inventory on {facts.local_host} with {len(others)} other hosts and no "
                                  "slurm-snap service: node Epilogs cannot record",
                           "set [service] listen here and run `slurm-snap serve` (nodes and login hosts: "
                           "[inventory] url = \"slurm-snap://ADDR:PORT\"), or use PostgreSQL/MariaDB"))
    if facts.service_error is not None:
        if not facts.service_error:
            out.append(Finding(True, f"slurm-snap service listening on {cfg.service.listen}"))
        else:
            out.append(Finding(False, f"slurm-snap service not answering on {cfg.service.listen} "
                                      f"({facts.service_error})", "start `slurm-snap serve` (etc/README.md)"))
    for n in facts.node_facts:
        out.append(Finding(n.host_key_known, f"{n.node}: SSH host key of {n.address} in {cfg.ssh.known_hosts}"
                           + ("" if n.host_key_known else " missing"),
                           f"add {n.node}'s host key (ssh-keyscan -p {cfg.ssh.port} {n.address}, check its "
                           f"fingerprint) to {cfg.ssh.known_hosts}"))
        for c in n.classes:
            out += check_class(cfg, c)
        if n.report is not None:
            out += node_findings(n.report)
    return out


def node_findings(report: NodeReport) -> list[Finding]:
    """A node's `doctor --json` output as the controller's findings, each
    named by the node."""
    node, helper = report.node, report.helper
    if report.error:
        return [Finding(False, f"{node}: doctor over SSH: {report.error}", f"check {node}'s sshd and slurm-snap")]
    try:
        data = json.loads(report.stdout)
        found = [Finding(bool(f["ok"]), f"{node}: {f['what']}", str(f.get("fix", ""))) for f in data["findings"]]
    except (ValueError, KeyError, TypeError):
        said = (report.stdout.strip() or report.stderr.strip()).splitlines()
        head = said[0][:200] if said else "nothing"
        return [Finding(False, f"{node}: doctor --json printed no findings (status {report.status}: {head})",
                        f"install this slurm-snap at {helper} on {node}, with its config at the same path")]
    return found or [Finding(False, f"{node}: doctor --json printed no findings (status {report.status})",
                             f"install this slurm-snap at {helper} on {node}")]
