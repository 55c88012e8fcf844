# Debian roots made by debootstrap, for building slurm-snap's .deb on the
# release it is for and for installing it into a fresh system of that
# release, as an admin would. Sourced by scripts/package.
#
# debootstrap of a minbase root costs about 1 to 2 min and ~200 MB of
# downloads per release (docs/packaging.md has the figures), so each root is
# made once and kept as a tarball in /var/cache/slurm-snap/roots, keyed by
# release, kind, package list, mirror and debootstrap's version, and made
# again when older than DEBROOT_MAX_AGE_DAYS (stable point releases move on).
# A "fresh" root is that tarball unpacked into a new directory: the files
# debootstrap wrote, nothing since. A fresh CI machine has no cache and pays
# the debootstrap.

DEBROOT_CACHE=${DEBROOT_CACHE:-/var/cache/slurm-snap/roots}
DEBROOT_MAX_AGE_DAYS=${DEBROOT_MAX_AGE_DAYS:-14}
# What building the .deb needs on top of minbase (debian/control's Build-Depends).
DEBROOT_BUILD_PACKAGES="build-essential debhelper dh-virtualenv python3 python3-venv libslurm-dev ca-certificates"

debroot_log() { printf 'package: %s\n' "$*" >&2; }
debroot_die() { printf 'package: error: %s\n' "$*" >&2; exit 1; }

debroot_mirror() {
	# The machine's own Debian mirror (Debian 12 and 13 come from the same one).
	local m=${SLURM_SNAP_DEBIAN_MIRROR:-}
	if [ -z "$m" ]; then
		m=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)\/*$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
		[ -n "$m" ] || m=$(sed -n 's/^deb \+\(http[^ ]*\/debian\)\/* .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n 1)
	fi
	printf '%s\n' "${m:-http://deb.debian.org/debian}"
}

debroot_check_release() {
	case $1 in bookworm | trixie) ;; *) debroot_die "release '$1' is not bookworm or trixie" ;; esac
}

# Runs CMD... inside ROOT as root, in a private mount namespace (its /proc
# and /dev mounts vanish with it, however it ends), with the host's resolver,
# without the host's environment (pip's index and CA settings pass through).
debroot_run() {
	local root=$1
	shift
	cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
	# Package scripts must not start daemons (munged, sshd) inside a chroot.
	printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
	chmod 0755 "$root/usr/sbin/policy-rc.d"
	local pass=()
	debroot_build_env
	pass=("${DEBROOT_ENV[@]}")
	if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
		# pip in the root trusts what the host's pip trusts (a site's proxy CA).
		install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/host-ca.crt"
		pass+=(PIP_CERT=/etc/ssl/host-ca.crt)
	fi
	unshare -m --propagation private -- /bin/sh -c '
		root=$1; shift
		mount -t proc proc "$root/proc" && mount --bind /dev "$root/dev" && mount --bind /dev/pts "$root/dev/pts" &&
			exec chroot "$root" "$@"' sh "$root" \
		env -i "${pass[@]}" "$@"
}

# DEBROOT_ENV: the whole environment of a build or of a command in a root:
# a plain PATH and locale, and only the settings that reach pip's index
# (a site's mirror or proxy), nothing else of the caller's.
debroot_build_env() {
	local v
	DEBROOT_ENV=(PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive)
	for v in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT PIP_CERT http_proxy https_proxy no_proxy; do
		[ -n "${!v:-}" ] && DEBROOT_ENV+=("$v=${!v}")
	done
	return 0
}

# Prints the cached tarball of a KIND (base | build) root of RELEASE, making
# it first if it is missing or too old.
debroot_tarball() {
	local release=$1 kind=$2 key mirror tarball t0 work pkgs=""
	debroot_check_release "$release"
	[ "$kind" = build ] && pkgs=$DEBROOT_BUILD_PACKAGES
	mirror=$(debroot_mirror)
	key=$(printf '%s\n' "$release" "$kind" "$pkgs" "$mirror" "$(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null)" |
		sha256sum | cut -c1-12)
	tarball=$DEBROOT_CACHE/$release-$kind-$key.tar
	install -d -m 0755 "$DEBROOT_CACHE"
	exec 7>"$DEBROOT_CACHE/$release-$kind.lock"
	flock -w 1800 7 || debroot_die "could not lock $DEBROOT_CACHE/$release-$kind.lock within 30 min"
	if [ -s "$tarball" ] && [ -n "$(find "$tarball" -mtime -"$DEBROOT_MAX_AGE_DAYS")" ]; then
		exec 7>&-
		printf '%s\n' "$tarball"
		return 0
	fi
	command -v debootstrap >/dev/null || debroot_die "debootstrap is not installed (apt-get install debootstrap)"
	t0=$(date +%s)
	work=$(mktemp -d "$DEBROOT_CACHE/.make-$release-$kind.XXXXXX")
	if [ "$kind" = base ]; then
		debroot_log "debootstrap --variant=minbase $release from $mirror (cold: no cached root)"
		nice -n 10 debootstrap --variant=minbase "$release" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
			{ tail -n 20 "$work/debootstrap.log" >&2; rm -rf --one-file-system "$work"; debroot_die "debootstrap $release failed"; }
	else
		tar -C "$work" --numeric-owner -xf "$(debroot_tarball "$release" base)" ||
			{ rm -rf --one-file-system "$work"; debroot_die "unpacking the $release base root failed"; }
		debroot_log "installing the build dependencies into a $release root"
		debroot_run "$work/root" sh -c "apt-get update -q && nice -n 10 apt-get install -y -q --no-install-recommends $pkgs && apt-get clean" \
			>"$work/apt.log" 2>&1 ||
			{ tail -n 20 "$work/apt.log" >&2; rm -rf --one-file-system "$work"; debroot_die "installing $pkgs into $release failed"; }
	fi
	rm -f "$work/root/usr/sbin/policy-rc.d"
	tar -C "$work" --numeric-owner -cf "$tarball.tmp" root && mv "$tarball.tmp" "$tarball"
	rm -rf --one-file-system "$work"
	# Older keys of this release and kind are of no further use.
	find "$DEBROOT_CACHE" -maxdepth 1 -name "$release-$kind-*.tar" ! -name "$(basename "$tarball")" -delete
	debroot_log "$release $kind root made and cached in $(($(date +%s) - t0)) s: $tarball"
	exec 7>&-
	printf '%s\n' "$tarball"
}

# A fresh root of RELEASE (KIND base or build) at DIR, which must not exist.
debroot_fresh() {
	local release=$1 kind=$2 dir=$3 tarball
	[ ! -e "$dir" ] || debroot_die "$dir already exists"
	tarball=$(debroot_tarball "$release" "$kind")
	install -d -m 0755 "$dir"
	tar -C "$dir" --numeric-owner --strip-components=1 -xf "$tarball" || debroot_die "unpacking $tarball failed"
}
