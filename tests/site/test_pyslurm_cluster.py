"""pyslurm on the dev cluster, where the venv's pyslurm was built for the
running Slurm (25.11 with pyslurm 25.11.x): the probe chooses it, and it
answers a running job's record, the running jobs and the node states as the
commands do (slurm/api.py). tests/integration/test_slurm_api_cluster.py holds
the commands' side on every version CI runs."""
from __future__ import annotations

import json

import pytest

from realcomponents import require

pytestmark = pytest.mark.integration

# On ctl, as the hooks and the schedule runner run there: both sides' answers.
BOTH = r"""
import json, sys
from slurm_snap.slurm import api
job = int(sys.argv[1])
choice = api.probe()
out = {"choice": [choice.name, choice.why, choice.refused], "series": api.installed_series(),
       "pyslurm": api.pyslurm_version()}
if choice.name == "pyslurm":
    cm, py = api.Commands(), api.Pyslurm()
    out["commands"] = [cm.job(job).__dict__, sorted(cm.running_jobs().items()), sorted(cm.node_states().items())]
    out["pyslurm_side"] = [py.job(job).__dict__, sorted(py.running_jobs().items()), sorted(py.node_states().items())]
print(json.dumps(out))
"""


def test_pyslurm_is_chosen_and_answers_as_the_commands_do(cluster):
    jid = cluster.sbatch("-p", "low", "-N2", "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        cluster.wait_state(jid, "RUNNING", timeout=60)
        proc = cluster.run([cluster.python, "-c", BOTH, str(jid)], host="ctl", timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout)
    finally:
        cluster.cancel(jid)
    series = cluster.slurm_version
    require(got["pyslurm"] is not None and got["pyslurm"].startswith(series + "."),
            f"the site suite needs pyslurm=={series}.* in the venv, built against this Slurm's headers "
            f"(README, 'pyslurm'); found {got['pyslurm']}")
    assert got["series"] == series
    assert got["choice"][0] == "pyslurm", got["choice"]
    job, running, nodes = got["commands"]
    assert (job["job_id"], job["state"]) == (jid, "RUNNING")
    assert got["pyslurm_side"] == [job, running, nodes]
