# Installs what the dev cluster needs on a fresh Debian 12. Sourced.

DEV_PACKAGES="slurm-wlm slurm-client munge libslurm-dev slurm-wlm-basic-plugins-dev
btrfs-progs xfsprogs openssh-server build-essential lua5.3 sudo python3 python3-venv
iproute2 util-linux"
# What only the tests use (scripts/test passes these to ensure_packages):
# prometheus for promtool, which checks the metrics' exposition and
# etc/prometheus's alert rules (tests/unit/test_ops_artefacts.py; its daemon
# is not started: policy-rc.d below); groff-base and man-db render the man
# page (tests/unit/test_manpage_completion.py); zfs-fuse (Debian's ZFS in
# FUSE) for the zfs backend's real conformance cases: its postinst cannot
# start the daemon either, the tests start their own and stop it by PID
# (tests/integration/fs.py); systemd for `systemd-analyze verify` of etc/'s
# timer and service (already there on most machines); Ceph 16 for the cephfs
# backend's real conformance cases on a one-host cluster the tests start and
# stop by PID (tests/integration/ceph_cluster.py). ceph-mds depends on the
# `ceph` metapackage, so mon, mgr and osd come along anyway; naming them says
# what the fixture runs. Measured on a fresh Debian 12: 94 packages, 246 MB,
# about 29 s. mmdebstrap makes the Debian 12 and 13 roots the packages are
# built and installed in; debhelper and dh-virtualenv (with DEV_PACKAGES'
# build-essential, libslurm-dev, python3-venv: debian/control's
# Build-Depends) build the Debian 12 .deb on this Debian 12 host; rpm brings
# rpmbuild for the RPM spec (tests/integration/test_package*.py,
# docs/packaging.md). runc (Debian's OCI
# runtime, a few MB) runs the containers of
# tests/integration/test_training_jobs_cluster.py under Slurm's oci.conf
# (scripts/lib-slurm.sh says why not crun).
TEST_PACKAGES="prometheus groff-base man-db zfs-fuse systemd mmdebstrap debhelper dh-virtualenv rpm
ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common
runc"
# The one place that names the venv the hooks, the SPANK plugin's helper=,
# tests, the demo and benchmarks run. Two developers (or a developer and CI) on
# one machine each set their own, so one's reinstall cannot break the other's
# running cluster.
VENV=${SLURM_SNAP_VENV:-/opt/slurm-snap/venv}
PYTHON=$VENV/bin/python
case $VENV in
/*[!A-Za-z0-9._/-]* | [!/]*) printf 'error: SLURM_SNAP_VENV=%s must be an absolute path of letters, digits, ".", "_", "-", "/"\n' "$VENV" >&2; exit 2 ;;
esac
WHEELS=/opt/wheels

package_installed() {
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# Arguments: packages wanted beyond DEV_PACKAGES (e.g. the inventory's server).
ensure_packages() {
	local missing="" p created_policy=""
	for p in $DEV_PACKAGES "$@"; do
		package_installed "$p" || missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	log "installing:$missing"
	# Package scripts must not start system-wide daemons (sshd on port 22,
	# munged, slurmd): the dev cluster starts its own, bound to loopback.
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		created_policy=1
	fi
	# apt's lists are empty on a fresh machine; one update is enough. Another
	# cluster or engineer may hold dpkg's lock for a while: wait for it.
	if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends $missing </dev/null >"$STATE/log/apt.log" 2>&1; then
		apt-get -o DPkg::Lock::Timeout=600 update </dev/null >>"$STATE/log/apt.log" 2>&1 || true
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends $missing </dev/null >>"$STATE/log/apt.log" 2>&1 ||
			{ [ -n "$created_policy" ] && rm -f /usr/sbin/policy-rc.d; tail -n 20 "$STATE/log/apt.log" >&2; die "apt-get install$missing failed (log: $STATE/log/apt.log)"; }
	fi
	[ -n "$created_policy" ] && rm -f /usr/sbin/policy-rc.d
	return 0
}

# Hash of what pip would install, to reinstall only when the project changed.
project_hash() {
	# README.md/LICENSE may not exist yet: find's complaint must not fail the pipe.
	(cd "$REPO" && { find pyproject.toml bin slurm_snap README.md LICENSE -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 2>/dev/null || true; } |
		LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}

# Builds a wheel from a copy of the project (pip's in-tree build would leave
# build/ and *.egg-info in the developer's work tree), then installs it:
# first with its extras so new dependencies arrive (a no-op when satisfied;
# torch, Lightning, torchdata, transformers and accelerate for the framework
# examples and their tests: torch==2.13.0 from the local wheel house, so
# nothing asks for a CUDA build),
# then --force-reinstall --no-deps so the code is replaced even when the
# version did not change. torch comes from the local wheel house.
install_project() {
	local tmp whl rc=0
	tmp=$(mktemp -d /tmp/slurm-snap-pip.XXXXXX)
	(cd "$REPO" && cp -a pyproject.toml bin slurm_snap "$tmp/" && for f in README.md LICENSE; do [ -e "$f" ] && cp -a "$f" "$tmp/"; done; true)
	find "$tmp" -name __pycache__ -prune -exec rm -rf {} +
	{
		"$VENV/bin/pip" wheel --disable-pip-version-check -q --no-deps -w "$tmp/dist" "$tmp" &&
			whl=$(ls "$tmp"/dist/*.whl) &&
			"$VENV/bin/pip" install --disable-pip-version-check -q --find-links "$WHEELS" "$whl[test,example,hf,postgres,mysql]" &&
			"$VENV/bin/pip" install --disable-pip-version-check -q --no-deps --force-reinstall "$whl"
	} </dev/null >>"$STATE/log/pip.log" 2>&1 9>&- || rc=$?
	rm -rf "$tmp"
	return $rc
}

# The venv is what plugstack.conf's helper= and the hooks exec. A project that
# does not build yet must not keep the cluster from starting: warn only.
ensure_venv() {
	local want have=""
	if [ ! -x "$VENV/bin/python" ]; then
		log "creating $VENV"
		install -d -m 0755 "$(dirname "$VENV")"
		/usr/bin/python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
	fi
	want=$(project_hash)
	[ -r "$VENV/.slurm-snap-installed" ] && have=$(cat "$VENV/.slurm-snap-installed")
	[ "$want" = "$have" ] && [ -x "$VENV/bin/slurm-snap" ] && return 0
	log "installing the project into $VENV (log: $STATE/log/pip.log)"
	if ! install_project; then
		log "warning: pip install of $REPO failed; hooks and option checks will fail until it installs (see $STATE/log/pip.log)"
		return 0
	fi
	printf '%s\n' "$want" >"$VENV/.slurm-snap-installed"
}
