"""Who may import whom outside the product (issue 29): the benchmarks import
nothing from tests/ (what both need is in testkit/), testkit imports nothing
from tests/ either, slurm_snap never imports testkit, and a command on a
dev-cluster host is run one way (scripts/dev-cluster exec, built on
lib-hosts.sh's on_host): nsenter is written nowhere else.

    scripts/test tests/unit/test_dev_tree_boundaries.py -q
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported(path: Path) -> set[str]:
    """The top-level names of every module `path` imports (lazy imports too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def modules_of_tests(root: Path = REPO) -> set[str]:
    """What tests/ holds, by the names a sys.path entry would import it by."""
    tests = root / "tests"
    return {"tests"} | {p.stem for p in tests.rglob("*.py")} - {"__init__"}


def offenders(root: Path, folders=("benchmarks", "testkit")) -> dict[str, set[str]]:
    from_tests = modules_of_tests(root)
    out = {}
    for folder in folders:
        for path in sorted((root / folder).glob("*.py")):
            text = path.read_text(encoding="utf-8")
            bad = imported(path) & from_tests
            # A tests/ directory put on sys.path is an import from tests too.
            if re.search(r"""["']tests["']""", text):
                bad.add("tests/ on sys.path")
            if bad:
                out[str(path.relative_to(root))] = bad
    return out


def test_benchmarks_and_testkit_import_nothing_from_tests():
    assert (REPO / "testkit" / "cluster.py").is_file()   # read the real tree
    assert offenders(REPO) == {}


def test_the_product_never_imports_testkit():
    bad = [str(p.relative_to(REPO)) for p in sorted((REPO / "slurm_snap").rglob("*.py")) if "testkit" in imported(p)]
    assert bad == []


def test_the_checker_sees_an_import_from_tests_and_a_path_to_it(tmp_path):
    (tmp_path / "tests" / "integration").mkdir(parents=True)
    (tmp_path / "tests" / "integration" / "cluster.py").write_text("")
    (tmp_path / "tests" / "doubles.py").write_text("")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "testkit").mkdir()
    (tmp_path / "benchmarks" / "a.py").write_text("def f():\n    from tests.integration.cluster import Cluster\n")
    (tmp_path / "benchmarks" / "b.py").write_text("import sys, os\nsys.path.append(os.path.join('x', 'tests'))\n"
                                                   "from doubles import SimRanks\n")
    (tmp_path / "benchmarks" / "c.py").write_text("from testkit.doubles import SimRanks\n")
    assert offenders(tmp_path) == {"benchmarks/a.py": {"tests"},
                                   "benchmarks/b.py": {"doubles", "tests/ on sys.path"}}


def test_a_command_on_a_dev_cluster_host_is_run_one_way():
    """nsenter is lib-hosts.sh's alone: everything else (dev-cluster's own
    steps, the demo, testkit/cluster.py and so the tests and benchmarks) goes
    through on_host / `dev-cluster exec`, whose paths come from one layout."""
    where = []
    for path in sorted([*(REPO / "scripts").iterdir(), *(REPO / "testkit").glob("*.py"),
                        *(REPO / "benchmarks").iterdir(), *(REPO / "tests").rglob("*.py")]):
        if path.is_file() and path.name not in ("lib-hosts.sh", Path(__file__).name) and \
                "nsenter" in path.read_text(errors="replace"):
            where.append(str(path.relative_to(REPO)))
    assert where == []
    hosts = (REPO / "scripts" / "lib-hosts.sh").read_text()
    assert hosts.count("/usr/bin/nsenter ") == 3   # on_host, spawn_on, in_mounts
    assert "layout_lines()" in hosts and "/run/netns/" in hosts
    # The Python side restates no namespace path and no disk or tree layout.
    driver = (REPO / "testkit" / "cluster.py").read_text()
    assert "/run/netns" not in driver and '"disks"' not in driver and '"hosts"' not in driver
