# Debian roots made by mmdebstrap (Debian's own successor to debootstrap,
# in Debian 12 and 13), for building slurm-snap's .deb on the release it is
# for and for installing it into a fresh system of that release, as an admin
# would. Sourced by scripts/package.
#
# A base root is mmdebstrap's `apt` variant: the Essential packages and apt,
# the least `apt-get install ./slurm-snap_*.deb` needs, so the package's own
# Depends must bring everything else (debootstrap's minbase adds priority
# "required" packages a node may not have). A build root is the same with
# debian/control's Build-Depends included in the one apt run. mmdebstrap
# resolves and unpacks with apt in one pass: on this machine at a load of
# 13 it made a bookworm root in 158 s with 22 s of CPU, where debootstrap's
# minbase took 451 to 799 s (docs/packaging.md has the figures). Each root is
# made once and kept as a tarball in /var/cache/slurm-snap/roots, keyed by
# release, kind, package list, mirror and mmdebstrap's version, and made
# again when older than DEBROOT_MAX_AGE_DAYS (stable point releases move on).
# A "fresh" root is that tarball unpacked into a new directory: the files
# mmdebstrap wrote, nothing since. A fresh CI machine has no cache and pays
# the download.

DEBROOT_CACHE=${DEBROOT_CACHE:-/var/cache/slurm-snap/roots}
DEBROOT_MAX_AGE_DAYS=${DEBROOT_MAX_AGE_DAYS:-14}
# What building the .deb needs on top of the base (debian/control's Build-Depends).
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
	local release=$1 kind=$2 key mirror tarball t0 work pkgs="" include=()
	debroot_check_release "$release"
	if [ "$kind" = build ]; then
		pkgs=$DEBROOT_BUILD_PACKAGES
		include=(--include="${pkgs// /,}")
	fi
	mirror=$(debroot_mirror)
	key=$(printf '%s\n' "$release" "$kind" "$pkgs" "$mirror" mmdebstrap-apt "$(dpkg-query -W -f='${Version}' mmdebstrap 2>/dev/null)" |
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
	command -v mmdebstrap >/dev/null || debroot_die "mmdebstrap is not installed (apt-get install mmdebstrap)"
	t0=$(date +%s)
	work=$(mktemp -d "$DEBROOT_CACHE/.make-$release-$kind.XXXXXX")
	debroot_log "mmdebstrap --variant=apt $release${pkgs:+ with $pkgs} from $mirror (cold: no cached root)"
	# The tarball's members are ./PATH, as debroot_fresh unpacks them.
	nice -n 10 mmdebstrap --mode=root --variant=apt "${include[@]}" "$release" "$work/root.tar" "$mirror" \
		>"$work/mmdebstrap.log" 2>&1 && mv "$work/root.tar" "$tarball" ||
		{ tail -n 20 "$work/mmdebstrap.log" >&2; rm -rf --one-file-system "$work"; debroot_die "mmdebstrap $release ($kind) failed"; }
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
