"""Bad --snapshot-* values through real sbatch (the SPANK plugin's C checks,
then the helper as the submitting user): each fails the submission with a
message naming the value, no job is created, and nothing is run, created or
read because of the value. Legal-but-odd characters are data, not commands.

Not repeated from tests/integration/test_spank.py: relative path, unknown
class, /etc, `..`, empty list/item, \\x01, bad consistency, symlink escape,
another user's directory.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from testkit.cluster import Cluster, user_ids

pytestmark = pytest.mark.integration


def submit(cluster: Cluster, *args: str):
    """sbatch --hold ARGS as the test user; cancels (and fails on) a job that was created."""
    proc = cluster.sbatch_raw(["--parsable", "--hold", "-o", "/dev/null", *args, "--wrap", "true"],
                              user=cluster.user)
    if proc.returncode == 0:
        cluster.cancel(int(proc.stdout.strip().split(";")[0]))
    return proc


def rejected(proc, *needles: str) -> None:
    assert proc.returncode != 0, f"sbatch accepted it: {proc.stdout}"
    assert proc.stdout.strip() == "", "a job id was printed"
    assert "slurm-snap:" in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not named in: {proc.stderr[:2000]}"


@pytest.fixture
def canary(cluster):
    """A file a shell would create if it ever interpreted the value."""
    path = cluster.user_dir() / f"pwned-{time.monotonic_ns()}"
    yield path
    assert not path.exists(), f"{path} was created: a value reached a shell"


def mine(cluster, name: str) -> str:
    return f"{cluster.user_dir()}/{name}"


@pytest.mark.parametrize("name, needle", [
    ("line1\nline2", "control character (0x0a)"),
    ("tab\there", "control character (0x09)"),
    ("cr\rhere", "control character (0x0d)"),
    ("esc\x1b[31m", "control character (0x1b)"),
    ("del\x7f", "control character (0x7f)"),
])
def test_control_characters_in_a_path(cluster, canary, name, needle):
    value = mine(cluster, name)
    rejected(submit(cluster, f"--snapshot-volumes={value}"), needle, str(cluster.user_dir()))


@pytest.mark.parametrize("name", ["with space", "it's", 'dq"x', "$(touch {canary})", "`touch {canary}`",
                                  "a;touch {canary}", "a|b&c>d<e*?", "--help"])
def test_shell_metacharacters_in_a_missing_path_are_named_literally(cluster, canary, name):
    value = mine(cluster, name.format(canary=canary))
    rejected(submit(cluster, f"--snapshot-volumes={value}"), value, "does not exist")


@pytest.mark.parametrize("name", ["with space", "it's", "$(touch {canary})", "a;b|c&d"])
def test_shell_metacharacters_in_an_existing_own_path_are_accepted_as_data(cluster, canary, name):
    # A volume the pfs backend (btrfs) can cut alone, made by the user: a plain
    # directory is refused at submit for that reason, not for its name.
    d = cluster.user_dir() / name.format(canary=canary)
    d.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["/usr/bin/btrfs", "subvolume", "create", str(d)], check=True, capture_output=True)
    os.chown(d, *user_ids(cluster.user))
    proc = submit(cluster, f"--snapshot-volumes={d}")
    assert proc.returncode == 0, proc.stderr
    assert not os.path.exists(canary)


def test_invalid_utf8_in_a_path(cluster, canary):
    value = mine(cluster, "bad-\udcff\udcfe")  # surrogateescape: the raw bytes \xff\xfe reach sbatch
    proc = submit(cluster, f"--snapshot-volumes={value}")
    rejected(proc, "not valid UTF-8")


@pytest.mark.parametrize("count", [257, 3000])
def test_thousands_of_volumes(cluster, count):
    rejected(submit(cluster, "--snapshot-volumes=" + ",".join(["pfs"] * count)), "more than 256 volumes")


def test_thousands_of_distinct_paths_within_the_limit_are_checked_one_by_one(cluster):
    """256 items pass the C check; the helper then names the first bad one."""
    items = [mine(cluster, f"nonexistent-{i}") for i in range(256)]
    rejected(submit(cluster, "--snapshot-volumes=" + ",".join(items)), items[0], "does not exist")


@pytest.mark.parametrize("option, needle", [
    ("--snapshot-volumes=/" + "v" * 100_000, "item longer than 4096 bytes in '/vvvv"),
    ("--snapshot-volumes=pfs,/" + "w" * 5000, "item longer than 4096 bytes in '/wwww"),
    ("--snapshot-resume-cmd=python train.py " + "x" * 100_000, "--snapshot-resume-cmd: value longer than 4096"),
    ("--snapshot-consistency=" + "app" * 30_000, "is not 'app' or 'crash'"),
])
def test_huge_option_values(cluster, option, needle):
    proc = submit(cluster, option)
    rejected(proc, needle)
    assert len(proc.stderr) < 8000  # the value is quoted in part, not echoed whole


def test_a_path_whose_parent_is_another_users_link(cluster, canary):
    """The test user points at a directory through the other user's symlink in a shared area."""
    other_dir = cluster.make_user_dir(f"share-{time.monotonic_ns()}", user=cluster.other_user)
    link = other_dir / "to-etc"
    os.symlink("/etc", link)
    os.lchown(link, *user_ids(cluster.other_user))
    value = f"{link}/ssh"
    rejected(submit(cluster, f"--snapshot-volumes={value}"), value)
