# The inventory of the dev cluster, on ctl only. Sourced.
#   sqlite    STATE/local/var/inventory.db on ctl's local tree
#   postgres  a PostgreSQL inside ctl's namespaces on ctl's address (scripts/postgres)
#   mariadb   a MariaDB inside ctl's namespaces on ctl's address (scripts/mariadb)
# How the other hosts reach it: the slurm-snap service on ctl (`slurm-snap
# serve`, munge-authenticated) when the installed helper has it; until then
# nodes name the server database directly (with its password, so their config
# is root's alone) and login holds no credentials at all.
# Sets INVENTORY_URL (ctl), NODE_INVENTORY_URL, LOGIN_INVENTORY_URL, SERVICE_LISTEN.

SERVICE_PORT=6830

inventory_dir() {
	case $INVENTORY in
	postgres) printf '%s/local/pg\n' "$STATE" ;;
	mariadb) printf '%s/local/mariadb\n' "$STATE" ;;
	*) printf '%s/local/var\n' "$STATE" ;;
	esac
}

# The machine room's path of ctl's inventory directory.
inventory_dir_root() { printf '%s/hosts/ctl/%s\n' "$STATE" "$(inventory_dir | sed "s|^$STATE/local/||")"; }

# Remembers the choice: a later `up` or `down` of the same state dir agrees.
record_inventory_choice() {
	local was=""
	[ -r "$STATE/etc/inventory" ] && was=$(cat "$STATE/etc/inventory")
	if [ -n "$was" ] && [ -n "$INVENTORY_ARG" ] && [ "$was" != "$INVENTORY_ARG" ]; then
		die "$STATE was brought up with --inventory $was (not $INVENTORY_ARG); run 'down' and remove $STATE to change it"
	fi
	INVENTORY=${INVENTORY_ARG:-${was:-sqlite}}
	install -d -m 0755 "$STATE/etc"
	printf '%s\n' "$INVENTORY" >"$STATE/etc/inventory"
}

load_inventory_choice() {
	INVENTORY=sqlite
	[ -r "$STATE/etc/inventory" ] && INVENTORY=$(cat "$STATE/etc/inventory")
	return 0
}

inventory_packages() {
	case $INVENTORY in
	postgres) echo postgresql ;;
	mariadb) echo mariadb-server ;;
	esac
}

# Does the installed helper have the service? (It arrives from the lead's
# branch; this cluster switches to it by itself once it is there.)
helper_has_service() { "$HELPER" serve --help >/dev/null 2>&1; }

inventory_up() {
	local dir ctl_addr
	slurm_paths
	dir=$(inventory_dir)
	ctl_addr=$(host_addr ctl)
	case $INVENTORY in
	sqlite)
		install -d -m 0700 "$(inventory_dir_root)"
		INVENTORY_URL="sqlite:///$dir/inventory.db"
		;;
	postgres | mariadb)
		INVENTORY_URL=$(start_db) || die "$INVENTORY on ctl did not start (log: $(inventory_dir_root)/server.log)"
		;;
	*) die "unknown inventory '$INVENTORY' (sqlite, postgres or mariadb)" ;;
	esac
	SERVICE_LISTEN=""
	if helper_has_service; then
		SERVICE_LISTEN=$ctl_addr:$SERVICE_PORT
		NODE_INVENTORY_URL="slurm-snap://$SERVICE_LISTEN"
		LOGIN_INVENTORY_URL=$NODE_INVENTORY_URL
	elif [ "$INVENTORY" = sqlite ]; then
		# Known to fail until the service exists: SQLite is on ctl's disk
		# only. The URL names where the service will be, so hooks say so.
		NODE_INVENTORY_URL="slurm-snap://$ctl_addr:$SERVICE_PORT"
		LOGIN_INVENTORY_URL=$NODE_INVENTORY_URL
	else
		NODE_INVENTORY_URL=$INVENTORY_URL
		# No password on login (users read its config): reachable, not usable.
		LOGIN_INVENTORY_URL=$(printf '%s\n' "$INVENTORY_URL" | sed -E 's|://([^:@/]+):[^@/]*@|://\1@|')
	fi
}

# The database server alone (postgres, mariadb), inside ctl: the server binds
# ctl's address, its files are ctl's. Idempotent; prints its URL. `stop_db`
# and `start_db` are also `dev-cluster stop|start STATE inventory` (the fault
# tests restart the database during a cut).
start_db() {
	on_host ctl "$REPO/scripts/$INVENTORY" start "$(inventory_dir)" --listen "$(host_addr ctl)" \
		--port "$([ "$INVENTORY" = postgres ] && echo 5432 || echo 3306)" --subnet "$SUBNET.0/24" </dev/null 9>&-
}

stop_db() {
	mnt_ns_alive ctl && netns_exists "$(netns_of ctl)" &&
		on_host ctl "$REPO/scripts/$INVENTORY" stop "$(inventory_dir)" </dev/null 9>&- >/dev/null 2>&1 || true
}

inventory_running() {
	case $INVENTORY in
	postgres) pid_from_file "$(inventory_dir_root)/data/postmaster.pid" postgres >/dev/null ;;
	mariadb) pid_from_file "$(inventory_dir_root)/mariadbd.pid" mariadbd >/dev/null ;;
	esac || return 1
	[ -z "${SERVICE_LISTEN:-}" ] || pid_from_file "$STATE/hosts/ctl/run/slurm-snap-serve.pid" slurm-snap >/dev/null
}

# The URLs of a cluster that is already up (for `up` run twice).
inventory_urls_again() {
	local u
	INVENTORY_URL=$(sed -n 's/^url = "\(.*\)"$/\1/p' "$STATE/hosts/ctl/etc/slurm-snap.toml" | head -n 1)
	NODE_INVENTORY_URL=$(sed -n 's/^url = "\(.*\)"$/\1/p' "$STATE/hosts/n1/etc/slurm-snap.toml" | head -n 1)
	LOGIN_INVENTORY_URL=$(sed -n 's/^url = "\(.*\)"$/\1/p' "$STATE/hosts/login/etc/slurm-snap.toml" | head -n 1)
	u=$(sed -n 's/^listen = "\(.*\)"$/\1/p' "$STATE/hosts/ctl/etc/slurm-snap.toml" | head -n 1)
	SERVICE_LISTEN=$u
}

# `slurm-snap serve` on ctl as root, in the foreground of its own session.
start_service() {
	local pidfile=$STATE/local/run/slurm-snap-serve.pid i
	[ -n "${SERVICE_LISTEN:-}" ] || return 0
	slurm_paths
	pid_from_file "$STATE/hosts/ctl/run/slurm-snap-serve.pid" slurm-snap >/dev/null && return 0
	spawn_on ctl "$STATE/hosts/ctl/log/slurm-snap-serve.log" /usr/bin/setsid -f \
		/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
		"$HELPER" --config "$SNAP_CONFIG" serve --listen "$SERVICE_LISTEN" --pidfile "$pidfile"
	for i in $(seq 1 100); do
		pid_from_file "$STATE/hosts/ctl/run/slurm-snap-serve.pid" slurm-snap >/dev/null && return 0
		sleep 0.1
	done
	die "slurm-snap serve on ctl wrote no PID file (log: $STATE/hosts/ctl/log/slurm-snap-serve.log)"
}

stop_service() { stop_pidfile "$STATE/hosts/ctl/run/slurm-snap-serve.pid" slurm-snap; }

inventory_down() {
	stop_service
	case $INVENTORY in
	postgres | mariadb) stop_db ;;
	esac
	return 0
}

status_inventory() {
	local pid=""
	case $INVENTORY in
	sqlite) printf '  inventory sqlite %s/inventory.db (on ctl)\n' "$(inventory_dir)" ;;
	postgres) pid=$(pid_from_file "$(inventory_dir_root)/data/postmaster.pid" postgres) || pid="" ;;
	mariadb) pid=$(pid_from_file "$(inventory_dir_root)/mariadbd.pid" mariadbd) || pid="" ;;
	esac
	if [ "$INVENTORY" != sqlite ]; then
		if [ -n "$pid" ]; then
			printf '  inventory %s pid %s on %s\n' "$INVENTORY" "$pid" "$(host_addr ctl)"
		else
			printf '  inventory %s not running\n' "$INVENTORY"
			return 1
		fi
	fi
}
