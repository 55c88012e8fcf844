# Shared helpers for scripts/dev-cluster. Sourced, not executed.
# Everything here works from the state directory's PID files and registries,
# never from process names, so two clusters on one host stay independent.

# Where machine-wide bookkeeping lives (munged ownership, cluster registry).
DEV_RUN_DIR=/run/slurm-snap-dev

log() { printf 'dev-cluster: %s\n' "$*" >&2; }
die() { printf 'dev-cluster: error: %s\n' "$*" >&2; exit 1; }

# Prints the PID recorded in $1 if that process is alive and its comm is $2.
# A stale PID file (reused PID) must never make us signal a stranger.
pid_from_file() {
	local file=$1 name=$2 pid comm
	[ -r "$file" ] || return 1
	read -r pid 2>/dev/null <"$file" || return 1
	case $pid in '' | *[!0-9]*) return 1 ;; esac
	[ -r "/proc/$pid/comm" ] || return 1
	read -r comm 2>/dev/null <"/proc/$pid/comm" || return 1
	[ "$comm" = "$name" ] || return 1
	printf '%s\n' "$pid"
}

# Sends TERM to one recorded daemon, waits, then KILL; removes its PID file.
stop_pidfile() {
	local file=$1 name=$2 pid i
	if pid=$(pid_from_file "$file" "$name"); then
		log "stopping $name (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 1 100); do
			[ -d "/proc/$pid" ] || break
			sleep 0.1
		done
		if [ -d "/proc/$pid" ]; then
			log "$name (pid $pid) ignored TERM for 10 s: KILL"
			kill -KILL "$pid" 2>/dev/null || true
			sleep 0.2
		fi
	fi
	rm -f "$file"
}

# True if something accepts TCP connections on 127.0.0.1:$1.
port_in_use() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

block_busy() {
	local p
	for p in $(seq "$1" $(($1 + 5))); do
		port_in_use "$p" && return 0
	done
	return 1
}

# The state dir's port block: 6 consecutive ports. Derived from the path so
# two state dirs get different blocks without coordination; recorded on first
# use so later commands agree even if --port-base was given.
#   +0 slurmctld  +1 SlurmdPort (default)  +2..+4 slurmd n1..n3  +5 sshd
choose_ports() {
	local requested=$1 sum
	if [ -r "$STATE/etc/ports" ]; then
		PORT_BASE=$(sed -n 's/^PORT_BASE=//p' "$STATE/etc/ports")
		if [ -n "$requested" ] && [ "$requested" != "$PORT_BASE" ]; then
			die "$STATE already uses --port-base $PORT_BASE (not $requested); run 'down' and remove $STATE/etc/ports to change it"
		fi
	elif [ -n "$requested" ]; then
		PORT_BASE=$requested
	else
		sum=$(printf '%s' "$STATE" | cksum | cut -d' ' -f1)
		PORT_BASE=$((20000 + (sum % 1000) * 8))
		# Another cluster (or anything else) may hold the derived block: take
		# the next free one. Callers hold the machine lock until the daemons
		# are bound, so two concurrent `up`s cannot pick the same block.
		local tries=0
		while block_busy "$PORT_BASE"; do
			tries=$((tries + 1))
			[ $tries -lt 100 ] || die "no free block of 6 ports found near $PORT_BASE; use --port-base"
			PORT_BASE=$((20000 + ((PORT_BASE - 20000) / 8 + 1) % 1000 * 8))
		done
	fi
	case $PORT_BASE in '' | *[!0-9]*) die "bad port base '$PORT_BASE'" ;; esac
	[ "$PORT_BASE" -ge 1024 ] && [ "$PORT_BASE" -le 65000 ] || die "port base $PORT_BASE outside 1024..65000"
	CTLD_PORT=$PORT_BASE
	SLURMD_PORT=$((PORT_BASE + 1))
	NODE_PORT_FIRST=$((PORT_BASE + 2))
	NODE_PORT_LAST=$((PORT_BASE + 4))
	SSH_PORT=$((PORT_BASE + 5))
}

record_ports() {
	install -d -m 0755 "$STATE/etc"
	printf 'PORT_BASE=%s\n' "$PORT_BASE" >"$STATE/etc/ports"
}

# Machine-wide lock: apt, pip, losetup and the munged refcount are shared by
# every cluster on the host. fd 9 must be closed in every daemon we start
# (see spawn) or the daemon would hold the lock forever.
take_lock() {
	install -d -m 0755 "$DEV_RUN_DIR"
	exec 9>"$DEV_RUN_DIR/lock"
	flock -w 600 9 || die "could not lock $DEV_RUN_DIR/lock within 600 s"
}

# Runs a daemon with a clean environment, no inherited lock fd and no tie to
# the caller's stdout (a test harness waiting for EOF would hang otherwise).
spawn() {
	local logfile=$1
	shift
	env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@" </dev/null >>"$logfile" 2>&1 9>&-
}

# Paths end up in config files and sed expressions: keep them boring.
check_state_path() {
	case $1 in
	/*) ;;
	*) die "state dir '$1' must be absolute" ;;
	esac
	case $1 in
	*[!A-Za-z0-9._/-]*) die "state dir '$1' may contain only letters, digits, '.', '_', '-' and '/'" ;;
	esac
	case $1 in
	/root | /root/*) die "state dir '$1' is under /root, which the test user cannot reach" ;;
	esac
}
