# The optional ZFS class of the dev cluster (`up --zfs`): a zfs-fuse pool
# shared by every host at STATE/mnt/zfs. Sourced.
#
# Why the pool is mounted before the hosts exist, under a shared mount:
# zfs-fuse is one daemon per machine (fixed socket /var/run/zfs/zfs_socket),
# and it makes every mount itself, in its own mount namespace: the machine
# room's. The hosts' mount namespaces are copies made at `up`; a mount made
# in the machine room later (the Prolog's `zfs create` of a per-job dataset,
# a drill's `zfs clone`) would never show in them. So STATE/mnt/zfs is a
# bind of itself made shared before the pool is mounted on it, and with
# --zfs the hosts' namespaces are made with --propagation unchanged, which
# keeps their copy of it in the same peer group: every mount zfs-fuse makes
# below STATE/mnt/zfs appears on every host, as a shared filesystem's do on
# a real cluster. Peers, not slaves: zfs-fuse's `zfs destroy` unmounts in
# the caller's namespace, and run on ctl (a drill removing its clone) an
# unmount in a slave never reached the daemon's mount, and the dataset
# stayed "busy" for good (measured). Every other mount the machine room
# shares (e.g. /run/netns) is made private in each host before anything is
# unmounted there, so nothing a host does reaches the machine room but the
# pool's mounts. Without --zfs nothing here runs and the hosts stay
# --propagation private.
#
# The class is shared scope, cut once by the coordinator on ctl. Any host
# runs the zfs CLI: the daemon's socket is a path, reachable from every
# network namespace. Per-job volumes are datasets POOL/jobs/JOBID, so
# STATE/mnt/zfs/jobs is itself a dataset (the zfs backend's create_volume
# makes a child of the dataset mounted at the parent directory).

ZFS_IMG_SIZE=256M

zfs_paths() {
	ZFS_POOL=${TAG}z
	ZFS_MNT=$STATE/mnt/zfs
	ZFS_IMG=$STATE/img/zfs.img
	ZFS_PID=$STATE/etc/zfs-fuse.pid
}

zfs_enabled() { [ -e "$STATE/etc/zfs" ]; }

zfs_answers() { timeout 10 /usr/sbin/zpool list -H -o name </dev/null >/dev/null 2>&1; }

zfs_up() {
	local i
	zfs_paths
	: >"$STATE/etc/zfs"
	if ! zfs_answers; then
		log "starting zfs-fuse (one per machine; stopped at down if no other pool is left)"
		# -n: foreground, and the subshell execs it, so $! is the daemon's PID;
		# no kstat mount left behind; no inherited lock (exec_daemon).
		(exec_daemon /usr/sbin/zfs-fuse -n --no-kstat-mount </dev/null >>"$STATE/log/zfs-fuse.log" 2>&1) &
		printf '%s\n' "$!" >"$ZFS_PID"
		for i in $(seq 1 150); do
			zfs_answers && break
			sleep 0.2
		done
		zfs_answers || die "zfs-fuse did not answer within 30 s (log: $STATE/log/zfs-fuse.log)"
	fi
	install -d -m 0755 "$ZFS_MNT"
	if ! findmnt -rn -o PROPAGATION --target "$ZFS_MNT" --mountpoint "$ZFS_MNT" 2>/dev/null | grep -q shared; then
		mountpoint -q "$ZFS_MNT" || mount --bind "$ZFS_MNT" "$ZFS_MNT"
		mount --make-shared "$ZFS_MNT"
	fi
	if ! /usr/sbin/zpool list -H -o name "$ZFS_POOL" >/dev/null 2>&1; then
		[ -e "$ZFS_IMG" ] || truncate -s "$ZFS_IMG_SIZE" "$ZFS_IMG"
		/usr/sbin/zpool create -f -m "$ZFS_MNT" "$ZFS_POOL" "$ZFS_IMG" >>"$STATE/log/zfs-fuse.log" 2>&1 ||
			die "zpool create $ZFS_POOL on $ZFS_IMG failed (log: $STATE/log/zfs-fuse.log)"
	fi
	/usr/sbin/zfs list -H -o name "$ZFS_POOL/jobs" >/dev/null 2>&1 || /usr/sbin/zfs create "$ZFS_POOL/jobs" ||
		die "zfs create $ZFS_POOL/jobs failed"
	prepare_tree "$ZFS_MNT"
}

# After the hosts' namespaces are gone (their slave copies of the mounts
# with them): the pool, the shared bind, and the daemon if we started it
# and it serves no other pool.
zfs_down() {
	local i pid
	zfs_enabled || return 0
	zfs_paths
	if zfs_answers && /usr/sbin/zpool list -H -o name "$ZFS_POOL" >/dev/null 2>&1; then
		# "pool is busy" while FUSE unmounts of just-destroyed datasets finish.
		for i in $(seq 1 20); do
			/usr/sbin/zpool destroy -f "$ZFS_POOL" 2>/dev/null && break
			sleep 0.25
		done
		/usr/sbin/zpool list -H -o name "$ZFS_POOL" >/dev/null 2>&1 && log "warning: zpool destroy $ZFS_POOL failed"
	fi
	while mountpoint -q "$ZFS_MNT" 2>/dev/null; do
		umount "$ZFS_MNT" 2>/dev/null || { log "warning: cannot unmount $ZFS_MNT"; break; }
	done
	if pid=$(pid_from_file "$ZFS_PID" zfs-fuse); then
		if [ -z "$(/usr/sbin/zpool list -H -o name 2>/dev/null)" ]; then
			stop_pidfile "$ZFS_PID" zfs-fuse
		else
			log "zfs-fuse (pid $pid) left running: it serves other pools"
		fi
	fi
	rm -f "$STATE/etc/zfs"
}

# Propagation of the hosts' mount namespaces: see the top of this file.
host_propagation() { if zfs_enabled; then echo unchanged; else echo private; fi; }

# With --propagation unchanged every mount the machine room shares is shared
# with the new host too; only the pool's are meant to be: the others go
# private, before host_mounts unmounts anything (an unmount of a shared
# copy would reach the machine room). A host that cannot is not used.
zfs_host_mounts() {
	local h=$1 target left
	zfs_enabled || return 0
	zfs_paths
	while IFS= read -r target; do
		in_mounts "$h" mount --make-private "$target" || die "$h: cannot make $target private"
	done < <(zfs_foreign_shared "$h")
	left=$(zfs_foreign_shared "$h")
	[ -z "$left" ] || die "$h: still shared with the machine room: $left"
}

zfs_foreign_shared() {
	in_mounts "$1" findmnt -rn -o TARGET,PROPAGATION |
		awk -v z="$ZFS_MNT" '$2 ~ /shared|slave/ && $1 != z && index($1, z "/") != 1 {print $1}'
}
