# Slurm side of the dev cluster: munge, slurm.conf, slurm-snap install, daemons. Sourced.
# slurm.conf, plugstack.conf, cli_filter.lua, the plugin and the hook entry
# points are shared by every host (as on a site with NFS or configless Slurm);
# each host's slurm-snap.toml, logs, spool and PID files are its own, under
# STATE/local (lib-hosts.sh).

GRACE_TIME=10       # low partition's GraceTime; also [protocol] grace, hence the cli_filter's signal time
# Requeued jobs restart after this many seconds; SLURM_SNAP_CRED_EXPIRE=default
# leaves Slurm's own (120 s; benchmarks/resume.py measures with it).
CRED_EXPIRE=${SLURM_SNAP_CRED_EXPIRE:-5}
case $CRED_EXPIRE in default | [0-9] | [0-9]*[0-9]) ;; *) die "SLURM_SNAP_CRED_EXPIRE=$CRED_EXPIRE: a number of seconds or 'default'" ;; esac
LOW_OVERSUBSCRIBE=4 # jobs per CPU on low: 3 nodes x 2 CPUs x 4 = 24 one-CPU jobs at once
PLUGIN_DIR_REL=lib
LIBEXEC_REL=libexec
CTLD_PORT=6817      # Slurm's defaults: every host has its own network namespace
SLURMD_PORT=6818

# Package mode (`up --package DEB`, remembered in STATE/etc/package): the
# machine runs slurm-snap from the installed package, as an admin's cluster
# does; otherwise from the checkout, built and installed into STATE.
PACKAGE_PREFIX=/usr/lib/slurm-snap
PACKAGE_LIBEXEC=/usr/libexec/slurm-snap
PACKAGE_SHARE=/usr/share/slurm-snap
PACKAGE_DEFAULTS=/etc/default/slurm-snap

package_mode() { [ -s "$STATE/etc/package" ]; }

slurm_paths() {
	SLURM_CONF=$STATE/etc/slurm.conf
	SNAP_CONFIG=$STATE/local/etc/slurm-snap.toml   # each host's own file, same path
	HELPER=$VENV/bin/slurm-snap
	package_mode && HELPER=$PACKAGE_PREFIX/venv/bin/slurm-snap
	CTLD_PID=$STATE/hosts/ctl/run/slurmctld.pid
}

# `apt-get install ./slurm-snap_*.deb` on the machine, as an admin would on
# each host (the hosts share the machine's /usr and /etc). The admin's
# conffiles this cluster changed are kept (--force-confold); package scripts
# start no daemon (policy-rc.d).
install_package() {
	local deb=$1 created_policy=""
	log "installing $(basename "$deb") on the machine (apt-get install; log: $STATE/log/apt.log)"
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		created_policy=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confold \
		install -y "$deb" </dev/null >>"$STATE/log/apt.log" 2>&1 || {
		[ -n "$created_policy" ] && rm -f /usr/sbin/policy-rc.d
		tail -n 20 "$STATE/log/apt.log" >&2
		die "apt-get install $deb failed (log: $STATE/log/apt.log)"
	}
	[ -n "$created_policy" ] && rm -f /usr/sbin/policy-rc.d
	return 0
}

slurmd_pidfile() { printf '%s/hosts/%s/run/slurmd.pid\n' "$STATE" "$1"; }

# --- munge: one munged per machine, shared by all clusters -----------------
# Its socket (/run/munge) is on the filesystem every host namespace shares.
# The registry lists the clusters that are up; munged is stopped with the last
# one, and only if this script started it.
munge_works() { /usr/bin/munge -n </dev/null 2>/dev/null | /usr/bin/unmunge >/dev/null 2>&1; }

ensure_munge() {
	local i
	install -d -m 0755 "$DEV_RUN_DIR/clusters"
	if ! munge_works; then
		install -d -o munge -g munge -m 0755 /run/munge
		[ -s /etc/munge/munge.key ] || die "/etc/munge/munge.key missing (reinstall the munge package)"
		# munged outlives this cluster: its output must not hold a file in STATE.
		# It refuses to run as root.
		spawn "$DEV_RUN_DIR/munged.out" runuser -u munge -- /usr/sbin/munged || die "munged failed to start"
		for i in $(seq 1 50); do munge_works && break; sleep 0.1; done
		munge_works || die "munged started but munge -n | unmunge fails"
		cp /run/munge/munged.pid "$DEV_RUN_DIR/munged.started"
		log "started munged (pid $(cat /run/munge/munged.pid))"
	fi
	printf '%s\n' "$STATE" >"$DEV_RUN_DIR/clusters/$(cluster_id)"
}

release_munge() {
	local entry other
	rm -f "$DEV_RUN_DIR/clusters/$(cluster_id)"
	# Entries of clusters whose slurmctld is gone (killed, machine reused)
	# must not keep munged alive forever. Single-host clusters (older
	# checkouts) keep their PID file in STATE/run.
	for entry in "$DEV_RUN_DIR"/clusters/*; do
		[ -f "$entry" ] || continue
		other=$(cat "$entry")
		pid_from_file "$other/hosts/ctl/run/slurmctld.pid" slurmctld >/dev/null ||
			pid_from_file "$other/run/slurmctld.pid" slurmctld >/dev/null || rm -f "$entry"
	done
	[ -n "$(ls -A "$DEV_RUN_DIR/clusters" 2>/dev/null)" ] && return 0
	[ -e "$DEV_RUN_DIR/munged.started" ] || return 0
	# Stop it only if it is still the munged we started.
	if [ "$(cat /run/munge/munged.pid 2>/dev/null)" = "$(cat "$DEV_RUN_DIR/munged.started")" ]; then
		stop_pidfile /run/munge/munged.pid munged
	fi
	rm -f "$DEV_RUN_DIR/munged.started"
}

cluster_id() { printf '%s' "$STATE" | sha256sum | cut -c1-16; }

# --- configuration ----------------------------------------------------------
# Slurm compares SlurmctldHost and NodeHostname with gethostname(): the hosts
# share the machine's UTS namespace, so both name the machine and the
# addresses in parentheses / NodeAddr say where each daemon really listens.
write_slurm_conf() {
	local me n
	slurm_paths
	me=$(uname -n)
	me=${me%%.*}
	install -d -m 0755 "$STATE/etc"
	{
		cat <<CONF
# Generated by scripts/dev-cluster for $STATE: ctl, n1..nN, login, each in its
# own network and mount namespace. Paths under $STATE/local are each host's own.
ClusterName=dev$TAG
SlurmctldHost=$me($(host_addr ctl))
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
$( [ "$CRED_EXPIRE" = default ] || printf 'AuthInfo=cred_expire=%s' "$CRED_EXPIRE")
StateSaveLocation=$STATE/local/state
SlurmdSpoolDir=$STATE/local/spool/slurmd
SlurmctldPidFile=$STATE/local/run/slurmctld.pid
SlurmdPidFile=$STATE/local/run/slurmd.pid
SlurmctldLogFile=$STATE/local/log/slurmctld.log
SlurmdLogFile=$STATE/local/log/slurmd.log
PlugStackConfig=$STATE/etc/plugstack.conf
# The chosen Slurm's own (Debian's binaries of 24.11/26.05 have /usr's compiled in).
PluginDir=$SLURM_PLUGIN_DIR
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=2
MinJobAge=30
# benchmarks/schedule.py measures squeue with 10,000 jobs queued; Slurm's
# default (10000) counts finished jobs too, so it could not hold them.
MaxJobCount=20000
CONF
		# What an admin merges from etc/, with this cluster's install paths and
		# the spellings of the running Slurm's version (one place decides them).
		if package_mode; then
			# The package's copy already names its entry points.
			sed -e '/^SlurmctldParameters=preempt_send_user_signal$/d' -e '/^#PreemptParameters=send_user_signal$/d' \
				"$PACKAGE_SHARE/slurm.conf.slurm-snap"
		else
			sed -e "s|/usr/local/libexec/slurm-snap|$STATE/$LIBEXEC_REL|g" -e '/^SlurmctldParameters=preempt_send_user_signal$/d' \
				-e '/^#PreemptParameters=send_user_signal$/d' "$REPO/etc/slurm.conf.slurm-snap"
		fi
		slurm_conf_version_lines "$SLURM_SNAP_SLURM"
		for n in $NODES; do
			printf 'NodeName=%s NodeHostname=%s NodeAddr=%s CPUs=2 RealMemory=2000 State=UNKNOWN\n' \
				"$n" "$me" "$(host_addr "$n")"
		done
		# low shares each CPU among LOW_OVERSUBSCRIBE jobs: the load tests run
		# and preempt 20 or more opted-in one-CPU jobs at once, which 3 nodes x 2
		# CPUs could not hold. high stays exclusive: its job preempts them all.
		cat <<CONF
PartitionName=low  Nodes=$NODE_RANGE Default=YES MaxTime=INFINITE State=UP PriorityTier=1  PreemptMode=REQUEUE GraceTime=$GRACE_TIME OverSubscribe=FORCE:$LOW_OVERSUBSCRIBE
PartitionName=high Nodes=$NODE_RANGE MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF
	} >"$SLURM_CONF.new"
	mv "$SLURM_CONF.new" "$SLURM_CONF"
	chmod 0644 "$SLURM_CONF"
	write_oci_conf
}

# Slurm's OCI containers (`srun --container=BUNDLE`): oci.conf beside
# slurm.conf, Debian's runc run rootless as the job's user. Its state goes
# under /tmp/slurm-oci-USER: 22.05 knows no %U (the uid; "fatal:
# _generate_pattern: unexpected replacement character: U" kills the step),
# which Slurm's own examples use for /run/user/%U, and no logind makes
# /run/user here. Not crun: 1.8.1 refuses this host's hybrid cgroups ("cgroups
# in hybrid mode not supported, drop all controllers from cgroupv2": hugetlb
# is on the v2 hierarchy), with --cgroup-manager=disabled too. Without runc
# there is no oci.conf and --container fails with Slurm's own message.
write_oci_conf() {
	local oci=$STATE/etc/oci.conf runc=/usr/bin/runc root='/tmp/slurm-oci-%u' id='%n.%u.%j.%s.%t'
	rm -f "$oci"
	[ -x "$runc" ] || return 0
	cat >"$oci" <<OCI
# Generated by scripts/dev-cluster: Slurm's OCI containers through runc, rootless.
RunTimeQuery="$runc --rootless=true --root=$root state $id"
RunTimeKill="$runc --rootless=true --root=$root kill -a $id"
RunTimeDelete="$runc --rootless=true --root=$root delete --force $id"
RunTimeRun="$runc --rootless=true --root=$root run --bundle %b $id"
OCI
	chmod 0644 "$oci"
}

# The inventory URL each host's config names (lib-inventory.sh sets
# INVENTORY_URL for ctl and NODE_INVENTORY_URL/LOGIN_INVENTORY_URL).
url_for_host() {
	case $1 in
	ctl) printf '%s\n' "$INVENTORY_URL" ;;
	login) printf '%s\n' "$LOGIN_INVENTORY_URL" ;;
	*) printf '%s\n' "$NODE_INVENTORY_URL" ;;
	esac
}

# One config per host from etc/slurm-snap.toml.dev (see its header).
write_snap_config() {
	local template h dest addresses="" n url mode
	slurm_paths
	template=$REPO/etc/slurm-snap.toml.dev
	[ -r "$template" ] || die "no $template"
	for n in $NODES; do addresses="$addresses$n = \"$(host_addr "$n")\"\\n"; done
	for h in $HOSTS; do
		dest=$STATE/hosts/$h/etc/slurm-snap.toml
		url=$(url_for_host "$h")
		{
			printf '# slurm-snap configuration of host %s of the dev cluster in %s,\n' "$h" "$STATE"
			printf '# rendered by scripts/dev-cluster from etc/slurm-snap.toml.dev.\n\n'
			# The template's header explains its placeholders: not this file's business.
			if [ "$h" = ctl ]; then
				sed -e '1,/^$/d' -e '/^# >>> ctl only/d' -e '/^# <<< ctl only/d' "$template"
			else
				sed -e '1,/^$/d' -e '/^# >>> ctl only/,/^# <<< ctl only/d' "$template"
			fi | if zfs_enabled; then
				sed -e '/^# >>> zfs only/d' -e '/^# <<< zfs only/d'
			else
				sed -e '/^# >>> zfs only/,/^# <<< zfs only/d'
			fi
			if [ "$h" = ctl ] && [ -n "${SERVICE_LISTEN:-}" ]; then
				printf '\n[service]\nlisten = "%s"\n' "$SERVICE_LISTEN"
			fi
		} | sed -e "s|@STATE@|$STATE|g" -e "s|@HOST@|$h|g" -e "s|@INVENTORY_URL@|$url|g" -e "s|@SLURM_BIN@|$SLURM_BIN|g" \
			-e "s|@GRACE@|$GRACE_TIME|g" -e "s|^@SSH_ADDRESSES@\$|${addresses%\\n}|" >"$dest.new"
		# A database password makes the file root's alone. Login's must stay
		# readable: sbatch runs the option check there as the submitting user.
		mode=0644
		case $url in *://*:*@*) mode=0600 ;; esac
		chmod "$mode" "$dest.new"
		mv "$dest.new" "$dest"
	done
}

# Installs slurm-snap into the cluster the way etc/README.md tells an admin to:
# one shared copy of the plugin and entry points (like /usr/local on NFS);
# the entry points name the config path every host has its own file at.
install_slurm_snap() {
	local f name record=foreground
	slurm_paths
	# PrologSlurmctld records in the background unless the config forbids it
	# (asked on ctl, where that hook runs).
	if [ "$(on_host ctl "$HELPER" --config "$SNAP_CONFIG" config get hooks.failure_policy)" != closed ] &&
		[ "$(on_host ctl "$HELPER" --config "$SNAP_CONFIG" config get hooks.record_in_background)" = true ]; then
		record=background
	fi
	if package_mode; then
		install_slurm_snap_from_package "$record"
		return 0
	fi
	# Against the chosen Slurm's headers (SLURM_INCLUDE, lib-slurm-version.sh).
	make -s -C "$REPO/spank" BUILDDIR="$STATE/build/spank" PLUGINDIR="$STATE/$PLUGIN_DIR_REL" \
		SLURM_INCLUDE="$SLURM_INCLUDE" install \
		>"$STATE/log/spank-build.log" 2>&1 || { cat "$STATE/log/spank-build.log" >&2; die "building the SPANK plugin failed"; }
	sed -e "s|/usr/local/lib/slurm-snap/|$STATE/$PLUGIN_DIR_REL/|" -e "s|helper=[^ ]*|helper=$HELPER|" \
		-e "s|config=[^ ]*|config=$SNAP_CONFIG|" \
		"$REPO/etc/plugstack.conf" >"$STATE/etc/plugstack.conf"
	# The signal and its time come from the configuration ([protocol], whose
	# grace is this cluster's GraceTime), as etc/README.md tells an admin.
	write_cli_filter "$REPO/etc/cli_filter.lua"
	install -d -m 0755 "$STATE/$LIBEXEC_REL"
	# Site overrides come from each host's own file (STATE/local/etc, absent
	# unless a test writes one), never from a package's /etc/default on the machine.
	for f in "$REPO"/prolog/slurm-snap-* "$REPO"/epilog/slurm-snap-*; do
		name=$(basename "$f")
		sed -e "s|^HELPER=.*|HELPER=$HELPER|" -e "s|^CONFIG=.*|CONFIG=$SNAP_CONFIG|" \
			-e "s|^RECORD=.*|RECORD=$record|" -e "s|^DEFAULTS=.*|DEFAULTS=$(dirname "$SNAP_CONFIG")/hooks.default|" \
			"$f" >"$STATE/$LIBEXEC_REL/$name.new"
		chmod 0755 "$STATE/$LIBEXEC_REL/$name.new"
		mv "$STATE/$LIBEXEC_REL/$name.new" "$STATE/$LIBEXEC_REL/$name"
	done
}

write_cli_filter() {
	# 25.11+: opted-in batch jobs ask for --requeue=expedite, which the
	# version's slurm.conf lines allow (the same decision, one place).
	local expedite=()
	slurm_conf_version_lines "$SLURM_SNAP_SLURM" | grep -q '^SlurmctldParameters=enable_expedited_requeue$' && expedite=(--expedite)
	on_host ctl "$HELPER" --config "$SNAP_CONFIG" config cli-filter "${expedite[@]}" "$1" \
		>"$STATE/etc/cli_filter.lua.new" || die "slurm-snap config cli-filter failed"
	mv "$STATE/etc/cli_filter.lua.new" "$STATE/etc/cli_filter.lua"
	chmod 0644 "$STATE/etc/plugstack.conf" "$STATE/etc/cli_filter.lua"
}

# The package's own files where an admin finds them: the plugin and helper of
# /etc/slurm-snap/plugstack.conf, the entry points in /usr/libexec (named by
# slurm.conf), their configuration path and recording mode in
# /etc/default/slurm-snap: nothing built or copied from the checkout.
install_slurm_snap_from_package() {
	local record=$1
	[ -x "$HELPER" ] && [ -r "$PACKAGE_PREFIX/slurm_snap.so" ] || die "the slurm-snap package is not installed"
	sed -e "s|config=[^ ]*|config=$SNAP_CONFIG|" /etc/slurm-snap/plugstack.conf >"$STATE/etc/plugstack.conf"
	write_cli_filter "$PACKAGE_SHARE/cli_filter.lua"
	printf 'CONFIG=%s\nRECORD=%s\n' "$SNAP_CONFIG" "$record" >"$PACKAGE_DEFAULTS"
}

# The inventory schema must exist before the first hook records anything.
init_inventory() {
	slurm_paths
	on_host ctl "$HELPER" --config "$SNAP_CONFIG" db upgrade \
		</dev/null >>"$STATE/hosts/ctl/log/db-upgrade.log" 2>&1 9>&- ||
		die "slurm-snap db upgrade on ctl failed (see $STATE/hosts/ctl/log/db-upgrade.log)"
}

write_env_file() {
	slurm_paths
	ssh_files
	{
		cat <<ENV
SLURM_CONF=$SLURM_CONF
SLURM_SNAP_CONFIG=$SNAP_CONFIG
SLURM_SNAP_HELPER=$HELPER
SLURM_SNAP_PACKAGE=$(cat "$STATE/etc/package" 2>/dev/null || true)
SLURM_SNAP_PYTHON=$PYTHON
SLURM_SNAP_SLURM=$SLURM_SNAP_SLURM
SLURM_SNAP_SLURM_BIN=$SLURM_BIN
SLURM_SNAP_LAYOUT=multi-host
SLURM_SNAP_INVENTORY=$INVENTORY
SLURM_SNAP_SERVICE=${SERVICE_LISTEN:-}
SLURM_SNAP_SSH_PORT=$SSH_PORT
SLURM_SNAP_SSH_KEY=$SSH_CLIENT_KEY
SLURM_SNAP_KNOWN_HOSTS=$SSH_KNOWN_HOSTS
SLURM_SNAP_TEST_USER=$TEST_USER
SLURM_SNAP_OTHER_USER=$OTHER_USER
SLURM_SNAP_GRACE=$GRACE_TIME
ENV
		layout_lines
	} >"$STATE/env.new"
	mv "$STATE/env.new" "$STATE/env"
	chmod 0644 "$STATE/env"
}

# --- daemons ----------------------------------------------------------------
# A client of the cluster on a host (login for a user's view, ctl for the
# admin's): on_host with what a login there gives, the cluster's Slurm first
# in PATH and its slurm.conf; SLURM_SNAP_SLURM_BIN as [slurm] bin_dir hands
# it to slurm_snap. `dev-cluster exec` is this, for the demo and the tests.
#   client_on [--user NAME] [--chdir DIR] HOST [NAME=VALUE...] COMMAND [ARG...]
client_on() {
	local -a opts=()
	while :; do
		case $1 in
		--user | --chdir) opts+=("$1" "$2"); shift 2 ;;
		*) break ;;
		esac
	done
	local h=$1
	shift
	on_host "${opts[@]}" "$h" SLURM_CONF="$SLURM_CONF" PATH="$SLURM_BIN:/usr/sbin:/usr/bin:/sbin:/bin" \
		SLURM_SNAP_SLURM_BIN="$SLURM_BIN" "$@"
}

daemons_all_up() {
	local n
	slurm_paths
	pid_from_file "$CTLD_PID" slurmctld >/dev/null || return 1
	for n in $NODES; do pid_from_file "$(slurmd_pidfile "$n")" slurmd >/dev/null || return 1; done
	for n in $NODES; do pid_from_file "$STATE/hosts/$n/run/sshd.pid" sshd >/dev/null || return 1; done
	for n in $NODES; do pid_from_file "$(node_agent_pidfile "$n")" slurm-snap >/dev/null || return 1; done
	inventory_running
}

# --- slurm-snap's node agents --------------------------------------------------
# The stand-in for etc/slurm-snap-node-agent.timer (this cluster has no
# systemd): on every node `slurm-snap node-agent --loop` runs one pass every
# NODE_AGENT_EVERY seconds (the timer's period is 30 s; shorter here, so the
# fault tests' figures are not the timer's), started and stopped by its PID
# file like the other daemons, and started again by `reboot` as a node's
# systemd would start the timer at boot.
NODE_AGENT_EVERY=5
node_agent_pidfile() { printf '%s/hosts/%s/run/slurm-snap-node-agent.pid\n' "$STATE" "$1"; }

start_node_agents() {
	local n i
	slurm_paths
	for n in ${1:-$NODES}; do
		pid_from_file "$(node_agent_pidfile "$n")" slurm-snap >/dev/null && continue
		spawn_on "$n" "$STATE/hosts/$n/log/slurm-snap-node-agent.log" /usr/bin/setsid -f \
			/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
			"$HELPER" --config "$SNAP_CONFIG" node-agent --loop "$NODE_AGENT_EVERY" \
			--pidfile "$STATE/local/run/slurm-snap-node-agent.pid"
	done
	for n in ${1:-$NODES}; do
		for i in $(seq 1 100); do
			pid_from_file "$(node_agent_pidfile "$n")" slurm-snap >/dev/null && break
			sleep 0.1
		done
		pid_from_file "$(node_agent_pidfile "$n")" slurm-snap >/dev/null ||
			die "the node agent on $n wrote no PID file (log: $STATE/hosts/$n/log/slurm-snap-node-agent.log)"
	done
}

stop_node_agents() {
	local n
	for n in ${1:-$NODES}; do stop_pidfile "$(node_agent_pidfile "$n")" slurm-snap; done
}

start_slurm() {
	local n
	slurm_paths
	install -d -m 0700 "$STATE/hosts/ctl/state"
	start_slurmctld
	for n in $NODES; do
		install -d -m 0755 "$STATE/hosts/$n/spool/slurmd"
		if ! pid_from_file "$(slurmd_pidfile "$n")" slurmd >/dev/null; then
			# -d: the chosen version's slurmstepd, not the one compiled in
			# (Debian's builds name /usr/sbin's, which is 22.05's here).
			spawn_on "$n" "$STATE/hosts/$n/log/slurmd.out" "$SLURM_SBIN/slurmd" -f "$SLURM_CONF" -N "$n" \
				-d "$SLURM_SBIN/slurmstepd" ||
				die "slurmd $n failed: $(tail -n 20 "$STATE/hosts/$n/log/slurmd.log" 2>/dev/null)"
		fi
	done
}

wait_nodes_idle() {
	local timeout=${1:-60} i states n
	slurm_paths
	# Responding is enough: after an unclean stop, recovered jobs may keep
	# nodes mixed/allocated for a while ("*" would mean not responding).
	for i in $(seq 1 $((timeout * 5))); do
		states=$(client_on login sinfo -h -N -o '%N=%T' 2>/dev/null | sort -u | tr '\n' ' ')
		if [ "$(printf '%s' "$states" | grep -Eo 'n[0-9]+=(idle|mixed|allocated|completing) ' | wc -l)" -eq "$NODE_COUNT" ] &&
			[ "$(printf '%s' "$states" | wc -w)" -eq "$NODE_COUNT" ]; then
			return 0
		fi
		sleep 0.2
	done
	log "nodes not ready after $timeout s: ${states:-sinfo answered nothing}"
	log "--- tail of ctl's slurmctld.log"
	tail -n 20 "$STATE/hosts/ctl/log/slurmctld.log" >&2 2>/dev/null || true
	for n in $NODES; do
		log "--- tail of $n's slurmd.log"
		tail -n 10 "$STATE/hosts/$n/log/slurmd.log" >&2 2>/dev/null || true
	done
	die "cluster in $STATE did not become ready"
}

# Jobs must end before the daemons stop: slurmstepd and the job's processes
# outlive slurmd and would keep the filesystems busy.
cancel_all_jobs() {
	local ids i
	slurm_paths
	pid_from_file "$CTLD_PID" slurmctld >/dev/null || return 0
	ids=$(client_on ctl squeue -h -o '%i' 2>/dev/null | tr '\n' ' ')
	[ -n "${ids// /}" ] || return 0
	log "cancelling jobs: $ids"
	client_on ctl scancel $ids 2>/dev/null || true
	for i in $(seq 1 100); do
		[ -z "$(client_on ctl squeue -h -o '%i' 2>/dev/null)" ] && return 0
		sleep 0.2
	done
	log "warning: jobs still listed after 20 s: $(client_on ctl squeue -h -o '%i %T' | tr '\n' ' ')"
}

stop_slurm() {
	local n
	slurm_paths
	for n in $NODES; do stop_pidfile "$(slurmd_pidfile "$n")" slurmd; done
	stop_pidfile "$CTLD_PID" slurmctld
}

start_slurmctld() {
	slurm_paths
	pid_from_file "$CTLD_PID" slurmctld >/dev/null && return 0
	spawn_on ctl "$STATE/hosts/ctl/log/slurmctld.out" "$SLURM_SBIN/slurmctld" -f "$SLURM_CONF" ||
		die "slurmctld failed: $(tail -n 20 "$STATE/hosts/ctl/log/slurmctld.log" 2>/dev/null)"
}
