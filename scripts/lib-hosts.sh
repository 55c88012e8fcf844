# The hosts of the dev cluster: ctl, n1..nN (N=3 unless `up --nodes N`) and login, each a network
# namespace and a persistent mount namespace of its own. Sourced.
#
# Network: one bridge (br0) inside the switch namespace TAG-sw; each host's
# eth0 is a veth whose peer TAG-HOST is a port of that bridge. Nothing is
# added to the root namespace: the machine room (root ns) reaches the hosts
# only through nsenter, never over the network.
#
# Mount namespaces are files under STATE/ns (a private bind mount of itself,
# so the kernel lets nsfs be mounted there). Inside host H:
#   STATE/local          <- STATE/hosts/H         (its /etc, logs, run, spool)
#   /etc/hosts           <- STATE/hosts/H/etc/hosts (every host by name; the
#                           machine's host name as H's own address)
#   STATE/mnt/scratch    <- STATE/disks/H/scratch  (nodes: its own btrfs)
#   STATE/mnt/xscratch   <- STATE/disks/H/xscratch (nodes: its own XFS)
#   STATE/mnt/pfs, STATE/mnt/xfs                   (shared, every host)
#   STATE/mnt/zfs (with up --zfs)                  (shared, every host; mounts
#                           zfs-fuse makes below it propagate: lib-zfs.sh)
#   STATE/disks, STATE/hosts, STATE/img            (hidden: empty tmpfs)
#   /usr/local/bin/slurm-snap, /etc/slurm-snap/slurm-snap.toml  (README's admin
#                           steps 1-2: the venv's helper, the host's config)
# Daemons are started with nsenter --net --mount (ip netns exec would remount
# /sys and slurmd fails on /sys/fs/cgroup: ../shared/SLURM-LAB.md).

NS_DIR_REL=ns

# NODES comes from the node count (scripts/dev-cluster: --nodes, kept in the
# state dir so `down` and `status` see the same hosts); HOSTS follows it.
set_hosts() {
	HOSTS="ctl $NODES login"
}

# Names derived from the state dir, so two clusters never share one: TAG is
# 8 characters, which keeps "TAG-login" within the 15 of an interface name.
hosts_init() {
	local h n
	h=$(printf '%s' "$STATE" | sha256sum | cut -c1-6)
	TAG=ss$h
	n=$((16#${h:0:4}))
	# Addresses only matter inside this cluster's namespaces; a per-cluster
	# subnet still keeps two clusters' logs from looking alike.
	SUBNET=10.$((64 + n % 64)).$((n / 64 % 256))
	NS_DIR=$STATE/$NS_DIR_REL
	SWITCH_NS=$TAG-sw
}

host_addr() {
	case $1 in
	ctl) printf '%s.1\n' "$SUBNET" ;;
	n[0-9]*) printf '%s.%s\n' "$SUBNET" "$((10 + ${1#n}))" ;;
	login) printf '%s.100\n' "$SUBNET" ;;
	*) die "no address for host '$1'" ;;
	esac
}

netns_of() { printf '%s-%s\n' "$TAG" "$1"; }
netns_path() { printf '/run/netns/%s\n' "$(netns_of "$1")"; }
mntns_path() { printf '%s/%s\n' "$NS_DIR" "$1"; }
is_node() { case " $NODES " in *" $1 "*) return 0 ;; esac; return 1; }

# The one way to run a command on a host of the cluster (these scripts,
# `dev-cluster exec` for scripts/demo and the tests): inside the host's
# network and mount namespaces, with a clean environment (PATH, LANG and the
# NAME=VALUE words given before the command), as root or, with --user, as
# that user (runuser; HOME, USER and LOGNAME set as a login would), in
# --chdir DIR.
#   on_host [--user NAME] [--chdir DIR] HOST [NAME=VALUE...] COMMAND [ARG...]
on_host() {
	local user="" dir="" h
	local -a as=() env=(/usr/bin/env -i)
	while :; do
		case $1 in
		--user) user=$2; shift 2 ;;
		--chdir) dir=$2; shift 2 ;;
		*) break ;;
		esac
	done
	h=$1
	shift
	[ -n "$dir" ] && env+=("--chdir=$dir")
	env+=(PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8)
	if [ -n "$user" ]; then
		as=(/usr/sbin/runuser -u "$user" --)
		env+=("HOME=/home/$user" "USER=$user" "LOGNAME=$user")
	fi
	/usr/bin/nsenter --net="$(netns_path "$h")" --mount="$(mntns_path "$h")" -- "${as[@]}" "${env[@]}" "$@"
}

# A daemon on a host: spawn (lib-common.sh: clean env, no inherited lock or
# stdout) of the command inside the host's namespaces.
spawn_on() {
	local h=$1 logfile=$2
	shift 2
	spawn "$logfile" /usr/bin/nsenter --net="$(netns_path "$h")" --mount="$(mntns_path "$h")" -- "$@"
}

# The layout every client of the cluster reads (STATE/env, `dev-cluster
# layout`): where each host's namespaces, private tree and disks are, as the
# machine room (the root namespace) sees them, and the paths every host sees.
# Defined here once; tests/benchmarks (testkit/cluster.py) and scripts/demo
# read it instead of restating it.
layout_lines() {
	local h
	cat <<LAYOUT
SLURM_SNAP_STATE=$STATE
SLURM_SNAP_HOSTS=$(echo $HOSTS | tr ' ' ,)
SLURM_SNAP_NODES=$(echo $NODES | tr ' ' ,)
SLURM_SNAP_NETNS_TAG=$TAG
SLURM_SNAP_NS_DIR=$NS_DIR
SLURM_SNAP_PFS=$STATE/mnt/pfs
SLURM_SNAP_XFS=$STATE/mnt/xfs
SLURM_SNAP_SCRATCH=$STATE/mnt/scratch
SLURM_SNAP_XSCRATCH=$STATE/mnt/xscratch
SLURM_SNAP_LOCAL=$STATE/local
SLURM_SNAP_HOSTS_DIR=$STATE/hosts
SLURM_SNAP_DISKS=$STATE/disks
LAYOUT
	# The switch (the hosts' bridge) has a network namespace only.
	printf 'SLURM_SNAP_NETNS_sw=%s\n' "$(netns_path sw)"
	for h in $HOSTS; do
		printf 'SLURM_SNAP_NETNS_%s=%s\n' "$h" "$(netns_path "$h")"
		printf 'SLURM_SNAP_MNTNS_%s=%s\n' "$h" "$(mntns_path "$h")"
		# Seen inside the host at SLURM_SNAP_LOCAL.
		printf 'SLURM_SNAP_LOCAL_%s=%s\n' "$h" "$STATE/hosts/$h"
		printf 'SLURM_SNAP_ADDR_%s=%s\n' "$h" "$(host_addr "$h")"
	done
	for h in $NODES; do
		# Seen inside the node at SLURM_SNAP_SCRATCH and SLURM_SNAP_XSCRATCH.
		printf 'SLURM_SNAP_SCRATCH_%s=%s\n' "$h" "$STATE/disks/$h/scratch"
		printf 'SLURM_SNAP_XSCRATCH_%s=%s\n' "$h" "$STATE/disks/$h/xscratch"
	done
}

# Only the mount namespace (setting it up, before any network is needed).
in_mounts() {
	local h=$1
	shift
	/usr/bin/nsenter --mount="$(mntns_path "$h")" -- "$@"
}

netns_exists() { [ -e "/run/netns/$1" ]; }
mnt_ns_alive() { mountpoint -q "$(mntns_path "$1")" 2>/dev/null; }

# --- network ------------------------------------------------------------------
# A namespace of that name held by another state dir would be joined, not
# created: refuse (the registry names the owner).
claim_tag() {
	local owner
	install -d -m 0755 "$DEV_RUN_DIR/tags"
	if [ -r "$DEV_RUN_DIR/tags/$TAG" ]; then
		owner=$(cat "$DEV_RUN_DIR/tags/$TAG")
		[ "$owner" = "$STATE" ] || die "namespace tag $TAG is held by $owner; use another state dir"
	fi
	printf '%s\n' "$STATE" >"$DEV_RUN_DIR/tags/$TAG"
}

net_up() {
	local h ns port
	claim_tag
	netns_exists "$SWITCH_NS" || ip netns add "$SWITCH_NS"
	ip -n "$SWITCH_NS" link show br0 >/dev/null 2>&1 || ip -n "$SWITCH_NS" link add br0 type bridge
	ip -n "$SWITCH_NS" link set lo up
	ip -n "$SWITCH_NS" link set br0 up
	for h in $HOSTS; do
		ns=$(netns_of "$h")
		port=$TAG-$h
		netns_exists "$ns" || ip netns add "$ns"
		# Both ends are created inside namespaces: no interface ever appears
		# in the root namespace, even for a moment.
		ip -n "$SWITCH_NS" link show "$port" >/dev/null 2>&1 ||
			ip -n "$SWITCH_NS" link add "$port" type veth peer name eth0 netns "$ns"
		ip -n "$SWITCH_NS" link set "$port" master br0 up
		ip -n "$ns" addr replace "$(host_addr "$h")/24" dev eth0
		ip -n "$ns" link set lo up
		ip -n "$ns" link set eth0 up
	done
}

# Deleting a namespace destroys its veth end, and with it the peer on the bridge.
net_down() {
	local h ns
	for h in $HOSTS sw; do
		ns=$(netns_of "$h")
		netns_exists "$ns" || continue
		ip netns del "$ns" 2>/dev/null || log "warning: ip netns del $ns failed"
	done
	rm -f "$DEV_RUN_DIR/tags/$TAG"
}

# Inode of a namespace file: how processes are recognised as living in it.
ns_inode() { stat -L -c %i "$1" 2>/dev/null; }

# --- mount namespaces ---------------------------------------------------------
mnt_up() {
	local h
	install -d -m 0700 "$NS_DIR"
	if ! mountpoint -q "$NS_DIR"; then
		mount --bind "$NS_DIR" "$NS_DIR"
		mount --make-private "$NS_DIR"
	fi
	for h in $HOSTS; do
		mnt_ns_alive "$h" && continue
		: >"$(mntns_path "$h")"
		# private, or unchanged with --zfs (lib-zfs.sh says why)
		unshare --mount="$(mntns_path "$h")" --propagation "$(host_propagation)" /bin/true ||
			die "unshare --mount=$(mntns_path "$h") failed"
		host_mounts "$h"
	done
}

# Mount points, deepest first, that a new namespace copied from the machine
# room but must not keep: other clusters' and tests' loop filesystems (a copy
# would keep their loop devices busy after their own `down`), namespace files
# (a copy keeps that namespace alive), temporary mounts, and this cluster's
# own disks and namespace directory.
foreign_mounts() {
	local h=$1 keep1=$STATE/mnt/pfs keep2=$STATE/mnt/xfs
	in_mounts "$h" /bin/cat /proc/self/mountinfo | awk -v k1="$keep1" -v k2="$keep2" \
		-v own="$STATE/disks/$h/" -v state="$STATE/" -v nsdir="$NS_DIR" '
	{
		target = $5
		for (i = 7; $i != "-"; i++) ;
		fstype = $(i + 1); source = $(i + 2)
		gsub(/\\040/, " ", target)
		if (target == k1 || target == k2 || index(target, own) == 1) next
		if (fstype == "nsfs" || source ~ /^\/dev\/loop/ || target == nsdir ||
		    (index(target, "/tmp/") == 1 || index(target, "/var/tmp/") == 1) && index(target, state) != 1)
			print length(target) "\t" target
	}' | sort -rn | cut -f2-
}

# The names a site's DNS gives: every host by name, and the machine's own
# host name (which every namespace shares) as this host's address, so that a
# program binding to "my address" (gloo, torchrun's agent) gets this host's.
write_hosts_file() {
	local h=$1 other me
	me=$(uname -n)
	{
		printf '127.0.0.1\tlocalhost\n'
		printf '%s\t%s %s\n' "$(host_addr "$h")" "$h" "${me%%.*}"
		for other in $HOSTS; do
			[ "$other" = "$h" ] || printf '%s\t%s\n' "$(host_addr "$other")" "$other"
		done
	} >"$STATE/hosts/$h/etc/hosts"
	chmod 0644 "$STATE/hosts/$h/etc/hosts"
}

host_mounts() {
	local h=$1 target d
	zfs_host_mounts "$h"
	while IFS= read -r target; do
		in_mounts "$h" umount -l "$target" 2>/dev/null || log "warning: $h: cannot detach $target"
	done < <(foreign_mounts "$h")
	write_hosts_file "$h"
	in_mounts "$h" mount --bind "$STATE/hosts/$h/etc/hosts" /etc/hosts
	in_mounts "$h" mount --bind "$STATE/hosts/$h" "$STATE/local"
	if is_node "$h"; then
		in_mounts "$h" mount --bind "$STATE/disks/$h/scratch" "$STATE/mnt/scratch"
		in_mounts "$h" mount --bind "$STATE/disks/$h/xscratch" "$STATE/mnt/xscratch"
		in_mounts "$h" umount -l "$STATE/disks/$h/scratch" "$STATE/disks/$h/xscratch"
	fi
	admin_paths "$h"
	# The machine room's view of every disk and every host's private tree
	# stays in the machine room.
	for d in disks hosts img; do
		in_mounts "$h" mount -t tmpfs -o ro,size=16k,mode=0755 machine-room "$STATE/$d"
	done
}

# README's admin steps 1 and 2 on every host: the helper linked as
# /usr/local/bin/slurm-snap (users' PATH) and the host's configuration at the
# default path, so a user's plain `slurm-snap report` on login works as the
# user guide says. The machine's own /usr/local/bin stays visible under the
# link (a read-only overlay); /etc/slurm-snap is each host's own (a bind
# mount, which needs the empty directory on the machine as its mount point).
admin_paths() {
	local h=$1 bin=$STATE/etc/usr-local-bin
	install -d -m 0755 "$bin" "$STATE/hosts/$h/etc/slurm-snap" /etc/slurm-snap
	ln -sfn "$HELPER" "$bin/slurm-snap"
	# Absolute, as seen inside the host: STATE/local is its private tree.
	ln -sfn "$STATE/local/etc/slurm-snap.toml" "$STATE/hosts/$h/etc/slurm-snap/slurm-snap.toml"
	in_mounts "$h" mount -t overlay slurm-snap-bin -o "lowerdir=$bin:/usr/local/bin" /usr/local/bin ||
		die "$h: cannot put slurm-snap on /usr/local/bin (overlay)"
	in_mounts "$h" mount --bind "$STATE/hosts/$h/etc/slurm-snap" /etc/slurm-snap
}

# A namespace lives while a process is in it or its file is mounted: the
# processes go first (stop_host_processes), then the file.
mnt_down() {
	local h
	for h in $HOSTS; do
		if mnt_ns_alive "$h"; then
			umount "$(mntns_path "$h")" 2>/dev/null || umount -l "$(mntns_path "$h")" ||
				log "warning: cannot unmount $(mntns_path "$h")"
		fi
		rm -f "$(mntns_path "$h")"
	done
	if mountpoint -q "$NS_DIR" 2>/dev/null; then
		umount "$NS_DIR" 2>/dev/null || umount -l "$NS_DIR" || log "warning: cannot unmount $NS_DIR"
	fi
}

# PIDs of every process inside this cluster's network or mount namespaces
# (or those of the hosts named): ours by construction (daemons, jobs, hooks,
# sessions started in them).
host_pids() {
	local h ino pid link want=" " hosts=${*:-$HOSTS sw}
	for h in $hosts; do
		ino=$(ns_inode "$(netns_path "$h")") && want="$want net:[$ino] "
	done
	for h in $hosts; do
		[ "$h" = sw ] && continue
		mnt_ns_alive "$h" || continue
		ino=$(ns_inode "$(mntns_path "$h")") && want="$want mnt:[$ino] "
	done
	[ "$want" = " " ] && return 0
	for pid in /proc/[0-9]*; do
		pid=${pid#/proc/}
		for link in net mnt; do
			link=$(readlink "/proc/$pid/ns/$link" 2>/dev/null) || continue
			case $want in *" $link "*) printf '%s\n' "$pid"; break ;; esac
		done
	done
}

# A node "rebooted" (dev-cluster reboot): every process in its namespaces is
# killed at once, as a power cut would, and both namespaces are destroyed;
# net_up and mnt_up make them again. Its disks and its private tree
# (STATE/hosts/H: config, logs, the slurm-snap spool) stay, as a disk does.
host_power_off() {
	local h=$1 pids pid i alive
	pids=$(host_pids "$h" | tr '\n' ' ')
	if [ -n "${pids// /}" ]; then
		kill -KILL $pids 2>/dev/null || true
		for i in $(seq 1 50); do
			alive=""
			for pid in $pids; do running "$pid" && alive="$alive $pid"; done
			[ -n "$alive" ] || break
			sleep 0.1
		done
	fi
	# Its daemons are dead by construction; a killed one may linger as a
	# zombie with its name (pid_from_file would take it for alive).
	rm -f "$STATE/hosts/$h/run/"*.pid
	if mnt_ns_alive "$h"; then
		umount "$(mntns_path "$h")" 2>/dev/null || umount -l "$(mntns_path "$h")" || die "cannot unmount $(mntns_path "$h")"
	fi
	rm -f "$(mntns_path "$h")"
	netns_exists "$(netns_of "$h")" && ip netns del "$(netns_of "$h")"
	return 0
}

# After host_power_off and net_up: the host's new eth0 has a new MAC (a real
# NIC keeps its own across a reboot), so every other host forgets the old one
# rather than send to it until its neighbour entry expires.
host_forget_mac() {
	local h=$1 o
	for o in $HOSTS; do
		[ "$o" = "$h" ] && continue
		netns_exists "$(netns_of "$o")" && ip -n "$(netns_of "$o")" neigh flush to "$(host_addr "$h")" 2>/dev/null
	done
	return 0
}

# A host's link cut or restored at the switch (dev-cluster net): its eth0
# loses its carrier, packets to and from it go nowhere, its processes live on.
host_link() {
	ip -n "$SWITCH_NS" link set "$TAG-$1" "$2"
}

stop_host_processes() {
	local pids pid i alive
	pids=$(host_pids | tr '\n' ' ')
	[ -n "${pids// /}" ] || return 0
	log "terminating processes left in the cluster's namespaces: $pids"
	kill -TERM $pids 2>/dev/null || true
	for i in $(seq 1 30); do
		alive=""
		for pid in $pids; do running "$pid" && alive="$alive $pid"; done
		[ -n "$alive" ] || return 0
		sleep 0.1
	done
	log "KILL after 3 s:$alive"
	kill -KILL $alive 2>/dev/null || true
	pids=$alive
	for i in $(seq 1 30); do
		alive=""
		for pid in $pids; do running "$pid" && alive="$alive $pid"; done
		[ -n "$alive" ] || return 0
		sleep 0.1
	done
	log "warning: still alive after KILL:$alive"
}
