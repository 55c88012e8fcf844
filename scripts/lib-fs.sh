# Loop-device filesystems of the dev cluster. Sourced.
#   STATE/img/scratch-nK.img  -> btrfs at STATE/disks/nK/scratch   (node nK's local scratch)
#   STATE/img/xscratch-nK.img -> XFS (reflink) at STATE/disks/nK/xscratch (nK's second local class)
#   STATE/img/pfs.img         -> btrfs at STATE/mnt/pfs (the shared "parallel filesystem")
#   STATE/img/xfs.img         -> XFS (reflink) at STATE/mnt/xfs (a shared XFS)
# All are mounted in the machine room (the root namespace). Each node's mount
# namespace binds its own two disks at STATE/mnt/scratch and STATE/mnt/xscratch
# (lib-hosts.sh), the same paths on every node, as on a real cluster.
# Images are sparse: sizes are ceilings, not disk usage. XFS refuses < 300 MB.

fs_list() {
	local n
	for n in $NODES; do
		printf 'btrfs %s %s 256M\n' "$STATE/img/scratch-$n.img" "$STATE/disks/$n/scratch"
		printf 'xfs %s %s 320M\n' "$STATE/img/xscratch-$n.img" "$STATE/disks/$n/xscratch"
	done
	printf 'btrfs %s %s 512M\n' "$STATE/img/pfs.img" "$STATE/mnt/pfs"
	printf 'xfs %s %s 512M\n' "$STATE/img/xfs.img" "$STATE/mnt/xfs"
}

# Loop devices backed by an image, one per line.
loops_of() {
	losetup -n -O NAME -j "$1" 2>/dev/null || true
}

make_fs() {
	local type=$1 img=$2 size=$3
	[ -e "$img" ] && return 0
	truncate -s "$size" "$img.new"
	case $type in
	btrfs) mkfs.btrfs -q "$img.new" >/dev/null ;;
	xfs) mkfs.xfs -q -m reflink=1 "$img.new" >/dev/null ;;
	esac || die "mkfs.$type on $img failed"
	mv "$img.new" "$img"
}

# Directory layout inside each filesystem: users/ (1777, like /tmp) with one
# private directory per test user; the pfs also holds the barrier root.
prepare_tree() {
	local mnt=$1 u
	install -d -m 1777 "$mnt/users"
	for u in $TEST_USERS; do
		[ -d "$mnt/users/$u" ] || install -d -m 0755 -o "$u" -g "$(id -gn "$u")" "$mnt/users/$u"
	done
	if [ "$mnt" = "$STATE/mnt/pfs" ]; then
		# The Prolog creates per-job directories owned by the job's user.
		install -d -m 0755 -o root -g root "$mnt/.slurm-snap" "$mnt/.slurm-snap/barriers"
	fi
}

mount_all() {
	local type img mnt size dev
	# Mount points the hosts' namespaces bind onto; empty in the machine room.
	install -d -m 0755 "$STATE/img" "$STATE/mnt" "$STATE/mnt/scratch" "$STATE/mnt/xscratch" "$STATE/disks"
	while read -r type img mnt size; do
		make_fs "$type" "$img" "$size"
		install -d -m 0755 "$mnt"
		if ! mountpoint -q "$mnt"; then
			dev=$(loops_of "$img" | head -n 1)
			[ -n "$dev" ] || dev=$(losetup --find --show "$img") || die "losetup $img failed"
			mount -t "$type" "$dev" "$mnt" || { losetup -d "$dev"; die "mount $dev ($img) on $mnt failed"; }
		fi
		prepare_tree "$mnt"
	done < <(fs_list)
}

# Unmounts and detaches only what is backed by this state dir's images. Runs
# after the hosts' mount namespaces are gone: a namespace still holding a
# bind of a disk would keep its loop device busy.
unmount_all() {
	local type img mnt size dev i failed=""
	while read -r type img mnt size; do
		if mountpoint -q "$mnt" 2>/dev/null; then
			for i in 1 2 3 4 5 6 7 8 9 10; do
				umount "$mnt" 2>/dev/null && break
				sleep 0.5
			done
			if mountpoint -q "$mnt"; then
				log "cannot unmount $mnt (busy); processes using it:"
				ls -l /proc/[0-9]*/cwd 2>/dev/null | grep -F -- "$mnt" >&2 || true
				failed="$failed $mnt"
				continue
			fi
		fi
		[ -e "$img" ] || continue
		for dev in $(loops_of "$img"); do
			# The kernel may need a moment after the last unmount.
			for i in 1 2 3 4 5 6 7 8 9 10; do
				losetup -d "$dev" 2>/dev/null && break
				sleep 0.3
			done
			[ -z "$(loops_of "$img")" ] || { log "cannot detach $dev ($img)"; failed="$failed $dev"; }
		done
	done < <(fs_list)
	[ -z "$failed" ] || die "left behind:$failed"
}

status_fs() {
	local type img mnt size
	while read -r type img mnt size; do
		if mountpoint -q "$mnt" 2>/dev/null; then
			printf '  %-5s %s on %s\n' "$type" "$(findmnt -n -o SOURCE "$mnt" | head -n 1)" "$mnt"
		else
			printf '  %-5s %s not mounted\n' "$type" "$mnt"
		fi
	done < <(fs_list)
}
