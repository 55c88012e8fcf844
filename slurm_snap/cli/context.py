"""What every command gets: lazily loaded configuration and inventory."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .. import config as config_mod


@dataclass
class Ctx:
    config_path: str | None = None
    verbose: int = 0
    _config: object = field(default=None, repr=False)
    _inventory: object = field(default=None, repr=False)

    def __post_init__(self):
        level = logging.WARNING - 10 * min(self.verbose, 2)
        logging.basicConfig(level=level, format="slurm-snap: %(levelname)s: %(message)s")

    @property
    def config(self) -> config_mod.Config:
        if self._config is None:
            self._config = config_mod.load(self.config_path)
        return self._config

    @property
    def inventory(self):
        if self._inventory is None:
            from ..inventory.repository import Inventory

            self._inventory = Inventory.from_config(self.config)
        return self._inventory
