"""The packages of this tree, built once per tree state, and fresh Debian
roots to install them into (scripts/package; docs/packaging.md).

A build costs minutes (an mmdebstrap root on a cold machine, pip fetching the
pinned wheels, compression), so each package is kept under the test state directory
keyed by a hash of every file the build copies; a later run on the same tree
reuses it. Shared by test_package.py, test_package_install.py and
test_package_cluster.py.

Also a program, for scripts/test to start in the background before the unit
tests (stdlib only: it runs before the venv exists):

    python3 tests/integration/packages.py prepare

builds each release's .deb and makes each release's cached root, side by
side; a test that asks for one later waits on its lock if it is not ready.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "scripts" / "package"
RELEASES = {"bookworm": ("+deb12", "22.05", "3.11"), "trixie": ("+deb13", "24.11", "3.13")}
# What the build copies: the project's files as git sees them (scripts/package copy_tree).
TIMINGS: dict[str, float] = {}


# What packaging/stage writes that is not a tree file: made from the tree by
# a command (docs/packaging.md's table), as stage leaves it (Debian then compresses the man pages).
GENERATED = {
    "usr/bin/slurm-snap": "link to the venv's console script",
    "usr/lib/slurm-snap/slurm_snap.so": "make -C spank (spank/*.c)",
    "usr/share/slurm-snap/built-for-slurm": "spank's Slurm headers (slurm_version.h)",
    "usr/share/man/man1/slurm-snap.1": "slurm-snap config man",
    "usr/share/man/man5/slurm-snap.toml.5": "slurm-snap config man slurm-snap.toml",
    "usr/share/bash-completion/completions/slurm-snap": "click completion",
    "usr/share/zsh/vendor-completions/_slurm-snap": "click completion",
    "usr/share/fish/vendor_completions.d/slurm-snap.fish": "click completion",
}
HELPER = "/usr/lib/slurm-snap/venv/bin/slurm-snap"


def tree_copies(tree: Path = ROOT) -> tuple[dict[str, str], dict[str, str]]:
    """The tree files packaging/stage copies, packaged path -> tree path:
    those it writes through its one path substitution, and the documents
    it copies as they are (Debian compresses the larger ones)."""
    same = {"etc/slurm-snap/slurm-snap.toml": "etc/slurm-snap.toml.example",
            "etc/slurm-snap/plugstack.conf": "etc/plugstack.conf",
            "etc/default/slurm-snap": "etc/slurm-snap.default",
            "etc/logrotate.d/slurm-snap": "etc/logrotate.slurm-snap",
            "usr/share/slurm-snap/slurm.conf.slurm-snap": "etc/slurm.conf.slurm-snap",
            "usr/share/slurm-snap/cli_filter.lua": "etc/cli_filter.lua",
            "usr/share/slurm-snap/prometheus/slurm-snap.rules.yml": "etc/prometheus/slurm-snap.rules.yml",
            "usr/share/slurm-snap/grafana/slurm-snap.json": "etc/grafana/slurm-snap.json"}
    same |= {f"usr/libexec/slurm-snap/{f.name}": f"{f.parent.name}/{f.name}"
             for f in [*tree.glob("prolog/slurm-snap-*"), *tree.glob("epilog/slurm-snap-*")]}
    same |= {f"usr/lib/systemd/system/{f.name}": f"etc/{f.name}"
             for f in [*tree.glob("etc/slurm-snap-*.service"), *tree.glob("etc/slurm-snap-*.timer")]}
    as_is = {"usr/share/doc/slurm-snap/admin-guide.md": "etc/README.md"}
    for doc in ["README.md", "CHANGELOG.md", "SECURITY.md", *[f"docs/{f.name}" for f in tree.glob("docs/*.md")],
                *[f"examples/{f.name}" for f in tree.glob("examples/*")]]:
        as_is[f"usr/share/doc/slurm-snap/{doc}"] = doc
    return same, as_is


def tree_after_substitution(rel: str, tree: Path = ROOT) -> bytes:
    """A tree file as packaging/stage writes it (its one path substitution)."""
    text = (tree / rel).read_text()
    text = text.replace("/opt/slurm-snap/venv/bin/slurm-snap", HELPER)
    text = text.replace("/usr/local/lib/slurm-snap/", "/usr/lib/slurm-snap/")
    text = text.replace("/usr/local/libexec/slurm-snap/", "/usr/libexec/slurm-snap/")
    return text.encode()


def state_dir() -> Path:
    return Path(os.environ.get("SLURM_SNAP_TEST_STATE", "/var/tmp/slurm-snap-test"))


def tree_files(tree: Path = ROOT) -> list[Path]:
    out = subprocess.run(["git", "-C", str(tree), "ls-files", "-z", "-co", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    return sorted(tree / f for f in out.decode().split("\0") if f and (tree / f).is_file())


@functools.cache
def tree_hash(tree: Path = ROOT) -> str:
    """Of every file the build copies but the tests, which no package holds;
    once per test session (an edit during a run does not rebuild)."""
    h = hashlib.sha256()
    for f in tree_files(tree):
        if f.relative_to(tree).parts[0] in ("tests", "benchmarks", ".ci"):
            continue
        h.update(str(f.relative_to(tree)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def version(tree: Path = ROOT) -> str:
    for line in (tree / "slurm_snap" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split('"')[1]
    raise AssertionError("no __version__")


def _prerequisites() -> None:
    from realcomponents import require       # imports pytest: not at the top, for `prepare`
    require(os.geteuid() == 0, "package builds need root (mmdebstrap, chroot)")
    require(shutil.which("mmdebstrap") is not None, "mmdebstrap not installed (scripts/test installs it)")


Wanted = tuple[str, tuple[str, ...], str]     # (scripts/package KIND, its ARGS, the file it makes: a glob)


def _build_many(wanted: list[Wanted], tree: Path = ROOT, check_tools: bool = True) -> list[Path]:
    """scripts/package KIND ARGS... for each one not yet in the cache dir of
    this tree state, all at once: the Debian 12 and 13 builds and the RPM
    wait mostly on the network (mmdebstrap, apt, pip) and little on each
    other, so on a cold machine together they take about the longest one's
    time rather than the sum (docs/packaging.md has the figures)."""
    if check_tools:
        _prerequisites()
    out = state_dir() / "packages" / tree_hash(tree)
    out.mkdir(parents=True, exist_ok=True)
    found: dict[int, Path] = {}
    running: list[tuple[int, str, subprocess.Popen, float]] = []
    locks = []
    try:
        # One lock per package, taken in one order: two tests asking for the
        # same package build it once, different ones build side by side.
        for i, (kind, args, made) in sorted(enumerate(wanted), key=lambda w: w[1][2]):
            lock = open(out / f".lock-{made.replace('*', '_')}", "w")
            locks.append(lock)
            fcntl.flock(lock, fcntl.LOCK_EX)
            have = sorted(out.glob(made))
            if have:
                found[i] = have[0]
                continue
            what = " ".join((kind, *args))
            with open(out / f"{what.replace(' ', '-')}.stderr", "w") as err:
                proc = subprocess.Popen([str(PACKAGE), kind, *args, str(out), "--tree", str(tree)],
                                        stdout=subprocess.DEVNULL, stderr=err)
            running.append((i, what, proc, time.monotonic()))
        for i, what, proc, t0 in running:
            code = proc.wait(timeout=3600)
            TIMINGS[what] = time.monotonic() - t0
            log = (out / f"{what.replace(' ', '-')}.stderr").read_text()
            assert code == 0, f"scripts/package {what} failed:\n{log[-4000:]}"
            have = sorted(out.glob(wanted[i][2]))
            assert have, f"scripts/package {what} made no {wanted[i][2]} in {out}: {log[-2000:]}"
            found[i] = have[0]
    finally:
        for _, _, proc, _ in running:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for lock in locks:
            lock.close()
    return [found[i] for i in range(len(wanted))]


def _deb_wanted(release: str, tree: Path) -> Wanted:
    return "deb", (release,), f"slurm-snap_{version(tree)}{RELEASES[release][0]}_*.deb"


def _rpm_wanted(tree: Path) -> Wanted:
    return "rpm", (), f"slurm-snap-{version(tree)}-*.rpm"


def deb(release: str, tree: Path = ROOT) -> Path:
    return _build_many([_deb_wanted(release, tree)], tree)[0]


def rpm(tree: Path = ROOT) -> Path:
    from realcomponents import require
    require(shutil.which("rpmbuild") is not None, "rpmbuild not installed (apt-get install rpm)")
    return _build_many([_rpm_wanted(tree)], tree)[0]


def build_all(tree: Path = ROOT) -> dict[str, Path]:
    """Every package the package tests use, built side by side: each
    release's .deb and the RPM (rpm() names it missing when rpmbuild is)."""
    wanted = {r: _deb_wanted(r, tree) for r in sorted(RELEASES)}
    if shutil.which("rpmbuild"):
        wanted["rpm"] = _rpm_wanted(tree)
    return dict(zip(wanted, _build_many(list(wanted.values()), tree)))


def older_deb(new: Path, out: Path, *, version: str = "0.0.9") -> Path:
    """`new` as the release before it would have been: another version, and
    its schema one migration behind (the newest Alembic revision left out of
    the venv). Repacked with dpkg-deb from the built package, so the upgrade
    test costs no second build; a stand-in until a real earlier release exists."""
    work = out / "older-root"
    subprocess.run(["dpkg-deb", "-R", str(new), str(work)], check=True)
    versions = sorted(work.glob("usr/lib/slurm-snap/venv/lib/python*/site-packages/slurm_snap/inventory/"
                                "migrations/versions/0*.py"))
    assert versions, "no migrations in the package"
    newest = versions[-1]
    for f in [newest, *newest.parent.glob(f"__pycache__/{newest.stem}.*")]:
        f.unlink()
    init = next(work.glob("usr/lib/slurm-snap/venv/lib/python*/site-packages/slurm_snap/__init__.py"))
    init.write_text(init.read_text().replace(f'"{version_of_deb(new).split("+")[0]}"', f'"{version}"'))
    for f in init.parent.glob("__pycache__/__init__.*"):
        f.unlink()
    control = work / "DEBIAN" / "control"
    old_version = version + "+" + version_of_deb(new).split("+", 1)[1]
    control.write_text(re.sub(r"^Version: .*$", f"Version: {old_version}", control.read_text(), flags=re.M))
    # md5sums must list what is there.
    sums = work / "DEBIAN" / "md5sums"
    lines = []
    for line in sums.read_text().splitlines():
        path = line.split(None, 1)[1]
        if (work / path).exists():
            digest = hashlib.md5((work / path).read_bytes()).hexdigest()
            lines.append(f"{digest}  {path}")
    sums.write_text("\n".join(lines) + "\n")
    deb_path = out / f"slurm-snap_{old_version}_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "-z0", "-b", str(work), str(deb_path)],
                   check=True, capture_output=True)
    remove_root(work)
    return deb_path


def version_of_deb(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True,
                          check=True).stdout.strip()


def fresh_root(release: str, where: Path, kind: str = "base") -> Path:
    """A root of `release` as mmdebstrap made it (scripts/package root);
    kind "build" adds the packages' build dependencies (Slurm's headers)."""
    _prerequisites()
    root = where / f"root-{release}-{kind}"
    r = subprocess.run([str(PACKAGE), "root", release, str(root), kind], capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, r.stderr[-4000:]
    return root


def run_in(root: Path, *argv: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    """argv as root inside `root`; `check` asserts exit 0, naming the command."""
    r = subprocess.run([str(PACKAGE), "exec", str(root), *argv], capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{' '.join(argv)} in {root.name} exited {r.returncode}:\n{r.stdout[-3000:]}\n" \
                                  f"{r.stderr[-3000:]}"
    return r


def install(root: Path, package: Path, *apt_options: str) -> subprocess.CompletedProcess:
    """`apt-get install ./slurm-snap_*.deb` as an admin runs it (after an
    update: a fresh root has no package lists)."""
    shutil.copy(package, root / "tmp" / package.name)
    run_in(root, "apt-get", "update", "-q")
    return run_in(root, "apt-get", "install", "-y", "-q", *apt_options, f"/tmp/{package.name}")


def purge_from_machine() -> None:
    """`apt-get purge slurm-snap` on this machine after a dev cluster ran from
    the package: nothing of it stays but what docs/uninstall.md lists."""
    r = subprocess.run(["apt-get", "purge", "-y", "-q", "slurm-snap"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    assert r.returncode == 0, r.stderr
    assert not Path("/usr/lib/slurm-snap").exists() and not Path("/etc/default/slurm-snap").exists()


def remove_root(root: Path) -> None:
    """A root holds no mounts once its commands ended (each ran in its own
    mount namespace); never cross into another filesystem."""
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


def prepare() -> int:
    """Each release's .deb and each release's cached fresh root (base), all
    side by side; what scripts/test starts in the background (module doc)."""
    t0 = time.monotonic()
    roots = [subprocess.Popen([str(PACKAGE), "cache-root", release], stdout=subprocess.DEVNULL)
             for release in sorted(RELEASES)]
    debs = _build_many([_deb_wanted(r, ROOT) for r in sorted(RELEASES)], ROOT, check_tools=False)
    codes = [proc.wait(timeout=3600) for proc in roots]
    for what, seconds in sorted(TIMINGS.items()):
        print(f"scripts/package {what}: {seconds:.0f} s")
    print(f"packages ready in {time.monotonic() - t0:.0f} s: {' '.join(str(d) for d in debs)}"
          + ("" if not any(codes) else f"; a root failed (exit {codes})"))
    return 1 if any(codes) else 0


if __name__ == "__main__":
    import sys
    if sys.argv[1:] != ["prepare"]:
        sys.exit(f"usage: {sys.argv[0]} prepare")
    try:
        sys.exit(prepare())
    except AssertionError as exc:      # a build failed: its log's tail, not a traceback
        sys.exit(f"packages: {exc}")
