"""No import cycle between the packages of slurm_snap (issue 19), nor
between two of its files (issue 29).

A unit is what sits directly under slurm_snap/: a subpackage (hooks,
protocol, inventory...) or a top-level module (config, states, doctor...).
Every import counts, also the ones inside functions that keep a hook's start
cheap: a lazy import is still a dependency, and a cycle through one is what
made protocol and hooks (and inventory and protocol) one tangle before.
Inside a package the same holds file by file: two modules that need each
other (protocol/nodeloss.py and protocol/repair.py did) share a third.

    scripts/test tests/unit/test_import_cycles.py -q
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_snap"


def import_graph(package: Path) -> dict[str, set[str]]:
    """unit -> the other units it imports, read from the source (nothing is imported)."""
    top = package.name
    units = {p.name.removesuffix(".py") for p in package.iterdir()
             if p.suffix == ".py" or (p / "__init__.py").exists()} - {"__init__"}
    edges: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        unit = rel.parts[0].removesuffix(".py")
        # The importing module's package, as dotted parts from the top.
        pkg = [top, *rel.parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg[:len(pkg) - node.level + 1]
                    if node.module:
                        targets = [".".join(base + [node.module])]
                    else:  # from .. import states
                        targets = [".".join(base + [a.name]) for a in node.names]
                else:
                    targets = [node.module or ""]
            else:
                continue
            for target in targets:
                parts = target.split(".")
                # `from slurm_snap import __version__` names the package itself, no unit.
                if parts[0] == top and len(parts) > 1 and parts[1] in units and parts[1] != unit:
                    edges.setdefault(unit, set()).add(parts[1])
    return edges


def module_graph(package: Path) -> dict[str, set[str]]:
    """module -> the other modules of the package it imports, lazy imports
    included; a module is a file (a package is its __init__.py). `from . import x`
    names module x when x is a file, else the package it is imported from."""
    top = package.name
    modules: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {}
    for name, path in sorted(modules.items()):
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:   # a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == top:
                    edges.setdefault(name, set()).add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle once, as a path that returns to its start (shortest found first)."""
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for start in sorted(edges):
        # Breadth first from start, back to start: the shortest cycle through it.
        paths = [[start]]
        visited = {start}
        while paths:
            nxt = []
            for p in paths:
                for w in sorted(edges.get(p[-1], ())):
                    if w == start:
                        key = frozenset(p)
                        if key not in seen:
                            seen.add(key)
                            found.append(p + [start])
                    elif w not in visited:
                        visited.add(w)
                        nxt.append(p + [w])
            paths = nxt
    return found


def test_no_import_cycle_between_the_packages_of_slurm_snap():
    edges = import_graph(PACKAGE)
    assert {"hooks", "protocol", "inventory", "client", "cli"} <= set(edges)  # the graph was read
    assert cycles(edges) == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles(edges))


def test_no_two_files_of_slurm_snap_import_each_other_directly_or_around_a_loop():
    edges = module_graph(PACKAGE)
    assert {"slurm_snap.states", "slurm_snap.protocol.finalize"} <= edges["slurm_snap.protocol.coordinator"]  # read
    assert cycles(edges) == [], "file import cycles: " + "; ".join(" -> ".join(c) for c in cycles(edges))


def test_the_file_checker_sees_a_lazy_cycle_and_names_modules_not_the_names_inside_them(tmp_path):
    pkg = tmp_path / "slurm_snap"
    (pkg / "protocol").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "protocol" / "__init__.py").write_text("")
    (pkg / "states.py").write_text("X = 1\n")
    (pkg / "protocol" / "repair.py").write_text("from .. import states\ndef f():\n    from . import nodeloss\n")
    (pkg / "protocol" / "nodeloss.py").write_text("from .repair import RepairAction\nfrom ..states import X\n")
    edges = module_graph(pkg)
    assert edges == {"slurm_snap.protocol.repair": {"slurm_snap.states", "slurm_snap.protocol.nodeloss"},
                     "slurm_snap.protocol.nodeloss": {"slurm_snap.protocol.repair", "slurm_snap.states"}}
    assert cycles(edges) == [["slurm_snap.protocol.nodeloss", "slurm_snap.protocol.repair",
                              "slurm_snap.protocol.nodeloss"]]


def test_the_checker_sees_a_cycle_through_a_lazy_relative_import(tmp_path):
    pkg = tmp_path / "slurm_snap"
    for d in ("hooks", "protocol", "inventory"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "states.py").write_text("X = 1\n")
    (pkg / "hooks" / "run.py").write_text("from ..protocol import preempt\n")
    (pkg / "protocol" / "preempt.py").write_text("def f():\n    from ..hooks.run import g\n    from .. import states\n")
    (pkg / "inventory" / "db.py").write_text("import slurm_snap.states\n")
    edges = import_graph(pkg)
    assert edges == {"hooks": {"protocol"}, "protocol": {"hooks", "states"}, "inventory": {"states"}}
    assert cycles(edges) == [["hooks", "protocol", "hooks"]]
