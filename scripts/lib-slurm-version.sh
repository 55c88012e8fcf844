# Which Slurm the dev cluster, demo and tests run, and everything on the shell
# side that depends on its version. Sourced (needs log/die from lib-common.sh,
# ensure_packages from lib-packages.sh, STATE for logs).
#
#   SLURM_SNAP_SLURM=22.05  (default) Debian 12's packages under /usr
#   SLURM_SNAP_SLURM=24.11  Debian 13's binary packages (24.11.5-4+deb13u1)
#   SLURM_SNAP_SLURM=26.05  Debian unstable's binary packages (26.05.5-1)
#                           both unpacked under their own prefix with the
#                           libraries they were built for, and run on Debian 12
#                           (install_debian_slurm below says how)
#   SLURM_SNAP_SLURM=25.11  the site's own Slurm 25.11 under
#                           SLURM_SNAP_SLURM_PREFIX (default /opt/slurm-25.11):
#                           no package registry these machines reach carries
#                           25.11, and these scripts never build Slurm
#
# The Python side decides the same things from the running Slurm's version in
# slurm_snap/slurm/version.py; slurm_conf_version_lines below must agree with
# it, and SLURM_SNAP_SLURM_VERSIONS with its TESTED (tests/unit/test_slurm_version.py).

SLURM_SNAP_SLURM_VERSIONS="22.05 24.11 25.11 26.05"
# What the caller asked for ("" = nothing: a state dir's recorded choice wins).
SLURM_SNAP_SLURM_ASKED=${SLURM_SNAP_SLURM:-}
SLURM_SNAP_SLURM=${SLURM_SNAP_SLURM:-22.05}
case " $SLURM_SNAP_SLURM_VERSIONS " in
*" $SLURM_SNAP_SLURM "*) ;;
*) printf 'error: SLURM_SNAP_SLURM=%s: choose one of %s\n' "$SLURM_SNAP_SLURM" "${SLURM_SNAP_SLURM_VERSIONS// /, }" >&2; exit 2 ;;
esac

SLURM_CACHE_DIR=/var/cache/slurm-snap
SLURM_SITE_PREFIX_DEFAULT=/opt/slurm-25.11

# The pinned Debian packages of a version run from Debian's binaries: the
# release's archive, the version of source package slurm-wlm, and the SHA-256
# of each of its .debs used (from the archive's signed index; apt checks the
# download against that index too). The libraries they need come from the
# same archive, as apt resolves them on the day of a cold install: their
# versions and checksums are listed in the prefix's MANIFEST.
debian_slurm_pin() {
	case $1 in
	24.11)
		SLURM_DEB_VERSION=24.11.5-4+deb13u1
		SLURM_DEB_SUITE=trixie
		SLURM_DEB_ARCHIVE="http://deb.debian.org/debian trixie main"
		SLURM_DEB_SHA256="slurmd=05d65382e266c25f4803b5a38b59746e2920efbc4d91fc95d9f5da5e5f9f8b48
slurmctld=d1900ffa5d7e985c51845bc050394fa760584466a88c837bfa2bd31339fac0a6
slurm-client=b6efa82f76a6765c0cc0808526bfccc6716aba93d415e965b6e8225dd57b9a49
slurm-wlm-basic-plugins=b28673d0a96c86a8b9d8f6c17539799706b0da5a3d36266f8ee295c193c1a46c
libslurm42t64=bd07871c96aa59914a4af063f5abae23c9090f7f5425f64d15b75684890023b7
libslurm-dev=bed2068be215f27ddf21a2c560013dcf26ac845b3da815028da443be9254a79e"
		;;
	26.05)
		# Only the binaries: unstable's source files answer 404 to these
		# machines (measured 2026-12-03), its .debs download.
		SLURM_DEB_VERSION=26.05.5-1
		SLURM_DEB_SUITE=sid
		SLURM_DEB_ARCHIVE="http://deb.debian.org/debian sid main"
		SLURM_DEB_SHA256="slurmd=8b841a1fe2cf71b5d5dbaedf370a7b93dc4ec25208c14bac9bb993e3f929c9c1
slurmctld=2296dca7a90407248006e3209d78709b6a5e04f5cd3f8601fec8410bb4a3c5a8
slurm-client=33c54d937262d472475d3a26f0c0e7ef575c38090255ad46be0213401021863a
slurm-wlm-basic-plugins=d2f5485a7e06e037dc357976b062f1fe9f15c2ecbee2aeab957e503c89448d3e
libslurm45t64=5727e44e962a8a5c568b37c3d71c742831919f41a18b1c7f98f0cf0bbd1e640c
libslurm-dev=792b22563297c48d3cb16d17ea1e675273edbfabcf5a52ddf1565cdc044470fa"
		;;
	*) return 1 ;;
	esac
	SLURM_DEB_RELEASE=${SLURM_DEB_VERSION%%-*}
	# One prefix per Debian version: a new pin installs beside a cluster
	# still running the old one instead of under it.
	SLURM_DEB_PREFIX=/opt/slurm-$(printf '%s' "$SLURM_DEB_VERSION" | tr -c 'A-Za-z0-9.\n-' _)
}

# Where the chosen Slurm's programs, plugins and headers are. A state dir's
# recorded prefix (record_slurm_choice) wins over the environment's.
slurm_install_paths() {
	local p=${SLURM_PREFIX_RECORDED:-}
	case $SLURM_SNAP_SLURM in
	22.05)
		SLURM_PREFIX=/usr SLURM_BIN=/usr/bin SLURM_SBIN=/usr/sbin SLURM_INCLUDE=/usr/include
		SLURM_PLUGIN_DIR=/usr/lib/x86_64-linux-gnu/slurm-wlm
		return 0
		;;
	25.11) [ -n "$p" ] || p=${SLURM_SNAP_SLURM_PREFIX:-$SLURM_SITE_PREFIX_DEFAULT} ;;
	*) [ -n "$p" ] || { debian_slurm_pin "$SLURM_SNAP_SLURM" && p=$SLURM_DEB_PREFIX; } ;;
	esac
	SLURM_PREFIX=$p SLURM_BIN=$p/bin SLURM_SBIN=$p/sbin SLURM_INCLUDE=$p/include SLURM_PLUGIN_DIR=$p/lib/slurm
	# A site's own install may keep its plugins under lib64.
	if [ ! -e "$p/lib/slurm/auth_munge.so" ] && [ -e "$p/lib64/slurm/auth_munge.so" ]; then
		SLURM_PLUGIN_DIR=$p/lib64/slurm
	fi
}

# The ONE shell-side decision about slurm.conf spellings. Prints the lines the
# install writes for Slurm version $1 (major.minor). etc/slurm.conf.slurm-snap
# documents them; slurm_snap/slurm/version.py decides the same for doctor.
slurm_conf_version_lines() {
	local major=${1%%.*} minor=${1#*.}
	minor=${minor%%.*}
	if [ "$major" -ge 23 ]; then
		# 23.02 moved the option; 22.05 rejects PreemptParameters as a parse error.
		printf 'PreemptParameters=send_user_signal\n'
	else
		printf 'SlurmctldParameters=preempt_send_user_signal\n'
	fi
	# 25.11: a job submitted with --requeue=expedite is eligible again the
	# moment it is requeued, instead of cred_expire (default 120 s) later.
	# slurmctld reads it from SlurmctldParameters (25.11 and 26.05's code;
	# 26.05's slurm.conf man page lists it under SchedulerParameters).
	if [ "$((10#$major * 100 + 10#$minor))" -ge 2511 ]; then
		printf 'SlurmctldParameters=enable_expedited_requeue\n'
		# slurmctld's own OpenMetrics on SlurmctldPort (/metrics/jobs, ...):
		# the dashboard shows them beside slurm-snap's, which do not repeat them.
		printf 'MetricsType=metrics/openmetrics\n'
	fi
}

# --- Debian's binaries of a newer release, on Debian 12 ---------------------
# Debian 13's and unstable's Slurm are built for glibc 2.38+ (Debian 12 has
# 2.36). Their .debs and the libraries they need (libc6 included: apt's
# closure from that release's archive) are unpacked under one prefix, and
# each of Slurm's own ELF files is pointed at them: its interpreter is the
# prefix's ld.so and its RPATH the prefix's library directories (patchelf).
# Nothing else changes: every program Slurm execs (the hooks and the venv's
# Python, the job's own programs, munge's socket, /etc/passwd) is this
# machine's, exactly as with Debian 12's Slurm; no chroot. slurmd is told
# where its slurmstepd is (-d) and slurm.conf names PluginDir, the two paths
# Debian compiled in as /usr. Layout, as a source build would install it:
#   PREFIX/bin, sbin (slurmctld, slurmd, slurmstepd), lib (libslurm),
#   lib/slurm (plugins, libslurmfull), include/slurm, sys (the libraries),
#   MANIFEST (every .deb used: package, version, SHA-256)
# and kept as a tarball in /var/cache/slurm-snap keyed by the pins and this
# code, so a later install only unpacks it.

debian_slurm_key() {
	debian_slurm_pin "$1" || return 1
	{
		printf '%s\n' "$SLURM_DEB_VERSION" "$SLURM_DEB_ARCHIVE" "$SLURM_DEB_SHA256" "$(uname -m)"
		declare -f install_debian_slurm debian_slurm_layout debian_slurm_patch debian_slurm_verify
	} | sha256sum | cut -c1-16
}

debian_slurm_installed() {
	debian_slurm_pin "$1" || return 1
	[ -x "$SLURM_DEB_PREFIX/sbin/slurmctld" ] &&
		[ "$(cat "$SLURM_DEB_PREFIX/.slurm-snap-install" 2>/dev/null)" = "$(debian_slurm_key "$1")" ]
}

# Installs Slurm $1 (24.11 or 26.05) under its prefix: from the cache if
# there, else from Debian's archive, then cached.
install_debian_slurm() {
	local v=$1 key tarball work t0=$SECONDS logdir=${STATE:-/tmp}/log
	debian_slurm_pin "$v" || die "Slurm $v is not installed from Debian's binaries"
	key=$(debian_slurm_key "$v")
	tarball=$SLURM_CACHE_DIR/slurm-debian-$SLURM_DEB_VERSION-$key.tar.gz
	install -d -m 0755 "$SLURM_CACHE_DIR" "$logdir"
	# Two clusters starting at once must not install twice or unpack over each other.
	exec 8>"$SLURM_CACHE_DIR/install-$v.lock"
	flock -w 1800 8 || die "could not lock $SLURM_CACHE_DIR/install-$v.lock within 30 min"
	if debian_slurm_installed "$v"; then
		exec 8>&-
		return 0
	fi
	rm -rf --one-file-system "$SLURM_DEB_PREFIX"
	if [ -s "$tarball" ]; then
		tar -C / -xzf "$tarball" || die "unpacking $tarball failed"
		debian_slurm_installed "$v" || die "$tarball did not give $SLURM_DEB_PREFIX (remove it to install again)"
		log "Slurm $SLURM_DEB_VERSION (Debian $SLURM_DEB_SUITE) unpacked from $tarball in $((SECONDS - t0)) s"
		exec 8>&-
		return 0
	fi
	ensure_packages patchelf
	work=$(mktemp -d /var/tmp/slurm-debian.XXXXXX)
	chmod 0755 "$work" # apt downloads as _apt
	log "installing Slurm $SLURM_DEB_VERSION from Debian $SLURM_DEB_SUITE's binaries into $SLURM_DEB_PREFIX (log: $logdir/slurm-install-$v.log)"
	# Each step says its own failure: errexit does not hold inside a
	# subshell on the left of ||.
	(
		fetch_debian_slurm "$work/debs" || exit 1
		printf 'slurm-snap: downloaded after %s s\n' "$((SECONDS - t0))"
		debian_slurm_layout "$work" "$SLURM_DEB_PREFIX" || exit 1
		debian_slurm_patch "$SLURM_DEB_PREFIX" || exit 1
		debian_slurm_verify "$SLURM_DEB_PREFIX" || exit 1
		printf 'slurm-snap: laid out, patched and verified after %s s\n' "$((SECONDS - t0))"
	) </dev/null >"$logdir/slurm-install-$v.log" 2>&1 9>&- ||
		{ tail -n 30 "$logdir/slurm-install-$v.log" >&2; rm -rf --one-file-system "$work" "$SLURM_DEB_PREFIX"
			die "installing Slurm $SLURM_DEB_VERSION failed (log: $logdir/slurm-install-$v.log)"; }
	rm -rf --one-file-system "$work"
	printf '%s\n' "$key" >"$SLURM_DEB_PREFIX/.slurm-snap-install"
	tar -C / -czf "$tarball.new" "${SLURM_DEB_PREFIX#/}" && mv "$tarball.new" "$tarball"
	# Another key of the same version (this code changed) is of no further use.
	find "$SLURM_CACHE_DIR" -maxdepth 1 -name "slurm-debian-$SLURM_DEB_VERSION-*.tar.gz" ! -name "$(basename "$tarball")" -delete
	log "Slurm $SLURM_DEB_VERSION installed and cached in $((SECONDS - t0)) s ($(du -sh "$SLURM_DEB_PREFIX" | cut -f1), $tarball)"
	exec 8>&-
}

# The pinned .debs and their library closure into $1, each pinned one
# checked against its SHA-256. A private apt state (the machine's own apt
# configuration is not touched) that believes nothing is installed, so apt
# downloads every library Slurm's packages depend on.
fetch_debian_slurm() {
	local out=$1 dir=$SLURM_CACHE_DIR/apt-$SLURM_DEB_SUITE-binary pin pkg sum f want=()
	local -a opts
	install -d -m 0755 "$dir/lists" "$dir/cache" "$out"
	install -d -m 0700 -o _apt "$dir/lists/partial" "$out/partial" 2>/dev/null ||
		install -d -m 0700 "$dir/lists/partial" "$out/partial"
	printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s\n' "$SLURM_DEB_ARCHIVE" >"$dir/sources.list"
	opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$dir/lists"
		-o "Dir::Cache=$dir/cache" -o Dir::State::status=/dev/null -o "Dir::Cache::archives=$out" -o APT::Get::List-Cleanup=0)
	apt-get "${opts[@]}" update || return 1
	for pin in $SLURM_DEB_SHA256; do want+=("${pin%%=*}=$SLURM_DEB_VERSION"); done
	if ! apt-get "${opts[@]}" install -y --download-only --no-install-recommends "${want[@]}"; then
		printf 'Debian %s does not offer slurm-wlm %s (any more?): update the pins in scripts/lib-slurm-version.sh\n' \
			"$SLURM_DEB_SUITE" "$SLURM_DEB_VERSION"
		return 1
	fi
	for pin in $SLURM_DEB_SHA256; do
		pkg=${pin%%=*} sum=${pin#*=}
		f=$out/${pkg}_${SLURM_DEB_VERSION//:/%3a}_$(dpkg --print-architecture).deb
		[ -s "$f" ] || { printf '%s: not downloaded\n' "$(basename "$f")"; return 1; }
		printf '%s  %s\n' "$sum" "$f" | sha256sum -c --quiet - ||
			{ printf '%s does not have the pinned SHA-256 %s\n' "$(basename "$f")" "$sum"; return 1; }
	done
}

# Unpacks the .debs of $1/debs into prefix $2: Slurm's own into the layout
# above, every other package that ships a shared object into $2/sys.
debian_slurm_layout() {
	local work=$1 p=$2 deb pkg f name tuple=x86_64-linux-gnu
	install -d -m 0755 "$p" "$p/bin" "$p/sbin" "$p/lib/slurm" "$p/include" "$p/sys" "$work/slurm"
	: >"$p/MANIFEST"
	for deb in "$work"/debs/*.deb; do
		pkg=$(dpkg-deb -f "$deb" Package) || return 1
		case " $(printf '%s ' $SLURM_DEB_SHA256) " in
		*" $pkg="*) dpkg-deb -x "$deb" "$work/slurm" || return 1 ;;
		*)
			# (grep -c reads it all: -q would leave dpkg-deb a broken pipe)
			[ "$(dpkg-deb -c "$deb" | grep -cE '\.so(\.[^/ ]*)?( -> .*)?$')" != 0 ] || continue
			dpkg-deb -x "$deb" "$p/sys" || return 1
			;;
		esac
		printf '%s %s %s\n' "$pkg" "$(dpkg-deb -f "$deb" Version)" "$(sha256sum <"$deb" | cut -d' ' -f1)" >>"$p/MANIFEST"
	done
	mv "$work/slurm/usr/bin/"* "$p/bin/" || return 1
	# Debian names the daemons slurmctld-wlm etc. (alternatives point the plain names at them).
	for f in "$work/slurm/usr/sbin/"*; do
		name=$(basename "$f")
		mv "$f" "$p/sbin/${name%-wlm}" || return 1
	done
	mv "$work/slurm/usr/lib/$tuple/slurm-wlm/"* "$p/lib/slurm/" || return 1
	rmdir "$work/slurm/usr/lib/$tuple/slurm-wlm" || return 1
	mv "$work/slurm/usr/lib/$tuple/"* "$p/lib/" || return 1
	rm -f "$p/lib/"*.a "$p/lib/"*.la # static libslurm: nothing here links it
	mv "$work/slurm/usr/include/"* "$p/include/" || return 1
	rm -rf "$p/sys/usr/share" "$p/sys/etc"
}

# The loader inside the prefix (merged /usr or not).
debian_slurm_loader() {
	local l
	for l in "$1/sys/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$1/sys/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"; do
		[ -e "$l" ] && { readlink -f "$l"; return 0; }
	done
	return 1
}

debian_slurm_rpath() {
	printf '%s/lib/slurm:%s/lib:%s/sys/usr/lib/x86_64-linux-gnu:%s/sys/lib/x86_64-linux-gnu\n' "$1" "$1" "$1" "$1"
}

# Slurm's ELF files: regular files that start with the ELF magic.
debian_slurm_elves() {
	local f
	find "$1/bin" "$1/sbin" "$1/lib" -type f | while IFS= read -r f; do
		[ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] && printf '%s\n' "$f"
	done
}

# Interpreter and RPATH of Slurm's own ELF files. DT_RPATH (not RUNPATH):
# the libraries in sys/ have neither, and the dynamic loader then searches
# the RPATH of the program that loaded them, so their own dependencies
# resolve in the prefix too.
debian_slurm_patch() {
	local p=$1 loader rpath f
	loader=$(debian_slurm_loader "$p") || { printf 'no ld-linux-x86-64.so.2 under %s/sys\n' "$p"; return 1; }
	rpath=$(debian_slurm_rpath "$p")
	debian_slurm_elves "$p" | while IFS= read -r f; do
		patchelf --force-rpath --set-rpath "$rpath" "$f" || exit 1
		if patchelf --print-interpreter "$f" >/dev/null 2>&1; then
			patchelf --set-interpreter "$loader" "$f" || exit 1
		fi
	done
}

# Every library each ELF file needs resolves inside the prefix (the
# loader's own --list, as it would load it), and the programs run.
debian_slurm_verify() {
	local p=$1 loader f bad=0 out
	loader=$(debian_slurm_loader "$p") || return 1
	while IFS= read -r f; do
		out=$(env -i "$loader" --list "$f" 2>&1) || { printf '%s: %s\n' "$f" "$out"; bad=1; continue; }
		if printf '%s\n' "$out" | grep -q 'not found' ||
			printf '%s\n' "$out" | awk -v p="$p/" '$2 == "=>" && index($3, p) != 1 { bad = 1 } END { exit !bad }'; then
			printf '%s loads a library from outside %s:\n%s\n' "$f" "$p" "$out"
			bad=1
		fi
	done < <(debian_slurm_elves "$p")
	[ "$bad" = 0 ] || return 1
	out=$(env -i "$p/sbin/slurmctld" -V) || return 1
	# Debian's build says "slurm-wlm 26.05.5".
	case $out in "slurm $SLURM_DEB_RELEASE" | "slurm-wlm $SLURM_DEB_RELEASE") ;;
	*) printf 'slurmctld -V says %s, not slurm %s\n' "$out" "$SLURM_DEB_RELEASE"; return 1 ;; esac
	printf 'slurm-snap: %s runs: %s\n' "$p/sbin/slurmctld" "$out"
}

# --- the site's own Slurm (25.11) -------------------------------------------
# Checked, never installed: what is missing is said by name with what to do.
check_site_slurm() {
	local p=$SLURM_PREFIX f got missing=""
	if [ -d "$p" ]; then
		for f in sbin/slurmctld sbin/slurmd sbin/slurmstepd bin/sbatch bin/squeue bin/scontrol include/slurm/spank.h; do
			[ -e "$p/$f" ] || missing="$missing $p/$f"
		done
		[ -e "$SLURM_PLUGIN_DIR/auth_munge.so" ] || missing="$missing $SLURM_PLUGIN_DIR/auth_munge.so"
	else
		missing=" $p itself"
	fi
	[ -z "$missing" ] || die "SLURM_SNAP_SLURM=$SLURM_SNAP_SLURM runs the site's own Slurm $SLURM_SNAP_SLURM under $p" \
		"(SLURM_SNAP_SLURM_PREFIX, default $SLURM_SITE_PREFIX_DEFAULT), and it is not there: missing$missing." \
		"No package registry these machines reach carries Slurm $SLURM_SNAP_SLURM and slurm-snap's scripts never build it:" \
		"install Slurm $SLURM_SNAP_SLURM under that prefix yourself (README, 'Slurm versions', says what the dev cluster needs of it)"
	got=$(env -i "$p/sbin/slurmctld" -V 2>&1) || die "$p/sbin/slurmctld -V failed: $got"
	case $got in
	"slurm $SLURM_SNAP_SLURM."* | "slurm-wlm $SLURM_SNAP_SLURM."*) ;;
	*) die "$p/sbin/slurmctld -V says '$got', not Slurm $SLURM_SNAP_SLURM (SLURM_SNAP_SLURM_PREFIX=$p)" ;;
	esac
}

# --- the choice -------------------------------------------------------------
# A cluster keeps the version (and prefix) it was brought up with: `up`
# again, `down` and `status` must talk to its slurmctld with the same
# commands. An explicit SLURM_SNAP_SLURM that disagrees with the state dir is
# refused.
choose_slurm() {
	local was=""
	[ -r "$STATE/etc/slurm-version" ] && was=$(cat "$STATE/etc/slurm-version")
	if [ -n "$was" ] && [ -n "$SLURM_SNAP_SLURM_ASKED" ] && [ "$was" != "$SLURM_SNAP_SLURM_ASKED" ]; then
		die "$STATE was brought up with SLURM_SNAP_SLURM=$was (not $SLURM_SNAP_SLURM_ASKED); run 'down' to change it"
	fi
	SLURM_SNAP_SLURM=${was:-$SLURM_SNAP_SLURM}
	[ -n "$was" ] && [ -r "$STATE/etc/slurm-prefix" ] && SLURM_PREFIX_RECORDED=$(cat "$STATE/etc/slurm-prefix")
	slurm_install_paths
}

record_slurm_choice() {
	install -d -m 0755 "$STATE/etc"
	printf '%s\n' "$SLURM_SNAP_SLURM" >"$STATE/etc/slurm-version"
	printf '%s\n' "$SLURM_PREFIX" >"$STATE/etc/slurm-prefix"
}

load_slurm_choice() {
	if [ -r "$STATE/etc/slurm-version" ]; then SLURM_SNAP_SLURM=$(cat "$STATE/etc/slurm-version"); fi
	if [ -r "$STATE/etc/slurm-prefix" ]; then SLURM_PREFIX_RECORDED=$(cat "$STATE/etc/slurm-prefix"); fi
	slurm_install_paths
}

# Makes the chosen Slurm available: nothing to do for 22.05 (ensure_packages
# installs it), Debian's binaries for 24.11 and 26.05, the site's 25.11 checked.
ensure_slurm() {
	slurm_install_paths
	case $SLURM_SNAP_SLURM in
	22.05) ;;
	25.11) check_site_slurm ;;
	*) install_debian_slurm "$SLURM_SNAP_SLURM" ;;
	esac
	return 0
}
