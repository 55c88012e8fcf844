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
