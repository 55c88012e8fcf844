"""The live setup against SECURITY.md: pure checks.

What SECURITY.md promises a site, checked where one host can see it: the
service's port is none of Slurm's (nor in the kernel's ephemeral range);
the files slurm-snap trusts are root's and nobody else may write them or
their directories; those holding a credential (a database password, the
SSH key, the SQLite inventory, munge's key) are readable by their owner
alone; SSH, where a site still uses it, logs in as a restricted account,
not as root, whose sudo rule allows no shell and not ALL. Each function
judges facts the probes gathered (probes.py: file_facts, port_facts,
sudo_rules) and returns findings.
"""
from __future__ import annotations

import re

from ..config import Config
from ..service.address import parse_address
from .facts import FileFacts, PortFacts, SudoFacts
from .finding import Finding

# The slurmrestd port Slurm's documentation and most sites use; it is in no
# file slurm.conf names (slurmrestd is told where to listen when started).
SLURMRESTD_PORT = 6820
DBD_DEFAULT_PORT = 6819


def _ports(value: str | None) -> list[tuple[int, int]]:
    """'6817', '6817-6818', '60001-63000' as ranges; '0', '0-0', '(null)' as none."""
    out = []
    for part in (value or "").split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", part)
        if m:
            lo, hi = int(m[1]), int(m[2] or m[1])
            if lo > 0 and hi >= lo:
                out.append((lo, hi))
    return out


def dbd_port(text: str) -> int:
    """slurmdbd.conf's DbdPort (keys are case-insensitive), else Slurm's default."""
    port = DBD_DEFAULT_PORT
    for line in text.splitlines():
        m = re.fullmatch(r"\s*dbdport\s*=\s*(\d+)\s*(?:#.*)?", line, re.I)
        if m:
            port = int(m[1])
    return port


def slurm_ports(facts: PortFacts) -> list[tuple[str, tuple[int, int]]]:
    """Every port the running Slurm holds or hands out, named by its setting."""
    s = facts.slurm
    named: list[tuple[str, tuple[int, int]]] = []
    for key in ("SlurmctldPort", "SlurmdPort", "SrunPortRange"):
        named += [(key, r) for r in _ports(s.get(key))]
    if "slurmdbd" in s.get("AccountingStorageType", "").lower():
        named += [("AccountingStoragePort", r) for r in _ports(s.get("AccountingStoragePort"))]
    if facts.dbd_conf is not None:
        p = dbd_port(facts.dbd_conf)
        named.append(("DbdPort (slurmdbd.conf)", (p, p)))
    else:
        named.append(("slurmdbd's default DbdPort", (DBD_DEFAULT_PORT, DBD_DEFAULT_PORT)))
    named.append(("slurmrestd's usual port", (SLURMRESTD_PORT, SLURMRESTD_PORT)))
    return named


def check_service_port(cfg: Config, facts: PortFacts) -> list[Finding]:
    """The service's port against Slurm's ports and the ephemeral range."""
    if not cfg.service.listen:
        return []
    _host, port = parse_address(cfg.service.listen)
    clash = [f"{key} {lo}" + (f"-{hi}" if hi != lo else "") for key, (lo, hi) in slurm_ports(facts) if lo <= port <= hi]
    out = [Finding(not clash, f"slurm-snap service port {port} is none of Slurm's"
                   + (f" (it is {', '.join(clash)})" if clash else ""),
                   f"set [service] listen = \"ADDR:6830\" in {cfg.path} (or another free port) and the same port in "
                   "every node's and login host's [inventory] url")]
    if facts.ephemeral is not None:
        lo, hi = facts.ephemeral
        inside = lo <= port <= hi
        out.append(Finding(not inside, f"slurm-snap service port {port} is outside the ephemeral range {lo}-{hi}"
                           + (" (an outgoing connection may hold it when the service starts)" if inside else ""),
                           f"choose a port below {lo}, or reserve it: sysctl net.ipv4.ip_local_reserved_ports={port}"))
    return out


def _bits(mode: int) -> str:
    return f"{mode & 0o7777:04o}"


def check_file(f: FileFacts, *, secret: bool, owners: tuple[str, ...] = ("root",)) -> list[Finding]:
    """A trusted file: owned by `owners`, writable by nobody else, in a
    directory nobody else may write (or sticky); a `secret` one readable by
    its owner alone."""
    if f.error:
        return [Finding(False, f"{f.role} {f.path}: cannot be checked ({f.error})", f"check {f.path} by hand")]
    if not f.exists:
        return []
    rules = [f"owner {' or '.join(owners)}", "nobody else writes it"]
    wrong = []
    if f.owner not in owners:
        wrong.append(f"owned by {f.owner}")
    if f.mode & 0o022:
        wrong.append(f"mode {_bits(f.mode)} lets others write it")
    if secret:
        rules.append("nobody else reads it")
        if f.mode & 0o077:
            wrong.append(f"mode {_bits(f.mode)} lets others read it")
    if f.dir_mode & 0o022 and not f.dir_mode & 0o1000:
        wrong.append(f"its directory (mode {_bits(f.dir_mode)}) lets others replace it")
    elif f.dir_owner and f.dir_owner not in owners and f.dir_owner != "root":
        wrong.append(f"its directory is {f.dir_owner}'s")
    fix = (f"chown {owners[0]} {f.path}; chmod {'0600' if secret else 'go-w'} {f.path}; "
           f"chmod go-w $(dirname {f.path})")
    return [Finding(not wrong, f"{f.role} {f.path}: {', '.join(rules)}" + (f": {'; '.join(wrong)}" if wrong else ""),
                    fix)]


def url_has_password(url: str) -> bool:
    return re.match(r"^[a-z0-9+]+://[^/@]*:[^/@]*@", url) is not None


def check_files(cfg: Config, files: tuple[FileFacts, ...]) -> list[Finding]:
    """Each trusted file by its role: the configuration (secret when it holds
    the database password), the SQLite inventory, the SSH key and
    known_hosts, munge's key."""
    out: list[Finding] = []
    for f in files:
        if f.role == "configuration":
            out += check_file(f, secret=url_has_password(cfg.inventory.url))
        elif f.role in ("SQLite inventory", "SSH key"):
            out += check_file(f, secret=True)
        elif f.role == "munge key":
            out += check_file(f, secret=True, owners=("munge", "root"))
        else:
            out += check_file(f, secret=False)
    return out


def uses_ssh(cfg: Config) -> list[str]:
    """The volume classes whose tools run over SSH."""
    return [vc.name for vc in cfg.volume_classes if vc.transport == "ssh"]


def check_ssh_account(cfg: Config) -> list[Finding]:
    """SSH, where the site still uses it, logs in as a restricted account:
    root's key on the controller would be root on every host it reaches."""
    classes = uses_ssh(cfg)
    if not classes:
        return [Finding(True, "no volume class reaches a host over SSH")]
    root = cfg.ssh.user == "root"
    return [Finding(not root, f"SSH for volume class(es) {', '.join(classes)} logs in as {cfg.ssh.user!r}"
                    + (": whoever holds this host's key is root wherever it reaches" if root else
                       " (not root: its sudo rule is asked on each host it reaches, a forced command is the "
                       "site's: SECURITY.md)"),
                    "use a non-root account with a forced command or a sudo rule allowing only the snapshot "
                    f"tools ([ssh] user in {cfg.path}; SECURITY.md, \"SSH\")")]


# A sudo rule naming one of these lets the account run anything as root.
_ANY = frozenset({"ALL", "sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "su", "sudo", "sudoedit", "env",
                  "python", "python3", "perl", "vi", "vim", "less", "find", "systemctl"})
# These write any file as root with the arguments the controller picks; the
# copying backends need some of them (cp --reflink, tar): a warning.
_WRITES = frozenset({"cp", "mv", "dd", "tee", "tar", "chmod", "chown", "rsync", "install"})


def sudo_hosts(cfg: Config, nodes: list[str] | None) -> list[str]:
    """Where a non-root SSH account logs in (whose sudo rule doctor asks):
    the shared SSH classes' hosts, and `nodes` (None: not known here) when a
    node-local class has transport = "ssh". Nothing for root (its own
    finding) or without SSH classes."""
    from ..backends.factory import ssh_host

    if cfg.ssh.user == "root":
        return []
    hosts = [vc.host for vc in cfg.volume_classes if vc.transport == "ssh" and vc.scope == "shared" and vc.host]
    if nodes and any(vc.transport == "ssh" and vc.scope == "node-local" for vc in cfg.volume_classes):
        hosts += [ssh_host(cfg, n) for n in nodes]
    return list(dict.fromkeys(hosts))


def sudo_commands(text: str) -> list[str] | None:
    """The commands `sudo -l` lists as allowed (its tags, NOPASSWD: and the
    like, and the run-as part dropped), or None when `text` has no such list
    (no sudo rule, or a forced command answered instead). Pure."""
    lines = text.splitlines()
    at = next((i for i, line in enumerate(lines) if "may run the following commands" in line), None)
    if at is None:
        return None
    out = []
    for line in lines[at + 1:]:
        if not line.startswith((" ", "\t")) or not line.strip():
            break
        entry = re.sub(r"^\s*\([^)]*\)\s*", "", line)
        entry = re.sub(r"^(?:[A-Z_]+:\s*)+", "", entry)
        out += [c.strip() for c in entry.split(",") if c.strip()]
    return out


def _program(command: str) -> str:
    first = command.split()[0] if command.split() else ""
    return first.rsplit("/", 1)[-1]


def check_sudo_rules(user: str, facts: list[SudoFacts]) -> list[Finding]:
    """A non-root SSH account's sudo rule on each host it logs in to allows the
    snapshot tools only: none may be ALL, a shell or a program that writes
    any file. A forced command (authorized_keys) answers for itself: a line
    to check by hand, as is a host that could not be asked."""
    out = []
    for f in facts:
        how = f"check by hand: ssh {user}@{f.host} sudo -n -l (SECURITY.md, \"What each credential grants\")"
        if f.error:
            out.append(Finding(True, f"{user}'s sudo rule on {f.host}: cannot ask ({f.error})", how, verified=False))
            continue
        commands = sudo_commands(f.text)
        if commands is None:
            out.append(Finding(True, f"{user}'s sudo rule on {f.host}: `sudo -n -l` listed no commands (exit "
                                     f"{f.status}): a forced command, or no sudo rule", how, verified=False))
            continue
        wide = [c for c in commands if c == "ALL" or _program(c) in _ANY]
        writes = [c for c in commands if _program(c) in _WRITES]
        shown = ", ".join(commands[:4]) + (f", ... ({len(commands)} in all)" if len(commands) > 4 else "")
        fix = f"allow only the snapshot tools in {user}'s sudo rule on {f.host} (etc/README.md has an example)"
        if wide:
            out.append(Finding(False, f"{user}'s sudo rule on {f.host} allows {', '.join(wide)}: any command as root",
                               fix))
        elif writes:
            out.append(Finding(True, f"{user}'s sudo rule on {f.host} allows {', '.join(writes)}: writing any "
                                     "file there as root, with the arguments the controller picks",
                               "a copying backend needs it; narrow its arguments in the rule where the "
                               f"backend allows (SECURITY.md, \"SSH to compute nodes\"); {fix}", warning=True))
        else:
            out.append(Finding(True, f"{user}'s sudo rule on {f.host} allows only: {shown}"))
    return out
