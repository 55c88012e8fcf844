"""Run a launcher so that the checkpoint signal cannot kill it:

    srun python -m slurm_snap.client.launch torchrun --nproc-per-node=2 ... train.py

Slurm sends the checkpoint signal (SIGUSR1) to every process of the step.
torchrun's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT only, so
SIGUSR1's default action ends it, and with it the step (measured on Slurm
22.05: docs/client.md). This execs the command with the request signals
*blocked*: the agent holds them pending and lives; the mask passes through
exec and fork to the workers, whose slurm-snap client receives the signal
with sigwait() (client/signals.py), including one that arrived while the
worker was still starting. SIGTERM is left alone: the agent must still stop
its workers when the job ends.

The command is exec'd with its argv as given (a PATH lookup for its first
word, as a shell would do, but no shell).
"""
from __future__ import annotations

import os
import signal
import sys

from slurm_snap.client.signals import parse_signal

USAGE = "usage: python -m slurm_snap.client.launch COMMAND [ARG...]"


def request_signals(env=None) -> set[signal.Signals]:
    env = os.environ if env is None else env
    configured = env.get("SLURM_SNAP_SIGNAL")
    sigs = {parse_signal(configured)} if configured else {signal.SIGUSR1}
    return sigs - {signal.SIGTERM}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, request_signals())
    except Exception as exc:  # a bad SLURM_SNAP_SIGNAL: say which
        print(f"slurm-snap launch: {exc}", file=sys.stderr)
        return 2
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"slurm-snap launch: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
