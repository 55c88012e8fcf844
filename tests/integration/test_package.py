"""The packages (issue 34), the long suite's part: the RPM spec builds and
holds the .deb's files; every file of the package comes from the tree; an
upgrade keeps the admin's configuration and migrates nothing until
`slurm-snap db upgrade`; a purge leaves what docs/uninstall.md says it leaves.

The RPM build alone costs about 10 min on a fresh machine (docs/packaging.md),
so these are marked `packages`: `scripts/test -m packages tests/integration`,
not CI. CI installs each .deb into a fresh root (test_package_install.py) and
runs its dev cluster from the Debian 12 one (test_package_cluster.py)."""
from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

import packages
from packages import ROOT, install, run_in

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.packages]



@pytest.fixture(scope="module", autouse=True)
def built():
    """All packages at once, before the first test needs one (packages.build_all)."""
    return packages.build_all()


def deb_members(deb: Path) -> dict[str, tarfile.TarInfo]:
    """Path -> tar member of the .deb's data archive (dpkg-deb --fsys-tarfile)."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name.removeprefix("./").rstrip("/"): m for m in tar.getmembers() if m.name not in ("./", ".")}


def _normalised(paths, *, rpm: bool) -> set[str]:
    """A file list with the two packagers' documented differences folded
    (docs/packaging.md): compression of man pages and docs, where the
    licence and the zsh completion go, debhelper's changelog and copyright."""
    out = set()
    for p in paths:
        p = "/" + p.lstrip("./").lstrip("/")
        p = re.sub(r"\.gz$", "", p)
        p = re.sub(r"^/usr/share/zsh/(site-functions|vendor-completions)(/|$)", r"/usr/share/zsh/COMPLETIONS\2", p)
        if re.match(r"/usr/share/licenses/slurm-snap[^/]*(/LICENSE)?$", p):
            p = "/usr/share/doc/slurm-snap/copyright" if p.endswith("LICENSE") else ""
        if p in ("/usr/share/doc/slurm-snap/changelog", "/usr/share/licenses") or not p:
            continue
        # Directories the distribution owns (/, /usr, /etc/default...) are listed by dpkg only.
        if p.count("/") <= 2 or p in ("/usr/share/man/man1", "/usr/share/man/man5", "/usr/lib/systemd/system",
                                     "/usr/lib/systemd", "/usr/share/bash-completion",
                                     "/usr/share/bash-completion/completions", "/usr/share/fish",
                                     "/usr/share/fish/vendor_completions.d", "/usr/share/zsh",
                                     "/usr/share/zsh/COMPLETIONS", "/etc/default", "/etc/logrotate.d",
                                     "/var/lib", "/var/log", "/usr/share/man", "/usr/share/doc"):
            continue
        if "/__pycache__/" in p or p.endswith("/__pycache__"):
            continue   # Debian's and rpm's byte-compilation differ; the sources are compared
        out.add(p)
    return out


def test_rpm_spec_builds_with_the_debs_files():
    deb = packages.deb("bookworm")
    rpm = packages.rpm()
    rpm_list = subprocess.run(["rpm", "-qlp", str(rpm)], capture_output=True, text=True,
                              check=True).stdout.splitlines()     # names may hold spaces
    deb_list = list(deb_members(deb))
    only_rpm = _normalised(rpm_list, rpm=True) - _normalised(deb_list, rpm=False)
    only_deb = _normalised(deb_list, rpm=False) - _normalised(rpm_list, rpm=True)
    assert (only_rpm, only_deb) == (set(), set())
    # Both mark the same admin files as configuration.
    rpm_conf = subprocess.run(["rpm", "-qcp", str(rpm)], capture_output=True, text=True,
                              check=True).stdout.splitlines()
    ctl = subprocess.run(["dpkg-deb", "-f", str(deb), "Package"], capture_output=True, text=True).stdout
    assert ctl.strip() == "slurm-snap"
    deb_conf = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(deb_conf)) as tar:
        conffiles = tar.extractfile("./conffiles").read().decode().split()
    assert sorted(rpm_conf) == sorted(conffiles)


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "packaging/requirements.txt").read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def test_every_file_in_the_deb_comes_from_the_tree():
    """Each file is the tree's (as is, or through stage's path substitution),
    generated from the tree by a named command, debhelper's from debian/, or
    in the venv: listed in the RECORD of slurm-snap (built from the tree:
    its modules equal the tree's), of a distribution pinned with its hashes
    in packaging/requirements.txt, or of the pip that `python3 -m venv` puts
    in every venv."""
    deb = packages.deb("bookworm")
    members = deb_members(deb)
    files = {p for p, m in members.items() if m.isfile() or m.issym()}
    venv = "usr/lib/slurm-snap/venv/"
    site = venv + "lib/python3.11/site-packages/"
    pins = _pins()
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    tar = tarfile.open(fileobj=io.BytesIO(data))
    read = lambda p: tar.extractfile("./" + p).read()  # noqa: E731
    explained: dict[str, str] = {}
    # The venv: every file in some distribution's RECORD.
    for record in sorted(p for p in files if p.startswith(site) and p.endswith(".dist-info/RECORD")):
        dist = record[len(site):].split("/")[0]
        name, ver = dist.removesuffix(".dist-info").rsplit("-", 1)
        key = name.lower().replace("_", "-")
        if key == "slurm-snap":
            origin = "the tree (pip install .)"
        elif key in ("pip", "setuptools"):
            origin = "python3 -m venv (ensurepip)"
        else:
            assert pins.get(key) == ver, f"{dist} is in the venv but not pinned in packaging/requirements.txt"
            origin = f"{key}=={ver} (pinned, hash-checked)"
        for row in csv.reader(io.StringIO(read(record).decode())):
            path = os.path.normpath(site + row[0])
            explained[path] = origin
            if key == "slurm-snap" and path.startswith(site + "slurm_snap/") and path.endswith(".py"):
                assert read(path) == (ROOT / path[len(site):]).read_bytes(), path
    for p in files:
        if p.startswith(venv) and "/__pycache__/" in p:
            explained.setdefault(p, "byte-compiled by pip from the file beside it")
    for p in ("bin/python", "bin/python3", "bin/python3.11", "pyvenv.cfg", "lib64"):
        explained[venv + p] = "python3 -m venv"
    # Outside the venv: the tree, a command run on the tree (packaging/stage), or debhelper.
    explained.update({p + ".gz" if p.startswith("usr/share/man/") else p: why   # Debian compresses man pages
                      for p, why in packages.GENERATED.items()})
    explained["usr/share/doc/slurm-snap/changelog.gz"] = "debian/changelog"
    explained["usr/share/doc/slurm-snap/copyright"] = "debian/copyright"
    same, as_is = packages.tree_copies()
    # Files stage writes through the path substitution, and the documents it copies as they are.
    for table, expect in ((same, packages.tree_after_substitution), (as_is, lambda rel: (ROOT / rel).read_bytes())):
        for packaged, rel in table.items():
            plain = packaged.removesuffix(".gz")
            path = next((p for p in (plain, plain + ".gz") if p in files), None)
            assert path is not None, f"{packaged} (from {rel}) is not in the package"
            content = read(path)
            if path.endswith(".gz"):
                content = gzip.decompress(content)
            assert content == expect(rel), f"{path} differs from {rel}"
            explained[path] = rel
    # Generated pages are the tree's program's output.
    man = gzip.decompress(read("usr/share/man/man5/slurm-snap.toml.5.gz")).decode()
    from slurm_snap.cli.tomlpage import render
    assert man == render()
    unexplained = sorted(files - set(explained))
    assert unexplained == [], f"{len(unexplained)} files of unknown origin, e.g. {unexplained[:10]}"
    # And the tree's LICENSE is the licence the package declares.
    assert "Apache-2.0" in read("usr/share/doc/slurm-snap/copyright").decode()
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == \
        hashlib.sha256(Path("/usr/share/common-licenses/Apache-2.0").read_bytes()).hexdigest()


def test_upgrade_keeps_the_config_migrates_nothing_and_remove_and_purge_leave_what_uninstall_md_says(
        root_of, tmp_path):
    new = packages.deb("bookworm")
    old = packages.older_deb(new, tmp_path)
    root = root_of("bookworm")
    install(root, old)
    assert run_in(root, "slurm-snap", "--version").stdout.split()[-1] == "0.0.9"
    run_in(root, "slurm-snap", "db", "upgrade")
    before = json.loads(run_in(root, "slurm-snap", "db", "status", "--json").stdout)
    assert before["ok"]
    conf = root / "etc/slurm-snap/slurm-snap.toml"
    edited = conf.read_text().replace("busy_timeout = 30.0", "busy_timeout = 12.5")
    assert edited != conf.read_text()
    conf.write_text(edited)
    (root / "etc/default/slurm-snap").write_text("RECORD=foreground\n")
    # apt-get as an admin runs it; dpkg keeps a changed conffile whose
    # packaged version did not change, without asking.
    install(root, new)
    assert run_in(root, "slurm-snap", "--version").stdout.split()[-1] == packages.version()
    assert conf.read_text() == edited
    assert (root / "etc/default/slurm-snap").read_text() == "RECORD=foreground\n"
    assert run_in(root, "slurm-snap", "config", "get", "inventory.busy_timeout").stdout.strip() == "12.5"
    # Nothing migrated: the schema is the old one until the admin says so.
    r = run_in(root, "slurm-snap", "db", "status", "--json", check=False)
    status = json.loads(r.stdout)
    assert r.returncode == 9 and status["current"] == before["current"] and status["current"] != status["head"]
    r = run_in(root, "slurm-snap", "report", check=False)
    assert r.returncode == 9 and "db upgrade" in r.stderr
    run_in(root, "slurm-snap", "db", "upgrade")
    status = json.loads(run_in(root, "slurm-snap", "db", "status", "--json").stdout)
    assert status["ok"] and status["current"] == status["head"]

    # Remove, then purge: what stays is docs/uninstall.md's table.
    (root / "var/log/slurm-snap/hooks.log").write_text('{"hook": "epilog"}\n')
    run_in(root, "apt-get", "remove", "-y", "-q", "slurm-snap")
    assert not (root / "usr/lib/slurm-snap").exists() and not (root / "usr/bin/slurm-snap").exists()
    assert conf.read_text() == edited                                    # remove keeps the configuration
    assert (root / "var/lib/slurm-snap/inventory.db").is_file()
    run_in(root, "apt-get", "purge", "-y", "-q", "slurm-snap")
    assert not (root / "etc/slurm-snap").exists() and not (root / "etc/default/slurm-snap").exists()
    assert not (root / "var/log/slurm-snap").exists()                    # purge removes the hooks' logs
    assert (root / "var/lib/slurm-snap/inventory.db").is_file()          # the inventory stays
    text = (ROOT / "docs/uninstall.md").read_text()
    for kept in ("/var/lib/slurm-snap", "snapshots", "plugstack.conf", "slurm.conf"):
        assert kept in text, kept
