# Which Slurm the dev cluster, demo and tests run, and everything on the shell
# side that depends on its version. Sourced (needs log/die from lib-common.sh,
# STATE for logs).
#
#   SLURM_SNAP_SLURM=22.05  (default) Debian 12's packages under /usr
#   SLURM_SNAP_SLURM=24.11  Debian 13's upstream source (24.11.5), built once
#                           into /opt/slurm-24.11 and cached as a tarball in
#                           /var/cache/slurm-snap keyed by version + configure
#                           flags, so a later install on this machine only unpacks
#
# The Python side decides the same things from the running Slurm's version in
# slurm_snap/slurm/version.py; slurm_conf_version_lines below must agree with
# its preempt_signal_setting (tests/unit/test_slurm_version.py checks both).

# What the caller asked for ("" = nothing: a state dir's recorded choice wins).
SLURM_SNAP_SLURM_ASKED=${SLURM_SNAP_SLURM:-}
SLURM_SNAP_SLURM=${SLURM_SNAP_SLURM:-22.05}
case $SLURM_SNAP_SLURM in
22.05 | 24.11) ;;
*) printf 'error: SLURM_SNAP_SLURM=%s: choose 22.05 or 24.11\n' "$SLURM_SNAP_SLURM" >&2; exit 2 ;;
esac

SLURM_2411_VERSION=24.11.5
SLURM_2411_DEBIAN=24.11.5-4+deb13u1 # Debian 13's revision: its patches are applied
SLURM_2411_PREFIX=/opt/slurm-24.11
SLURM_CACHE_DIR=/var/cache/slurm-snap
# Debian 13 publishes the upstream tarball in its main pool; the private apt
# state keeps trixie out of the machine's own sources.
SLURM_2411_APT_DIR=$SLURM_CACHE_DIR/apt-trixie
# Only what slurm-snap and the dev cluster use: munge auth, json-c/http-parser/
# yaml for --json output, lua for cli_filter. No cgroup v2 (no dbus), no
# hwloc, pam, hdf5, X: the cluster runs proctrack/linuxproc and task/none.
# --enable-multiple-slurmd as Debian's build: the dev cluster's slurmd n1..n3
# share one NodeHostname (without it 24.11's slurmctld could not address n2
# and n3: "_fwd_tree_get_addr: can't find address", measured).
SLURM_2411_BUILD_DEPS="libmunge-dev liblua5.3-dev libjson-c-dev libhttp-parser-dev libyaml-dev pkg-config"
SLURM_2411_CONFIGURE="--prefix=$SLURM_2411_PREFIX --sysconfdir=$SLURM_2411_PREFIX/etc --enable-multiple-slurmd --disable-static --disable-debug --without-hdf5 --without-rrdtool --without-pmix --without-ucx --without-nvml --without-rsmi --without-hwloc --disable-x11 --disable-slurmrestd"

# Where the chosen Slurm's programs, plugins and headers are.
slurm_install_paths() {
	case $SLURM_SNAP_SLURM in
	22.05)
		SLURM_BIN=/usr/bin SLURM_SBIN=/usr/sbin SLURM_INCLUDE=/usr/include
		SLURM_PLUGIN_DIR=/usr/lib/x86_64-linux-gnu/slurm-wlm
		;;
	24.11)
		SLURM_BIN=$SLURM_2411_PREFIX/bin SLURM_SBIN=$SLURM_2411_PREFIX/sbin
		SLURM_INCLUDE=$SLURM_2411_PREFIX/include SLURM_PLUGIN_DIR=$SLURM_2411_PREFIX/lib/slurm
		;;
	esac
}

# The ONE shell-side decision about slurm.conf spellings. Prints the lines the
# install writes for Slurm version $1 (major.minor). etc/slurm.conf.slurm-snap
# documents both; slurm_snap/slurm/version.py decides the same for doctor.
slurm_conf_version_lines() {
	local major=${1%%.*}
	if [ "$major" -ge 23 ]; then
		# 23.02 moved the option; 22.05 rejects PreemptParameters as a parse error.
		printf 'PreemptParameters=send_user_signal\n'
	else
		printf 'SlurmctldParameters=preempt_send_user_signal\n'
	fi
}

slurm_build_key() {
	printf '%s %s %s %s' "$SLURM_2411_DEBIAN" "$SLURM_2411_CONFIGURE" "$SLURM_2411_SKIP_PATCHES" "$(uname -m)" | sha256sum | cut -c1-16
}

# The installed prefix matches the cache key: reinstall when flags change.
slurm_2411_installed() {
	[ -x "$SLURM_2411_PREFIX/sbin/slurmctld" ] &&
		[ "$(cat "$SLURM_2411_PREFIX/.slurm-snap-build" 2>/dev/null)" = "$(slurm_build_key)" ]
}

# Installs Slurm 24.11 under its own prefix: from the cache if there, else
# fetch + configure + make (nice'd: the machine is shared) and cache it.
# Never touches /usr: Debian's 22.05 stays what other clusters run.
ensure_slurm_2411() {
	local key tarball src work t0=$SECONDS logdir=${STATE:-/tmp}/log
	key=$(slurm_build_key)
	tarball=$SLURM_CACHE_DIR/slurm-$SLURM_2411_VERSION-$key.tar.gz
	install -d -m 0755 "$SLURM_CACHE_DIR" "$logdir"
	# Two clusters starting at once must not build twice or unpack over each other.
	exec 8>"$SLURM_CACHE_DIR/build.lock"
	flock -w 1800 8 || die "could not lock $SLURM_CACHE_DIR/build.lock within 30 min"
	if slurm_2411_installed; then
		exec 8>&-
		return 0
	fi
	if [ -s "$tarball" ]; then
		log "installing Slurm $SLURM_2411_VERSION from the cache $tarball"
		rm -rf "$SLURM_2411_PREFIX"
		tar -C / -xzf "$tarball" || die "unpacking $tarball failed"
		slurm_2411_installed || die "$tarball did not give $SLURM_2411_PREFIX (remove it to rebuild)"
		log "Slurm $SLURM_2411_VERSION unpacked in $((SECONDS - t0)) s"
		exec 8>&-
		return 0
	fi
	# shellcheck disable=SC2086
	ensure_packages $SLURM_2411_BUILD_DEPS
	src=$(fetch_slurm_2411_source) || die "fetching Slurm $SLURM_2411_VERSION's source failed"
	work=$(mktemp -d /var/tmp/slurm-build.XXXXXX)
	install -d "$work/src"
	log "building Slurm $SLURM_2411_VERSION into $SLURM_2411_PREFIX (log: $logdir/slurm-build.log; about 4 min on 2 cores)"
	(
		tar -C "$work/src" --strip-components=1 -xzf "$src" &&
			tar -C "$work/src" -xJf "$SLURM_CACHE_DIR/slurm-wlm_$SLURM_2411_DEBIAN.debian.tar.xz" &&
			cd "$work/src" &&
			apply_debian_patches &&
			# shellcheck disable=SC2086
			nice -n 10 ./configure $SLURM_2411_CONFIGURE &&
			nice -n 10 make -j"$(nproc)" &&
			rm -rf "$SLURM_2411_PREFIX" &&
			make install
	) </dev/null >"$logdir/slurm-build.log" 2>&1 9>&- ||
		{ tail -n 30 "$logdir/slurm-build.log" >&2; rm -rf "$work"; die "building Slurm $SLURM_2411_VERSION failed (log: $logdir/slurm-build.log)"; }
	rm -rf "$work"
	printf '%s\n' "$key" >"$SLURM_2411_PREFIX/.slurm-snap-build"
	tar -C / -czf "$tarball.new" "${SLURM_2411_PREFIX#/}" && mv "$tarball.new" "$tarball"
	log "Slurm $SLURM_2411_VERSION built and cached in $((SECONDS - t0)) s"
	exec 8>&-
}

# Debian's fixes (the CVE fixes above all) on top of upstream, in series
# order; a patch that no longer applies stops the build rather than being
# skipped. Not applied: patches of the build system's inputs (configure.ac,
# Makefile.am: Debian runs autoreconf, this build does not, and make then
# half-regenerates and fails in doc/man, measured) and Debian's packaging
# choices (NVML forced on for its contrib plugin).
SLURM_2411_SKIP_PATCHES="rpath miscellanea-manpages force-nvml"
apply_debian_patches() {
	local p
	[ -r debian/patches/series ] || return 0
	while read -r p _; do
		case $p in '' | '#'*) continue ;; esac
		case " $SLURM_2411_SKIP_PATCHES " in *" $p "*) printf 'debian patch %s: not applied (see lib-slurm-version.sh)\n' "$p"; continue ;; esac
		patch -p1 --forward --quiet <"debian/patches/$p" || { printf 'debian patch %s does not apply\n' "$p"; return 1; }
	done <debian/patches/series
}

# Prints the path of the upstream tarball, downloaded once into the cache with
# Debian's patches. apt checks each file against the signed Sources index and
# keeps only files that match, so a file present afterwards is verified.
fetch_slurm_2411_source() {
	local orig=$SLURM_CACHE_DIR/slurm-wlm_$SLURM_2411_VERSION.orig.tar.gz
	local deb=$SLURM_CACHE_DIR/slurm-wlm_$SLURM_2411_DEBIAN.debian.tar.xz
	# The upstream tarball is in the main pool; the patches of the +deb13u1
	# revision only in the security archive; the .dsc in neither (404, measured
	# 2026-12): one private apt state per archive, and a missing .dsc is no error.
	fetch_from_debian main "http://deb.debian.org/debian trixie main" "$orig"
	fetch_from_debian security "http://security.debian.org/debian-security trixie-security main" "$deb"
	[ -s "$orig" ] && [ -s "$deb" ] || return 1
	printf '%s\n' "$orig"
}

fetch_from_debian() {
	local name=$1 line=$2 want=$3 dir=$SLURM_2411_APT_DIR/$1 apt_opts
	[ -s "$want" ] && return 0
	install -d -m 0755 "$dir/lists/partial"
	printf 'deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s\n' "$line" >"$dir/sources.list"
	apt_opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$dir/lists")
	log "fetching $(basename "$want") from Debian 13 ($name)"
	apt-get "${apt_opts[@]}" update </dev/null >&2 || return 1
	(cd "$SLURM_CACHE_DIR" && apt-get "${apt_opts[@]}" source --download-only --only-source "slurm-wlm=$SLURM_2411_DEBIAN" </dev/null >&2) || true
}

# A cluster keeps the version it was brought up with: `up` again, `down` and
# `status` must talk to its slurmctld with the same version's commands. An
# explicit SLURM_SNAP_SLURM that disagrees with the state dir is refused.
choose_slurm() {
	local was=""
	[ -r "$STATE/etc/slurm-version" ] && was=$(cat "$STATE/etc/slurm-version")
	if [ -n "$was" ] && [ -n "$SLURM_SNAP_SLURM_ASKED" ] && [ "$was" != "$SLURM_SNAP_SLURM_ASKED" ]; then
		die "$STATE was brought up with SLURM_SNAP_SLURM=$was (not $SLURM_SNAP_SLURM_ASKED); run 'down' to change it"
	fi
	SLURM_SNAP_SLURM=${was:-$SLURM_SNAP_SLURM}
	slurm_install_paths
}

record_slurm_choice() {
	install -d -m 0755 "$STATE/etc"
	printf '%s\n' "$SLURM_SNAP_SLURM" >"$STATE/etc/slurm-version"
}

load_slurm_choice() {
	if [ -r "$STATE/etc/slurm-version" ]; then SLURM_SNAP_SLURM=$(cat "$STATE/etc/slurm-version"); fi
	slurm_install_paths
}

# Makes the chosen Slurm available (a no-op for 22.05: ensure_packages installs it).
ensure_slurm() {
	slurm_install_paths
	[ "$SLURM_SNAP_SLURM" = 24.11 ] && ensure_slurm_2411
	return 0
}
