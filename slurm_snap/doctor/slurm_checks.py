"""Slurm's running configuration against slurm-snap's: pure checks.

Every function here takes what the probes gathered (`scontrol show config`
as a dict, the partitions, the text of files Slurm reads, the inventory's
checkpoint times) and returns findings; nothing here reads a file, runs a
command or opens a connection.
"""
from __future__ import annotations

import os
import re

from ..config import Config
from ..errors import ConfigError
from ..slurm import clifilter, hooknames
from ..slurm.commands import DEFAULT_SLURM_CONF
from ..slurm.duration import slurm_seconds
from ..slurm.version import OLDEST, SlurmVersion, config_values
from .. import states as S
from .facts import HookScript
from .finding import Finding


def budget_seconds(cfg: Config) -> float:
    """What a preemption needs inside the grace window: the ranks' checkpoint
    and acknowledgement (timeouts.barrier). The cuts run in the node Epilog,
    after the job's processes are gone, under the hook budget instead."""
    return cfg.timeouts.barrier


def check_slurm(cfg: Config, slurm: dict[str, str], partitions: list[dict[str, str]],
                plugstack_text: str | None, hooks: dict[str, tuple[HookScript, ...]] | None = None) -> list[Finding]:
    """`slurm`: `scontrol show config` as a dict; `partitions`: `scontrol show
    partition`'s; `plugstack_text`: plugstack.conf (None: unreadable here);
    `hooks`: what each hook key will run (probes.hook_scripts), else judged
    from the configured paths' names alone."""
    out: list[Finding] = []
    flags = slurm.get("PrologFlags", "")
    out.append(Finding("alloc" in flags.lower(), "PrologFlags includes Alloc (Prolog runs on every node at allocation)",
                       "add PrologFlags=Alloc to slurm.conf (without it the Prolog runs only where a step lands)"))
    for key in hooknames.ENTRY_POINTS:
        scripts = hooks[key] if hooks is not None else tuple(HookScript(v, v) for v in config_values(slurm, key))
        out.append(check_hook(cfg, key, scripts))
    version = running_version(slurm)
    key, value = version.preempt_signal_setting
    out.append(Finding(value in _items(slurm.get(key, "")),
                       f"the user's signal is sent at preemption ({key}={value}, Slurm {version})",
                       f"add {key}={value} to slurm.conf (the spelling of Slurm {version.major}.{version.minor:02d}; "
                       "otherwise ranks get SIGTERM, not the checkpoint signal)"))
    cli = slurm.get("CliFilterPlugins", "").lower()
    js = slurm.get("JobSubmitPlugins", "").lower()
    out.append(Finding("lua" in cli or "slurm_snap" in js,
                       "--snapshot-on-preempt asks Slurm for the signal (cli_filter or job_submit)",
                       "CliFilterPlugins=lua with etc/cli_filter.lua beside slurm.conf"))
    if plugstack_text is None:
        out.append(Finding(False, "plugstack.conf readable", f"create {slurm.get('PlugStackConfig', 'plugstack.conf')}"))
    else:
        lines = [ln.strip() for ln in plugstack_text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        ours = [ln for ln in lines if "slurm_snap" in ln and ".so" in ln]
        out.append(Finding(bool(ours), "plugstack.conf loads slurm_snap.so",
                           "add the line from etc/plugstack.conf, then restart slurmd"))
        if ours:
            obsolete = [a for ln in ours for a in ln.split() if a.startswith(("signal=", "grace="))]
            out.append(Finding(not obsolete, "plugstack.conf's slurm_snap.so line carries only helper= and config=",
                               f"remove {' '.join(obsolete)}: the plugin no longer reads them; the signal and "
                               f"its time come from [protocol] in {cfg.path} (cli_filter.lua is written from it)"))
    conf = slurm.get("SLURM_CONF", "")
    hooks_read = cfg.slurm.conf or DEFAULT_SLURM_CONF
    if conf:
        out.append(Finding(conf == hooks_read,
                           f"the slurmctld hooks reach Slurm through {hooks_read} (slurmctld reads {conf})",
                           f"set [slurm] conf = \"{conf}\" in {cfg.path}: PrologSlurmctld and EpilogSlurmctld "
                           "run without SLURM_CONF, and EpilogSlurmctld cannot see a preemption without squeue"))
    need = budget_seconds(cfg)
    for p in partitions:
        mode = p.get("PreemptMode", "").upper()
        if mode not in ("REQUEUE", "CANCEL"):
            continue
        grace = slurm_seconds(p.get("GraceTime", "0")) or 0
        name = p.get("PartitionName", "?")
        out.append(Finding(grace >= need,
                           f"partition {name}: GraceTime {grace} s fits checkpoint + barrier ({need:g} s)",
                           f"raise GraceTime of {name} to at least {int(need) + 1} s, or lower "
                           f"timeouts.barrier in {cfg.path}"))
    for key in version.hook_timeout_keys:
        pet = slurm_seconds(slurm.get(key))
        if pet:
            out.append(Finding(cfg.timeouts.hook_budget < pet,
                               f"hook budget {cfg.timeouts.hook_budget:g} s is under {key} {pet} s",
                               f"lower timeouts.hook_budget in {cfg.path} below {pet} s"))
    return out


# Slurm runs each file a hook key names: a path, or (Prolog, Epilog) a glob
# such as /etc/slurm/prolog.d/*, every match in turn; 24.11 prints several
# values as Prolog[0], Prolog[1]. slurm-snap's entry point may be one of them
# under its own name, a renamed copy (its first comment names the key), or
# called from a site's wrapper.
NODE_HOOKS = ("Prolog", "Epilog")


def _ours(key: str, script: HookScript) -> bool:
    name = hooknames.entry_point_name(key)
    return bool(script.path) and (os.path.basename(script.path) == name or
                                  f"slurm-snap entry point for Slurm's {key}=" in (script.text or ""))


def _names(key: str, text: str | None) -> bool:
    # slurm-snap-prolog must not be found in slurm-snap-prolog-slurmctld.
    name = hooknames.entry_point_name(key)
    return bool(text) and re.search(re.escape(name) + r"(?![\w.-])", text) is not None


def our_script(key: str, scripts: tuple[HookScript, ...]) -> HookScript | None:
    """The file among `scripts` that is slurm-snap's entry point for `key`."""
    return next((s for s in scripts if _ours(key, s)), None)


def check_hook(cfg: Config, key: str, scripts: tuple[HookScript, ...]) -> Finding:
    """Does what Slurm runs for `key` run slurm-snap's entry point? Decided
    from the files when this host has them; a program that does not name the
    entry point (a site wrapper running a directory of scripts, a file only
    the nodes have) cannot be decided here: said so, with how to check."""
    name = hooknames.entry_point_name(key)
    fix = f"set {key}=/path/to/{name} in slurm.conf (etc/slurm.conf.slurm-snap)"
    if not scripts:
        return Finding(False, f"{key} runs {name}", fix)
    ours = our_script(key, scripts)
    if ours is not None:
        via = "" if ours.path == ours.configured else f" ({ours.path}, from {key}={ours.configured})"
        return Finding(True, f"{key} runs {name}{via}")
    wrapper = next((s for s in scripts if _names(key, s.text)), None)
    if wrapper is not None:
        return Finding(True, f"{key} runs {name} through {wrapper.path}, which names it")
    if key not in NODE_HOOKS and all(not s.path for s in scripts):
        # The slurmctld hooks run here, on the controller: nothing here is nothing.
        return Finding(False, f"{key}={', '.join(s.configured for s in scripts)} matches no file on this host",
                       f"install {name} here (etc/README.md), or {fix}")
    seen = "; ".join(f"{s.configured} matches no file on this host" if not s.path else
                     f"{s.path} cannot be read here" if s.text is None else f"{s.path} does not name {name}"
                     for s in scripts)
    names = " or ".join(f'"hook": "{h}"' for h, k in hooknames.SLURM_KEY.items() if k == key)
    where = "the node" if key in NODE_HOOKS else "the controller"
    return Finding(True, f"{key}: cannot verify from here that it runs {name} ({seen})",
                   f"submit a job with a slurm-snap option (sbatch -N1 --snapshot-volumes=CLASS --wrap true) and "
                   f"look for its job id with {names} in {cfg.paths.log_dir}/hooks.log on {where}; "
                   f"or call {name} from the site's {key} by that name", verified=False)


# Slurm's default AuthInfo=cred_expire: how long a requeued batch job waits
# before it may start again (and requeue_delay's default from 25.11 on).
DEFAULT_CRED_EXPIRE = 120
_CRED_EXPIRE = re.compile(r"cred_expire=(\d+)")
_REQUEUE_DELAY = re.compile(r"requeue_delay=(\d+)")


def requeue_wait(slurm: dict[str, str]) -> int:
    """Seconds a requeued (not expedited) job waits before it is eligible:
    SchedulerParameters requeue_delay (25.11), else cred_expire."""
    m = _REQUEUE_DELAY.search(slurm.get("SchedulerParameters", ""))
    if m and running_version(slurm) >= SlurmVersion(25, 11):
        return int(m.group(1))
    m = _CRED_EXPIRE.search(slurm.get("AuthInfo", ""))
    return int(m.group(1)) if m else DEFAULT_CRED_EXPIRE


def check_requeue(slurm: dict[str, str], cli_filter_expedites: bool | None) -> list[Finding]:
    """What a preemption costs its job before its requeued run may start.
    25.11+: expedited requeue (eligible at once) when slurm.conf allows it and
    cli_filter.lua asks for it; older: cred_expire, reported as the cost."""
    version = running_version(slurm)
    wait = requeue_wait(slurm)
    if version.expedited_requeue is None:
        return [Finding(True, f"a requeued job waits {wait} s (cred_expire) before it may start again: every "
                              f"preemption costs its job {wait} s plus its queue wait (Slurm {version} has no "
                              "expedited requeue; 25.11 has)")]
    key, value = version.expedited_requeue
    enabled = value in _items(slurm.get(key, ""))
    out = [Finding(enabled, f"requeued jobs may restart at once ({key}={value}, Slurm {version}; otherwise "
                            f"{wait} s after each preemption)",
                   f"add {value} to {key} in slurm.conf and `slurm-snap config cli-filter --expedite`")]
    if enabled and cli_filter_expedites is not None:
        out.append(Finding(cli_filter_expedites, "cli_filter.lua asks for --requeue=expedite",
                           "slurm-snap config cli-filter --expedite etc/cli_filter.lua > (the installed cli_filter.lua)"))
    return out


def check_slurm_api(choice, version: SlurmVersion) -> Finding:
    """Which side talks to Slurm (slurm/api.py), and that a pyslurm in use
    matches the controller too. A refused pyslurm is a warning, not a
    problem: slurm-snap asks through Slurm's commands, which work."""
    if choice.refused:
        return Finding(True, f"Slurm API: Slurm's commands ({choice.why})", choice.refused, warning=True)
    if choice.name == "pyslurm" and not choice.why.endswith(f"Slurm {version.series}"):
        return Finding(False, f"Slurm API: {choice.why}, but slurmctld runs {version}",
                       f"install pyslurm=={version.series}.* built against Slurm {version.series}'s headers")
    return Finding(True, f"Slurm API: {choice.name} ({choice.why})")


def running_version(slurm: dict[str, str]) -> SlurmVersion:
    """The version slurmctld reports (SLURM_VERSION in `scontrol show
    config`); without one, the oldest supported."""
    try:
        return SlurmVersion.parse(slurm["SLURM_VERSION"])
    except (KeyError, ConfigError):
        return OLDEST


def _items(value: str) -> list[str]:
    # "preempt_send_user_signal" must not satisfy a check for "send_user_signal".
    return [v.strip() for v in value.split(",")]


# GraceTime must hold the slowest checkpoint seen with room for the model to
# grow: less than half again is a problem (the next, slightly slower
# checkpoint ends crash-consistent); the suggestion adds a fixed margin for the
# signal's own delivery.
GRACE_HEADROOM, GRACE_MARGIN = 1.5, 10


def suggest_grace(slowest: float) -> int:
    return int(slowest * GRACE_HEADROOM + 0.999) + GRACE_MARGIN


def check_grace_observed(cfg: Config, partitions: list[dict[str, str]],
                         observed: dict[str, list[tuple[float, str]]], days: int) -> list[Finding]:
    """Each preempting partition's GraceTime against the checkpoint times its
    preemptions took (first signal -> last acknowledgement, from the
    inventory): a problem when it is under the slowest x 1.5, with the
    suggestion slowest x 1.5 + 10 s either way. Too short a GraceTime turns
    the slow checkpoints into crash-consistent sets; with
    protocol.early_release a longer one costs nothing for jobs that finish
    their checkpoint, since they give their nodes back at once."""
    out: list[Finding] = []
    for p in partitions:
        if p.get("PreemptMode", "").upper() not in ("REQUEUE", "CANCEL"):
            continue
        name = p.get("PartitionName", "?")
        grace = slurm_seconds(p.get("GraceTime", "0")) or 0
        times = observed.get(name, [])
        if not times:
            out.append(Finding(True, f"partition {name}: no preemption with acknowledgements in the last "
                                     f"{days} days; GraceTime {grace} s not yet checked against checkpoints"))
            continue
        slowest = max(t for t, _ in times)
        short = sum(1 for _, label in times if label != S.APP)
        want = suggest_grace(slowest)
        seen = (f"slowest checkpoint of {len(times)} preemption(s) in {days} days: {slowest:.1f} s"
                + (f", {short} not app-consistent" if short else ""))
        fix = f"raise GraceTime of {name} to {want} s (slowest {slowest:.1f} s x {GRACE_HEADROOM:g} + {GRACE_MARGIN} s)"
        if cfg.protocol.early_release:
            fix += "; with protocol.early_release the nodes still come back as soon as every rank has acknowledged"
        out.append(Finding(grace >= slowest * GRACE_HEADROOM,
                           f"partition {name}: GraceTime {grace} s holds the observed checkpoints "
                           f"({seen}; suggested at least {want} s)", fix))
    return out


def check_cli_filter(cfg: Config, path: str, text: str | None) -> list[Finding]:
    """cli_filter.lua asks Slurm for the signal and time the configuration names."""
    fix = f"slurm-snap config cli-filter etc/cli_filter.lua > {path}"
    if text is None:
        return [Finding(False, f"cli_filter.lua readable at {path}", fix)]
    sig, secs = clifilter.wanted(cfg)
    got = clifilter.settings(text)
    return [Finding(got == (sig, secs), f"cli_filter.lua asks for --signal={sig}@{secs} "
                                        f"(has {got[0] or '?'}@{got[1] if got[1] is not None else '?'})", fix)]


def check_entry_point(cfg: Config, path: str, text: str | None, defaults: str | None = None) -> list[Finding]:
    """The PrologSlurmctld entry point records in the background only if the
    configuration allows it (policy `closed` must record before the launch).
    `defaults` is the text of the file the entry point reads its site
    overrides from (its DEFAULTS=, /etc/default/slurm-snap for the package)."""
    if text is None:
        return [Finding(False, f"PrologSlurmctld entry point {path} readable", f"install {path} (etc/README.md)")]
    m = re.search(r"^RECORD=(\S+)", text, re.M)
    mode = m.group(1) if m else "foreground"
    where = path
    o = re.search(r"^RECORD=(\S+)", defaults or "", re.M)
    if o:
        mode = o.group(1)
        d = re.search(r"^DEFAULTS=(\S+)", text, re.M)
        where = d.group(1) if d else where
    want = "background" if cfg.hooks.records_in_background else "foreground"
    return [Finding(mode == want, f"PrologSlurmctld entry point records in the {want} (RECORD={mode})",
                    f"set RECORD={want} in {where} (failure_policy {cfg.hooks.failure_policy!r}, "
                    f"record_in_background {str(cfg.hooks.record_in_background).lower()})")]


def slurm_unreachable(exc: Exception) -> Finding:
    """What doctor says instead of the Slurm checks when scontrol cannot ask
    slurmctld: the other checks still run and print."""
    return Finding(False, f"Slurm unreachable: {exc}",
                   "start slurmctld (and munged) on the controller, or point SLURM_CONF / [slurm] conf at its "
                   "slurm.conf; `slurm-snap doctor --no-slurm` checks slurm-snap's side alone")
