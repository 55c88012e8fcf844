"""What every command gets: lazily loaded configuration and inventory."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import click

from .. import config as config_mod
from ..slurm.jobenv import MAX_ID


@dataclass
class Ctx:
    config_path: str | None = None
    verbose: int = 0
    # Injected by tests only (never from the environment, which anyone sets):
    # who asks, what time it is, which zone times print in.
    caller: object = None
    now: object = None
    tz: object = None
    _config: object = field(default=None, repr=False)
    _inventory: object = field(default=None, repr=False)

    def __post_init__(self):
        level = logging.WARNING - 10 * min(self.verbose, 2)
        logging.basicConfig(level=level, format="slurm-snap: %(levelname)s: %(message)s")

    @property
    def config(self) -> config_mod.Config:
        if self._config is None:
            self._config = config_mod.load(self.config_path)
            from ..slurm.commands import adopt_bin_dir, adopt_conf

            adopt_conf(self._config.slurm.conf)
            adopt_bin_dir(self._config.slurm.bin_dir)
        return self._config

    @property
    def inventory(self):
        if self._inventory is None:
            from ..inventory.repository import Inventory

            running = click.get_current_context(silent=True)
            command = " ".join(running.command_path.split()[1:]) if running else ""
            self._inventory = Inventory.from_config(self.config, command=command)
        return self._inventory



class JobIdType(click.ParamType):
    """A Slurm job id on the command line: ASCII digits, 1..MAX_ID.

    click.IntRange would accept "+5", "1_000" and other scripts' digits ("١٢"
    reads as 12) and, without a bound, numbers that overflow the inventory.
    """

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        text = str(value)
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_ID:
            self.fail(f"{text!r} is not a job id (1-{MAX_ID})", param, ctx)
        return int(text)


class DurationType(click.ParamType):
    """A DURATION on the command line, in the one grammar (slurm/duration.py),
    as float seconds. `bare_seconds`: the option's value used to be a number
    of seconds, which it still takes. A refusal lists the accepted forms."""

    name = "duration"

    def __init__(self, *, bare_seconds: bool = False, positive: bool = False):
        self.bare_seconds, self.positive = bare_seconds, positive

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        from ..errors import BadValueError
        from ..slurm.duration import parse_duration

        try:
            seconds = parse_duration(str(value), bare_seconds=self.bare_seconds).total_seconds()
        except BadValueError as exc:
            self.fail(f"{value!r}: {exc.kwargs.get('why', exc)}", param, ctx)
        if self.positive and seconds <= 0:
            self.fail(f"{value!r}: must be more than 0 seconds", param, ctx)
        return seconds
