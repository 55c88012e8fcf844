import pytest

from slurm_snap import errors
from slurm_snap.slurm import hostlist


@pytest.mark.parametrize("expr,hosts", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[1-2,5],gpu[08-10]", ["n1", "n2", "n5", "gpu08", "gpu09", "gpu10"]),
    ("a,b", ["a", "b"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("", []),
])
def test_expand(expr, hosts):
    assert hostlist.expand(expr) == hosts


@pytest.mark.parametrize("bad", ["n[1-", "n[3-1]", "n[a-b]", "n[1-999999]"])
def test_bad(bad):
    with pytest.raises(errors.BadValueError) as ei:
        hostlist.expand(bad)
    assert bad in str(ei.value)


# Node lists as report prints them (NodeList, FailedNodes): what Slurm's own
# `scontrol show hostlist` prints for the same hosts in the same order.
COMPRESS_FORMS = [
    "n1", "n1,n2", "n1,n2,n3", "n1,n3", "n1,n2,n3,n5", "n3,n2,n1", "n1,n3,n2,n10,n09",
    "n1,n1,n2", "n1,n2,n1,n2", "gpu01,gpu02", "gpu01,gpu02,gpu10", "gpu08,gpu09,gpu10",
    "n9,n10,n11", "n09,n10", "n99,n100", "n099,n100", "n01,n2", "n1,n02", "n0,n1",
    "n00,n01", "n9,n010", "n007,n008,n009,n010", "n7,n08", "n08,n9", "n001,n002,n1,n2",
    "a", "a,b", "a,b,c1,c2", "a1,b1,a2", "n1,m1,n2", "x1y2,x1y3", "x1y2,x2y2",
    "rack1-n1,rack1-n2,rack2-n1", "rack1-n1,rack1-n2,rack2-n1,rack2-n2", "n-1", "n-1,n-2",
    "1,2,3", "123,124", "node1a,node1b", "n1,n2,gpu1,gpu2,n3,n4", "n10,n11,n12,n13,n14,n15",
    "n1,n2,n4,n5,n7", "n0001,n0002,n0003", "n1000,n1001", "n999,n1000", "n0999,n1000",
    "c1-1,c1-2,c1-3", "c01,c02,c03,d01", "n1,n2,n3,n4,n5,n6,n7,n8,n9,n10,n11,n12",
    "gpu-a100-01,gpu-a100-02", "login,n1,n2", "n2,n1,n3", "n5,n6,n1,n2", "n1,n2,n2,n3",
    "host10,host9", "z9,z10,z09", "n1,n01", "n01,n1", "n1,n2,n3,n001", "p0,p1,p2",
]


def _scontrol_hostlist(tmp_path, forms):
    """`scontrol show hostlist` for each form (it needs a slurm.conf to read,
    not a running controller)."""
    import shutil
    import subprocess

    from realcomponents import require

    exe = shutil.which("scontrol")
    require(exe is not None, "scontrol not installed (scripts/dev-cluster installs slurm-client)")
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    out = {}
    for form in forms:
        r = subprocess.run([exe, "show", "hostlist", form], capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin", "SLURM_CONF": str(conf)})
        assert r.returncode == 0, (form, r.stderr)
        out[form] = r.stdout.strip()
    return out


def test_compress_matches_scontrol_show_hostlist(tmp_path):
    assert len(COMPRESS_FORMS) >= 60
    want = _scontrol_hostlist(tmp_path, COMPRESS_FORMS)
    got = {form: hostlist.compress(form.split(",")) for form in COMPRESS_FORMS}
    assert {f: g for f, g in got.items() if g != want[f]} == {}, {f: want[f] for f in got if got[f] != want[f]}
    # and each compressed list expands back to the hosts, in order
    assert all(hostlist.expand(got[f]) == f.split(",") for f in COMPRESS_FORMS if "[" not in f)


def test_compress_of_nothing_is_empty():
    assert hostlist.compress([]) == ""
