"""What `slurm-snap repair` reports for one set: the one record both of its
passes return (repair.py's abandoned sets, nodeloss.py's lost nodes), so its
CLI prints and serialises them alike. Its own file, so that neither pass
imports the other for it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RepairAction:
    set_id: int
    job_id: int
    old_state: str
    new_state: str
    why: str
    reason: str = ""
    orphans: list[str] = field(default_factory=list)
    # A preemption set's parts found on their nodes but not recorded: cut
    # while the inventory was away, delivered later from the node's spool.
    undelivered: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dry_run: bool = False
    # False when another process (the set's owner, another repair) ended the
    # set between this repair's look and its label: new_state and reason are
    # then what that process left, and this repair changed nothing.
    acted: bool = True

    def as_dict(self) -> dict:
        return asdict(self)
