"""slurm/api.py on the dev cluster, on every version CI runs: the probe reads
the running Slurm's series from its headers and stays on the commands unless
a pyslurm of that series is installed (one of another series is never
imported), and the commands answer a running job's record, the running jobs
and the node states. Where pyslurm matches (the site's 25.11),
tests/site/test_pyslurm_cluster.py compares the two sides."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

ON_CTL = r"""
import json, sys
from slurm_snap.slurm import api
job = int(sys.argv[1])
choice = api.probe()
cm = api.Commands()
print(json.dumps({"choice": [choice.name, choice.why, choice.refused], "series": api.installed_series(),
                  "pyslurm": api.pyslurm_version(), "imported": "pyslurm" in sys.modules,
                  "commands": [cm.job(job).__dict__, sorted(cm.running_jobs().items()),
                               sorted(cm.node_states().items())]}))
"""


def test_the_probe_reads_the_series_and_the_commands_answer(cluster):
    jid = cluster.sbatch("-p", "low", "-N2", "-o", "/dev/null", "--wrap", "sleep 120")
    try:
        cluster.wait_state(jid, "RUNNING", timeout=60)
        proc = cluster.run([cluster.python, "-c", ON_CTL, str(jid)], host="ctl", timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout)
    finally:
        cluster.cancel(jid)
    series = cluster.slurm_version
    assert got["series"] == series
    job, running, nodes = got["commands"]
    assert (job["job_id"], job["state"], job["restart_count"]) == (jid, "RUNNING", 0)
    assert [jid, 0] in running and {n for n, _ in nodes} >= {"n1", "n2", "n3"}
    assert not got["imported"]  # the probe never imports pyslurm
    pys = got["pyslurm"]
    if pys is None or not pys.startswith(series + "."):
        assert got["choice"][0] == "commands"
        if pys is not None:  # another series: refused by name with what to install
            assert f"pyslurm=={series}.*" in got["choice"][2]
    else:
        assert got["choice"][0] == "pyslurm"
