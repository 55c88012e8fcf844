"""Writes the rank-side client's own wheel, `slurm-snap-client` (docs/client.md).

Users install it in their training environments and containers, which hold
none of slurm-snap's dependencies and need none: the client is standard
library only. The wheel holds `slurm_snap/client/` and exactly the modules of
`slurm_snap` it imports (followed through the import graph, so it cannot
fall behind the client's imports), under the same import names, at the
project's version, with no dependencies.

Written here with the standard library (a wheel is a zip with METADATA,
WHEEL and RECORD): no build backend, so it builds offline and byte-for-byte
the same from the same tree.

    python3 packaging/client_wheel.py [TREE] OUTDIR
"""
from __future__ import annotations

import ast
import base64
import hashlib
import sys
import zipfile
from pathlib import Path

NAME = "slurm-snap-client"
DIST = "slurm_snap_client"
# Zip entries' time: fixed, so the same tree gives the same wheel.
EPOCH = (2020, 1, 1, 0, 0, 0)


def module_file(tree: Path, module: str) -> Path | None:
    base = tree / Path(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imports(tree: Path, path: Path) -> set[str]:
    """slurm_snap modules `path` imports at any level (a lazy import inside a
    function still runs in users' processes)."""
    module = ".".join(path.relative_to(tree).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            out.add(target)
            out |= {f"{target}.{a.name}" for a in node.names}   # `from pkg import module`
    return {m for m in out if m == "slurm_snap" or m.startswith("slurm_snap.")}


def closure(tree: Path) -> list[Path]:
    """Every file of slurm_snap the client package needs, itself included."""
    todo = ["slurm_snap", *[".".join(p.relative_to(tree).with_suffix("").parts).removesuffix(".__init__")
                            for p in sorted((tree / "slurm_snap/client").glob("*.py"))]]
    seen: dict[str, Path] = {}
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        path = module_file(tree, mod)
        if path is None:
            continue   # `from pkg import name` where name is not a module
        seen[mod] = path
        todo += sorted(_imports(tree, path) - set(seen))
        parent = mod.rsplit(".", 1)[0]
        if "." in mod and parent not in seen:
            todo.append(parent)
    return sorted(set(seen.values()))


def version(tree: Path) -> str:
    for line in (tree / "slurm_snap/__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split('"')[1]
    raise SystemExit("no __version__ in slurm_snap/__init__.py")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(tree: Path, out: Path) -> Path:
    ver = version(tree)
    info = f"{DIST}-{ver}.dist-info"
    files = {p.relative_to(tree).as_posix(): p.read_bytes() for p in closure(tree)}
    summary = "The rank-side client of slurm-snap: checkpoint, acknowledge and release inside training jobs"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {ver}\nSummary: {summary}\n"
        "License: Apache-2.0\nRequires-Python: >=3.11\n\n"
        "The standard-library-only part of slurm-snap that runs in training processes "
        "(`from slurm_snap.client import Checkpointer`). Install it where slurm-snap itself is "
        "not installed: slurm-snap already contains it (docs/client.md).\n").encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: slurm-snap packaging/client_wheel.py\n" \
                             b"Root-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/licenses/LICENSE"] = (tree / "LICENSE").read_bytes()
    record = [_record_line(n, d) for n, d in sorted(files.items())] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{DIST}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():   # RECORD last, as installers expect
            zi = zipfile.ZipInfo(name, EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return wheel


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 2):
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    tree_arg = Path(args[0]) if len(args) == 2 else Path(__file__).resolve().parents[1]
    print(build(tree_arg.resolve(), Path(args[-1])))
