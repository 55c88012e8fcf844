"""`slurm-snap hook validate-options`: what the SPANK plugin asks inside
sbatch, as the submitting user, before the job exists (validate early, act
late). Bad input fails the submission here with a message naming the
option; what is printed goes into the job's environment.

entry.py runs it straight from the plugin's fixed argv, without click: it is
on every `sbatch --snapshot-*`'s path (issue 36: at most +30 ms over sbatch).
"""
from __future__ import annotations

from .. import errors
from .. import states as S
from ..config import MIN_EVERY_SECONDS, Config

# The options the plugin passes (spank/helper.c), each with a value, and their defaults.
OPTIONS = {"--volumes": None, "--consistency": S.WANT_APP, "--resume-cmd": "", "--every": None,
           "--before-timelimit": None}

# Slurm's --signal time is 16 bits (sig_time in job_desc_msg_t).
MAX_TIMELIMIT_MARGIN = 65535
MIN_TIMELIMIT_MARGIN = 10


def validate_options(cfg: Config, *, volumes: str | None, consistency: str, resume_cmd: str,
                     every: str | None, before_timelimit: str | None = None) -> list[str]:
    """The result lines (KEY=VALUE) for the job's environment, or the
    SnapError naming what is wrong."""
    from .volumes import validate_submit

    if volumes is not None and volumes.strip() == "":
        raise errors.BadValueError(what="--snapshot-volumes", value=volumes, why="empty list")
    items = volumes.split(",") if volumes else []
    if len(resume_cmd) > 4096 or any(ord(c) < 0x20 for c in resume_cmd):
        raise errors.BadValueError(what="--snapshot-resume-cmd", value=resume_cmd[:80],
                                   why="longer than 4096 characters or contains control characters")
    if every is not None:
        from ..slurm.duration import seconds as duration_seconds

        seconds = duration_seconds(every, what="--snapshot-every")
        if seconds < MIN_EVERY_SECONDS:
            raise errors.BadValueError(what="--snapshot-every", value=every,
                                       why=f"under {MIN_EVERY_SECONDS} s: too frequent to be worth a snapshot")
    margin = None
    if before_timelimit is not None:
        margin = _timelimit_margin(before_timelimit)
    declared = validate_submit(cfg, items, consistency)
    # One KEY=VALUE per line: the plugin copies these into the job's
    # environment so ranks find the barrier area and the signal.
    lines = [f"SLURM_SNAP_BARRIER_DIR={cfg.paths.barrier_dir}",
             f"SLURM_SNAP_SIGNAL={cfg.protocol.checkpoint_signal}",
             f"SLURM_SNAP_EARLY_RELEASE={int(cfg.protocol.early_release)}",
             f"SLURM_SNAP_CLASSES={','.join(sorted({d.vc.name for d in declared}))}"]
    if margin is not None:
        # Rank 0 tells the time limit's signal from a preemption's by it (client/early.py).
        lines.append(f"SLURM_SNAP_TIMELIMIT_MARGIN={margin}")
    if cfg.slurm.bin_dir:
        # Rank 0's early release runs scontrol: the site's, not another version's in /usr/bin.
        lines.append(f"SLURM_SNAP_SLURM_BIN={cfg.slurm.bin_dir}")
    return lines


def _timelimit_margin(value: str) -> int:
    """--snapshot-before-timelimit's MARGIN in seconds: a duration in the one
    grammar, within what Slurm's --signal can carry."""
    from ..slurm.duration import seconds as duration_seconds

    seconds = int(duration_seconds(value, what="--snapshot-before-timelimit"))
    if not MIN_TIMELIMIT_MARGIN <= seconds <= MAX_TIMELIMIT_MARGIN:
        raise errors.BadValueError(what="--snapshot-before-timelimit", value=value,
                                   why=f"must be {MIN_TIMELIMIT_MARGIN} s to {MAX_TIMELIMIT_MARGIN} s "
                                       "(Slurm's --signal time)")
    return seconds


def parse_argv(args: list[str]) -> dict[str, str | None] | None:
    """The options of `hook validate-options ARGS` as keyword arguments of
    validate_options, or None for anything but the plugin's own form (each
    known option once, with a value): click then parses and reports it."""
    if len(args) % 2:
        return None
    given: dict[str, str] = {}
    for key, value in zip(args[::2], args[1::2]):
        if key not in OPTIONS or key in given:
            return None
        given[key] = value
    return {key[2:].replace("-", "_"): given.get(key, default) for key, default in OPTIONS.items()}
