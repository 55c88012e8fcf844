"""The client's public surface is what docs/client.md documents, and the files
that doc tells a user to copy are enough to run a rank."""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys

import slurm_snap.client as client

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(REPO, "docs", "client.md")


def section(title: str) -> str:
    text = open(DOC, encoding="utf-8").read()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_package_exports_exactly_the_documented_names():
    text = section("What the package exports")
    names = set(re.findall(r"^- `(\w+)`", text, re.M))
    modules = set(re.findall(r"^- `slurm_snap\.client\.(\w+)`", text, re.M))
    assert names == {"Checkpointer", "Action", "mark_first_step"}, names   # the doc lists them
    assert set(client.__all__) == names
    public = {n for n in dir(client) if not n.startswith("_") and not inspect.ismodule(getattr(client, n))}
    assert public == names
    assert modules == {"dcp", "lightning", "huggingface", "launch", "resume_path"}, modules
    for module in modules:
        assert importlib.util.find_spec(f"slurm_snap.client.{module}") is not None, module


def test_the_documented_constructor_is_the_real_one():
    doc = re.search(r"^### `Checkpointer\((.*)\)`$", open(DOC, encoding="utf-8").read(), re.M).group(1)
    documented = [p.strip().split("=")[0] for p in doc.split(",") if p.strip() != "*"]
    real = [n for n in inspect.signature(client.Checkpointer).parameters]
    assert documented == real


def test_the_files_the_doc_says_to_copy_are_enough_for_a_rank(tmp_path):
    """Copy exactly the listed parts of slurm_snap/, nothing else, and run a
    rank's commit in an interpreter that sees only them."""
    text = section("What to install or copy")
    listed = re.search(r"Copy only these parts\s+of it.*?: (.*?)\.\s", text, re.S).group(1)
    parts = re.findall(r"`([\w./]+)`", listed)
    assert "client/" in parts and "jobrecords/" in parts, parts
    copy = tmp_path / "copy" / "slurm_snap"
    copy.mkdir(parents=True)
    for part in parts:
        src = os.path.join(REPO, "slurm_snap", part.rstrip("/"))
        if part.endswith("/"):
            shutil.copytree(src, copy / part.rstrip("/"), ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, copy / part)
    barrier = tmp_path / "barrier"
    (barrier / "42").mkdir(parents=True)
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"model")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "import slurm_snap.client as c, slurm_snap.client.dcp, slurm_snap.client.launch\n"
            "k = c.Checkpointer(env={'SLURM_JOB_ID': '42', 'SLURM_SNAP_BARRIER_DIR': sys.argv[2],"
            " 'SLURMD_NODENAME': 'n1'})\n"
            "print(k.commit(3, [sys.argv[3]]))\n"
            "print(sorted(m for m in sys.modules if m.startswith('slurm_snap')))\n")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(copy.parent), str(barrier), str(ckpt)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    ack_path, loaded = out.stdout.splitlines()
    assert ack_path == str(barrier / "42" / "ack" / "n1.0.json") and os.path.isfile(ack_path)
    assert all(m.split(".")[1] in {p.rstrip("/").removesuffix(".py") for p in parts}
               for m in eval(loaded) if "." in m), loaded
