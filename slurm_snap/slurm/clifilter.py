"""cli_filter.lua's two settings, written from the configuration.

The checkpoint signal and the time asked of Slurm for it have one source,
slurm-snap.toml [protocol] (checkpoint_signal, grace): the install step
writes them into cli_filter.lua with `slurm-snap config cli-filter`, and
doctor reads them back. Nothing else carries them (the SPANK plugin's
plugstack.conf line no longer does).
"""
from __future__ import annotations

import re

from ..errors import BadValueError

# Slurm's own default --signal time. With protocol.grace 0 the partition's
# GraceTime governs preemption (the signal is sent at once then, whatever the
# time); the time only makes Slurm also warn that long before the time limit.
DEFAULT_SIGNAL_TIME = 60

_SIGNAL = re.compile(r'^local SNAP_SIGNAL = "([A-Z0-9+]*)"[ \t]*$', re.M)
_TIME = re.compile(r"^local SNAP_SIGNAL_TIME = (\d+)[ \t]*$", re.M)
# 25.11+: --requeue=expedite for opted-in batch jobs, so the requeued run may
# start the moment the preempted one ends instead of cred_expire later.
# Written only on request: Slurm refuses such a job unless slurm.conf has
# SlurmctldParameters=enable_expedited_requeue, and 24.11 cannot parse it.
_EXPEDITE = re.compile(r"^local SNAP_EXPEDITE = (true|false)[ \t]*$", re.M)


def wanted(cfg) -> tuple[str, int]:
    """(signal name as --signal takes it, seconds): e.g. ("USR1", 60)."""
    return cfg.protocol.checkpoint_signal.removeprefix("SIG"), cfg.protocol.grace or DEFAULT_SIGNAL_TIME


def settings(text: str) -> tuple[str | None, int | None]:
    """What a cli_filter.lua asks for; None where the line is missing."""
    sig, secs = _SIGNAL.search(text), _TIME.search(text)
    return (sig.group(1) if sig else None), (int(secs.group(1)) if secs else None)


def expedites(text: str) -> bool:
    m = _EXPEDITE.search(text)
    return bool(m and m.group(1) == "true")


def render(template: str, cfg, *, expedite: bool = False) -> str:
    """The template with both settings taken from `cfg`."""
    if None in settings(template):
        raise BadValueError(what="cli_filter.lua template", value=template[:60],
                            why="needs the lines `local SNAP_SIGNAL = \"...\"` and `local SNAP_SIGNAL_TIME = N`")
    sig, secs = wanted(cfg)
    text = _SIGNAL.sub(f'local SNAP_SIGNAL = "{sig}"', template, count=1)
    text = _TIME.sub(f"local SNAP_SIGNAL_TIME = {secs}", text, count=1)
    if _EXPEDITE.search(text) is None:
        if expedite:
            raise BadValueError(what="cli_filter.lua template", value=template[:60],
                                why="has no `local SNAP_EXPEDITE = false` line for --expedite")
        return text
    return _EXPEDITE.sub(f"local SNAP_EXPEDITE = {'true' if expedite else 'false'}", text, count=1)
