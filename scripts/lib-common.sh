# Shared helpers for scripts/dev-cluster. Sourced, not executed.
# Everything here works from the state directory's PID files, registries and
# namespaces, never from process names, so two clusters on one host stay
# independent.

# Where machine-wide bookkeeping lives (munged ownership, cluster registry, namespace tags).
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

# Zombies wait for PID 1 to reap them: they count as gone.
running() {
	local rest
	[ -r "/proc/$1/stat" ] || return 1
	read -r rest 2>/dev/null <"/proc/$1/stat" || return 1
	rest=${rest##*) }
	[ "${rest%% *}" != Z ]
}

# Machine-wide lock: apt, pip, losetup, namespace tags and the munged refcount
# are shared by every cluster on the host. fd 9 must be closed in every daemon we start
# (see spawn) or the daemon would hold the lock forever.
take_lock() {
	install -d -m 0755 "$DEV_RUN_DIR"
	exec 9>"$DEV_RUN_DIR/lock"
	flock -w 600 9 || die "could not lock $DEV_RUN_DIR/lock within 600 s"
}

# Runs a daemon with a clean environment, no inherited descriptor and no tie
# to the caller's stdout (a test harness waiting for EOF would hang otherwise).
# Every descriptor above 2 is closed, not only this script's own lock (fd 9):
# `flock FILE scripts/dev-cluster up` hands its lock down as fd 3, and a
# munged or slurm-snap service that kept it held the machine's heavy-work
# lock for as long as it lived (seen: munged, shared by every cluster, kept
# every other run waiting after the cluster that started it was done).
spawn() {
	local logfile=$1
	shift
	(exec_daemon "$@" </dev/null >>"$logfile" 2>&1)
}

# Execs a daemon (in a subshell of the caller's) with a clean environment and
# every descriptor above 2 closed; its stdio is the caller's redirections.
exec_daemon() {
	local fd
	for fd in /proc/$BASHPID/fd/*; do
		fd=${fd##*/}
		[ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-"
	done
	exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
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
