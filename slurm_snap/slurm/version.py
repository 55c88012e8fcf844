"""Everything slurm-snap does differently by Slurm version, decided here only.

Sites run 22.05 to 26.05 and the settings and output this project depends on
moved between them. Other modules ask a `SlurmVersion` what applies instead of
comparing version numbers themselves; scripts/lib-slurm-version.sh makes the
same slurm.conf decision on the shell side and runs the same list of versions
(tests/unit/test_slurm_version.py holds the two together). Measured on 22.05.8
(Debian 12), 24.11.5 (Debian 13's packages), 25.11.7 (a site's install) and 26.05
(26.05.3 by hand, 26.05.5 Debian unstable's packages) on the dev cluster; docs/design.md lists the
differences.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> "SlurmVersion":
        """From SLURM_VERSION of `scontrol show config` ("22.05.8") or a
        package version ("24.11.5-4+deb13u1")."""
        m = _VERSION.search(text or "")
        if not m:
            raise ConfigError(path="slurm", key="version", why=f"cannot read a Slurm version from {text!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    # --- slurm.conf ---------------------------------------------------------
    @property
    def preempt_signal_setting(self) -> tuple[str, str]:
        """(key, value) that makes preemption send the job's --signal instead
        of SIGTERM. 23.02 moved it to PreemptParameters; 22.05 rejects that
        key as a parse error."""
        if self >= SlurmVersion(23, 2):
            return ("PreemptParameters", "send_user_signal")
        return ("SlurmctldParameters", "preempt_send_user_signal")

    @property
    def hook_timeout_keys(self) -> tuple[str, ...]:
        """The slurm.conf keys bounding Prolog and Epilog: 25.05 split
        PrologEpilogTimeout into PrologTimeout and EpilogTimeout."""
        if self >= SlurmVersion(25, 5):
            return ("PrologTimeout", "EpilogTimeout")
        return ("PrologEpilogTimeout",)

    @property
    def conf_lines(self) -> tuple[str, ...]:
        """The version-dependent slurm.conf lines slurm-snap needs, as
        scripts/lib-slurm-version.sh's slurm_conf_version_lines writes them."""
        lines = ["=".join(self.preempt_signal_setting)]
        if self.expedited_requeue:
            lines.append("=".join(self.expedited_requeue))
        if self.own_metrics:
            lines.append("MetricsType=metrics/openmetrics")
        return tuple(lines)

    @property
    def expedited_requeue(self) -> tuple[str, str] | None:
        """(key, value) that lets jobs ask for `--requeue=expedite` (25.11):
        such a job is eligible again the moment it is requeued (a preemption
        or rank 0's `scontrol requeue`) instead of cred_expire (default 120 s)
        later. slurmctld reads it from SlurmctldParameters in 25.11 and 26.05
        (26.05's slurm.conf man page lists it under SchedulerParameters: the
        code and a run here say otherwise). None before 25.11: there a
        requeued job waits cred_expire, which doctor reports."""
        if self >= SlurmVersion(25, 11):
            return ("SlurmctldParameters", "enable_expedited_requeue")
        return None

    @property
    def job_sluid(self) -> bool:
        """25.11 gives every run of a job a SLUID (cluster-unique, unlike job
        ids after MaxJobId; a requeued run gets a new one) in the hooks'
        SLURM_JOB_SLUID (measured; 25.11's squeue --json has no sluid key)."""
        return self >= SlurmVersion(25, 11)

    @property
    def own_metrics(self) -> bool:
        """25.11's slurmctld serves OpenMetrics itself (MetricsType=
        metrics/openmetrics, on SlurmctldPort): jobs, nodes, partitions and
        the scheduler, which slurm-snap's exporter then does not repeat."""
        return self >= SlurmVersion(25, 11)

    @property
    def series(self) -> str:
        """"25.11": what a pyslurm release must start with to match."""
        return f"{self.major}.{self.minor:02d}"

    # PrologFlags=RunInJob (24.05+) runs the Prolog inside the job's extern
    # step. slurm-snap does not set it and it was not measured here, so
    # nothing decides on it yet.


# What doctor assumes when slurmctld does not say (SLURM_VERSION missing).
OLDEST = SlurmVersion(22, 5, 0)

# The versions the dev cluster, demo and CI run (SLURM_SNAP_SLURM): the shell's
# SLURM_SNAP_SLURM_VERSIONS names the same, in the same order.
TESTED = ("22.05", "24.11", "25.11", "26.05")


# The JSON helpers go by shape, not by version: squeue --json's first answer
# needs no version lookup (24.11's `squeue --version` already needs a
# slurm.conf to read, measured), and the shapes never overlap.
def json_number(value) -> int:
    """A number from Slurm's JSON: 22.05 prints plain integers; 23.02 and
    later {"set": bool, "infinite": bool, "number": N} (unset = 0)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return 0
        value = value.get("number", 0)
    return int(value or 0)


def json_states(value) -> list[str]:
    """job_state: a string in 22.05, a list of flags from 23.02 on."""
    return list(value) if isinstance(value, list) else [str(value)]


# 22.05's job_state string names the first of these flags that is set, else
# the base state; 24.11 lists the base state first, then the flags: a
# preempted job in its epilogs is "COMPLETING" there and ["PENDING",
# "COMPLETING"] here (measured).
_FLAG_NAMES = ("COMPLETING", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
               "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING", "STAGE_OUT")


def json_state(value) -> str:
    """One state name with 22.05's meaning, from either version's job_state."""
    states = json_states(value)
    for flag in _FLAG_NAMES:
        if flag in states:
            return flag
    return states[0] if states else ""


def config_values(show_config: dict[str, str], key: str) -> list[str]:
    """A key's values in `scontrol show config`: 22.05 prints `Prolog = P`;
    24.11 takes several scripts per hook and prints `Prolog[0] = P`,
    `Prolog[1] = ...` (measured). By shape, as the JSON helpers above."""
    if key in show_config:
        return [show_config[key]]
    values, i = [], 0
    while f"{key}[{i}]" in show_config:
        values.append(show_config[f"{key}[{i}]"])
        i += 1
    return values
