"""Everything slurm-snap does differently by Slurm version, decided here only.

Sites run 22.05 to 25.x and the settings and output this project depends on
moved between them. Other modules ask a `SlurmVersion` what applies instead of
comparing version numbers themselves; scripts/lib-slurm-version.sh makes the
same slurm.conf decision on the shell side (tests/unit/test_slurm_version.py
holds the two together). Measured on 22.05.8 (Debian 12) and 24.11.5 (Debian
13's source) on the dev cluster; docs/design.md lists the differences.
"""
from __future__ import annotations

import functools
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
        """From `squeue --version` ("slurm 24.11.5"), SLURM_VERSION of
        `scontrol show config` ("22.05.8") or a package version ("24.11.5-4+deb13u1")."""
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
        key as a parse error, 24.11 still accepts the old spelling but
        doctor asks for the one the version documents."""
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
    def has_prolog_run_in_job(self) -> bool:
        """PrologFlags=RunInJob (24.05+) runs the Prolog inside the job's
        extern step; slurm-snap neither needs nor forbids it."""
        return self >= SlurmVersion(24, 5)

    # --- command output ------------------------------------------------------
    @property
    def squeue_json_filters(self) -> bool:
        """22.05 ignores -j/-u/-t with --json (prints every job); 24.11 honours
        -j (measured), so a hook's question costs one job's JSON, not all."""
        return self >= SlurmVersion(23, 2)


OLDEST = SlurmVersion(22, 5, 0)


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


def from_json_meta(doc: dict) -> SlurmVersion | None:
    """The version the JSON's own header states (meta.Slurm in 22.05,
    meta.slurm from 23.02): free with every --json answer."""
    meta = doc.get("meta") or {}
    slurm = meta.get("slurm") or meta.get("Slurm") or {}
    release = slurm.get("release")
    if release:
        return SlurmVersion.parse(str(release))
    v = slurm.get("version") or {}
    try:
        return SlurmVersion(int(v["major"]), int(v["minor"]), int(v.get("micro", 0)))
    except (KeyError, TypeError, ValueError):
        return None


_SQUEUE_VERSION = re.compile(r"^slurm[- ](\d+\.\d+(?:\.\d+)?)", re.M)


@functools.lru_cache(maxsize=4)
def running(squeue: str, timeout: float = 10.0) -> SlurmVersion | None:
    """The version of the Slurm commands this host runs (`squeue --version`
    reads no config and asks no daemon: a few ms, once per process). None when
    it does not answer like Slurm: callers then take the 22.05 path, which
    works on every version (filters on the client side)."""
    from .commands import run

    try:
        m = _SQUEUE_VERSION.search(run([squeue, "--version"], timeout=timeout))
    except Exception:  # noqa: BLE001 - a version we cannot read is "the oldest"
        return None
    return SlurmVersion.parse(m.group(1)) if m else None
