"""Each Debian release's .deb installs with `apt-get install ./slurm-snap_*.deb`
into a fresh root of that release (mmdebstrap's `apt` variant: the Essential
packages and apt, nothing since, so the package's Depends must bring the
rest) and its checks pass there: the version, `config check`, `doctor
--local` before and after `db upgrade`, the hook entry points, logrotate,
plugstack.conf's paths, conffiles, the systemd units (installed, not
enabled), man pages and completion (issue 34).

CI runs this (scripts/test starts the builds and roots in the background
before the unit tests: tests/integration/packages.py prepare); the Debian 12
.deb is built on a Debian 12 host, the Debian 13 one in a root of its release.
docs/packaging.md has the cold and warm costs."""
from __future__ import annotations

import gzip
import json
import os

import pytest

import packages
from packages import ROOT, install, run_in

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONF = "/etc/slurm-snap/slurm-snap.toml"
HELPER = packages.HELPER


@pytest.mark.parametrize("release", sorted(packages.RELEASES))
def test_deb_installs_and_checks_pass_in_a_fresh_root(release, root_of):
    suffix, slurm, python = packages.RELEASES[release]
    deb = packages.deb(release)
    root = root_of(release)
    assert not (root / "usr/bin/python3").exists()     # fresh: no Python before the package asks for it
    install(root, deb)
    r = run_in(root, "slurm-snap", "--version")
    assert r.stdout.strip() == f"slurm-snap, version {packages.version()}", r.stdout
    assert run_in(root, HELPER, "--version").stdout == r.stdout
    # The venv runs the release's own Python, and the plugin is built for its Slurm.
    assert (root / f"usr/lib/slurm-snap/venv/lib/python{python}/site-packages/slurm_snap").is_dir()
    assert (root / "usr/share/slurm-snap/built-for-slurm").read_text().startswith(slurm + ".")
    # The shipped configuration is valid as installed.
    r = run_in(root, "slurm-snap", "config", "check")
    assert f"# {CONF}: valid" in r.stdout
    # doctor --local before the inventory exists: it says so, with the fix.
    r = run_in(root, "slurm-snap", "doctor", "--local", "--json", check=False)
    assert r.returncode == 3, r.stderr
    found = {f["what"]: f for f in json.loads(r.stdout)["findings"]}
    inv = [f for w, f in found.items() if w.startswith("inventory")]
    assert len(inv) == 1 and not inv[0]["ok"] and "db upgrade" in inv[0]["what"] + inv[0]["fix"]
    run_in(root, "slurm-snap", "db", "upgrade")
    r = run_in(root, "slurm-snap", "doctor", "--local", "--json", check=False)
    found = {f["what"]: f for f in json.loads(r.stdout)["findings"]}
    assert any(w.startswith("inventory reachable") and f["ok"] for w, f in found.items()), found
    # What is left is what this bare root lacks, each with its fix: btrfs-progs
    # for the example's scratch class, the example's /lustre barrier directory.
    bad = [f for f in found.values() if not f["ok"]]
    assert bad and all(f["fix"] for f in bad), bad
    assert any("btrfs" in f["what"] for f in bad) and any("barrier directory" in f["what"] for f in bad), bad
    assert not any("pfs" in w for w in found)           # the SSH-reached Lustre class: not --local's
    # The hook entry points run (no job: fail open, exit 0, say why).
    r = run_in(root, "env", "SPANK_SLURM_SNAP=1", "/usr/libexec/slurm-snap/slurm-snap-epilog", check=False)
    assert r.returncode == 0 and "slurm-snap: epilog" in r.stderr, r.stderr
    # logrotate (recommended, so apt-get installed it) takes the package's file
    # and rotates the hooks' log; the hooks open it per line, so a rename is enough.
    log = root / "var/log/slurm-snap/hooks.log"
    log.write_text('{"hook": "epilog"}\n')
    run_in(root, "logrotate", "--force", "--state", "/tmp/logrotate.state", "/etc/logrotate.d/slurm-snap")
    assert (root / "var/log/slurm-snap/hooks.log.1").read_text() == '{"hook": "epilog"}\n'
    st = log.stat()
    assert st.st_size == 0 and oct(st.st_mode & 0o777) == "0o640", oct(st.st_mode)
    # plugstack.conf names files that exist in the package.
    line = next(ln for ln in (root / "etc/slurm-snap/plugstack.conf").read_text().splitlines()
                if ln.startswith("required"))
    plugin, helper = line.split()[1], line.split()[2].removeprefix("helper=")
    assert (root / plugin.lstrip("/")).is_file() and helper == HELPER
    # The admin's files are conffiles; the units are installed, not enabled.
    conffiles = run_in(root, "dpkg-query", "-W", "-f", "${Conffiles}", "slurm-snap").stdout
    for f in ("/etc/slurm-snap/slurm-snap.toml", "/etc/slurm-snap/plugstack.conf", "/etc/default/slurm-snap",
              "/etc/logrotate.d/slurm-snap"):
        assert f in conffiles, conffiles
    assert not list((root / "etc/systemd/system").glob("*/slurm-snap*"))
    units = sorted(p.name for p in (root / "usr/lib/systemd/system").glob("slurm-snap-*"))
    assert units == sorted(f.name for f in [*ROOT.glob("etc/slurm-snap-*.service"),
                                            *ROOT.glob("etc/slurm-snap-*.timer")]), units
    # The hooks Slurm runs, the man pages (Debian compresses them) and the completions.
    for hook in ("prolog", "epilog", "prolog-slurmctld", "epilog-slurmctld"):
        assert os.access(root / f"usr/libexec/slurm-snap/slurm-snap-{hook}", os.X_OK), hook
    page = gzip.decompress((root / "usr/share/man/man1/slurm-snap.1.gz").read_bytes()).decode()
    assert page.startswith(".TH") and "doctor" in page
    assert gzip.decompress((root / "usr/share/man/man5/slurm-snap.toml.5.gz").read_bytes()).startswith(b".TH")
    assert "slurm-snap" in (root / "usr/share/bash-completion/completions/slurm-snap").read_text()
