"""Run by test_protocol_repair in a subprocess: a coordinator that pauses at
PHASE (writing MARKER with its pid) so the test can SIGKILL it there.

usage: python protocol_killee.py TMPDIR PHASE MARKER
"""
from __future__ import annotations

import os
import pathlib
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The repository, for the test doubles (testkit/doubles.py), and tests/ (dbtemplates.py),
# as conftest.py puts them for pytest.
sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from protocol_fixtures import ROOT, make_env  # noqa: E402
from slurm_snap.protocol.coordinator import Coordinator  # noqa: E402


def main() -> None:
    tmp, phase, marker = sys.argv[1:4]
    env = make_env(pathlib.Path(tmp), record=False)

    def hook(p: str) -> None:
        if p == phase:
            with open(marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(marker + ".tmp", marker)
            time.sleep(600)  # until SIGKILL

    def ranks() -> None:
        epoch = env.request_epoch()
        for i, node in enumerate(env.nodes):
            env.ack(node, i, epoch, manifest=[env.write_checkpoint(node, i)])

    def signal(job_id: int) -> None:
        threading.Thread(target=ranks, daemon=True).start()

    Coordinator(env.cfg, env.inv, signaller=signal, caller=ROOT, hook=hook).snapshot(env.job_id, deadline=10)


if __name__ == "__main__":
    main()
