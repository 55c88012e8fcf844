"""A small OCI bundle for Slurm's `srun --container` on the dev cluster.

The root filesystem is a skeleton of empty directories (a few kB, made in
milliseconds: no image to build, pull or cache in CI). What the ranks need
is bind-mounted read-only from the node: Python's interpreter and standard
library, the shared libraries under /usr/lib/x86_64-linux-gnu, and the
training environment (a venv with torch and slurm-snap's client); and
read-write what slurm-snap needs a rank to reach: the per-job barrier
directory and the job's volumes. Nothing else of the host is there: no
/usr/bin/scontrol, no slurm.conf, no munge socket, as in a site's image.

config.json starts from `runc spec --rootless`: a user namespace in which
the job's uid is root (runc 1.1.5 refused a mapping of the uid to itself:
"User namespaces enabled, but no user mapping found"), so what the ranks
write is the job's user's on the host; no cgroup limits (rootless); the
node's network namespace kept (DDP's ranks reach each other by the nodes'
addresses, as a site's containers use the host network). Slurm fills in
the process (arguments, environment, working directory) when it starts the
step.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

# Read-only from the node: the interpreter and what it loads.
SYSTEM_BINDS = ("/usr/lib/python3.11", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/etc/hosts")
PYTHON = "/usr/bin/python3.11"


def spec(runtime: str = "runc") -> dict:
    """`runc spec --rootless` (or crun's) as a dict."""
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"oci-spec-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([shutil.which(runtime) or runtime, "spec", "--rootless"], cwd=tmp, check=True,
                       capture_output=True, timeout=30)
        return json.loads((tmp / "config.json").read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bind(source: str, destination: str | None = None, *, ro: bool) -> dict:
    return {"destination": destination or source, "type": "bind", "source": source,
            "options": ["rbind", "ro" if ro else "rw", "nosuid", "nodev"]}


def make_bundle(bundle: Path, *, uid: int, gid: int, user: str, venv: str, rw: list[str],
                runtime: str = "runc") -> Path:
    """Write BUNDLE/config.json and BUNDLE/rootfs for user `uid`: `venv`
    mounted read-only at its own path, each path of `rw` read-write at its
    own path (the barrier directory, the job's volumes). Returns the bundle."""
    root = bundle / "rootfs"
    if bundle.exists():
        shutil.rmtree(bundle)
    for d in ("usr/bin", "usr/lib", "etc", "tmp", "proc", "dev", "sys", "run", *(p.lstrip("/") for p in
              (*SYSTEM_BINDS, venv, *rw))):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / link).symlink_to(target)
    (root / "etc/hosts").rmdir()
    (root / "etc/hosts").touch()
    (root / "usr/bin/python3.11").touch()
    (root / "usr/bin/python3").symlink_to("python3.11")
    # Inside, the job's user is root of the namespace: name it so.
    (root / "etc/passwd").write_text(f"{user}:x:0:0::/tmp:/bin/false\n")
    (root / "etc/group").write_text(f"{user}:x:0:\n")
    config = spec(runtime)
    config["root"] = {"path": str(root), "readonly": True}
    config["process"]["terminal"] = False
    config["process"]["user"] = {"uid": 0, "gid": 0}
    config["process"]["env"] = ["PATH=/usr/bin", "HOME=/tmp"]
    linux = config["linux"]
    linux["namespaces"] = [ns for ns in linux["namespaces"] if ns["type"] not in ("network", "uts")]
    config.pop("hostname", None)
    linux["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
    linux["gidMappings"] = [{"containerID": 0, "hostID": gid, "size": 1}]
    linux.pop("resources", None)
    mounts = [m for m in config["mounts"] if m["destination"] not in ("/sys", "/sys/fs/cgroup")]
    mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777"]})
    mounts += [_bind(p, ro=True) for p in SYSTEM_BINDS]
    mounts.append(_bind(PYTHON, ro=True))
    mounts.append(_bind(venv, ro=True))
    mounts += [_bind(p, ro=False) for p in rw]
    config["mounts"] = mounts
    (bundle / "config.json").write_text(json.dumps(config, indent=1))
    return bundle
