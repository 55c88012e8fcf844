/*
 * slurm-snap SPANK plugin: adds the --snapshot-* options to sbatch/srun/salloc.
 *
 * The plugin is deliberately thin (see docs/contracts.md):
 *   - slurm_spank_init registers the options (sbatch ignores a static
 *     spank_options[] table, so registration must be dynamic);
 *   - in local/allocator context (sbatch, srun, salloc) it runs cheap checks
 *     in C, then execs the Python helper's `hook validate-options` so that bad
 *     input fails at submit time, and exports the values into the job-control
 *     environment that Prolog/Epilog (and their slurmctld variants) receive as
 *     SPANK_SLURM_SNAP*;
 *   - in remote context (slurmstepd) it only copies those variables into the
 *     tasks' environment under the names the rank-side client reads, and in
 *     each step's first task prints what a node's Prolog left for the user
 *     (a refused volume); the real work is done by the Prolog/Epilog entry
 *     points, never inside slurmstepd.
 *
 * This file holds the option table and the context dispatch; see
 * slurm_snap.h for the other parts. Every message is prefixed "slurm-snap:".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurm_snap.h"

/* SPANK_PLUGIN(slurm-snap, 1) without its const plugin_version, which
 * version_guard.c defines: it may present the loader's release instead. */
const char plugin_name[] = "slurm-snap";
const char plugin_type[] = "spank";
const unsigned int spank_plugin_version = 1;

enum opt_id {
	OPT_ON_PREEMPT = 1,
	OPT_VOLUMES,
	OPT_CONSISTENCY,
	OPT_RESUME_CMD,
	OPT_INDEPENDENT,
	OPT_EVERY,
	OPT_TIMELIMIT,
};

/*
 * Option callbacks get no spank handle, so the parsed values have to live in
 * file-scope state; it is only written by option callbacks and read in
 * init_post_opt of the same process.
 */
static struct snap_options ctx;

static int opt_cb(int val, const char *optarg, int remote);

static struct spank_option options[] = {
	{ "snapshot-on-preempt", NULL,
	  "Snapshot the job's declared volumes when the job is preempted "
	  "(ranks get SIGUSR1 and checkpoint first).",
	  0, OPT_ON_PREEMPT, opt_cb },
	{ "snapshot-volumes", "V[,V...]",
	  "Volumes to snapshot: volume class names (e.g. scratch,pfs: a volume "
	  "per job) or absolute paths of volumes inside a class that its "
	  "backend can snapshot alone (on btrfs: a subvolume).",
	  1, OPT_VOLUMES, opt_cb },
	{ "snapshot-consistency", "app|crash",
	  "app (default): wait for every rank's checkpoint acknowledgement; "
	  "crash: cut without waiting.",
	  1, OPT_CONSISTENCY, opt_cb },
	{ "snapshot-resume-cmd", "CMD",
	  "Command recorded with the job that restore drills run to check a "
	  "snapshot can be resumed from.",
	  1, OPT_RESUME_CMD, opt_cb },
	{ "snapshot-independent-ranks", NULL,
	  "The ranks checkpoint independently (no shared model): ranks at "
	  "different steps still make an app-consistent set.",
	  0, OPT_INDEPENDENT, opt_cb },
	{ "snapshot-every", "DURATION",
	  "Also snapshot the job's declared volumes every DURATION while it "
	  "runs (e.g. 30m, 2h; the site may raise it to a partition minimum).",
	  1, OPT_EVERY, opt_cb },
	{ "snapshot-before-timelimit", "MARGIN",
	  "Checkpoint, snapshot and requeue the job at least MARGIN (e.g. 5m, "
	  "90s) before its time limit (the site's cli_filter asks Slurm for "
	  "the signal; give no --signal of your own).",
	  1, OPT_TIMELIMIT, opt_cb },
	SPANK_OPTIONS_TABLE_END
};

static int set_string(char **slot, const char *value)
{
	char *copy = strdup(value ? value : "");

	if (!copy) {
		slurm_error(PREFIX "out of memory");
		return -1;
	}
	free(*slot);
	*slot = copy;
	return 0;
}

static int opt_cb(int val, const char *optarg, int remote)
{
	/* Values are re-read and acted upon by the hooks, not in slurmstepd. */
	if (remote)
		return 0;
	ctx.given = 1;
	switch (val) {
	case OPT_ON_PREEMPT:
		ctx.on_preempt = 1;
		return 0;
	case OPT_VOLUMES:
		return set_string(&ctx.volumes, optarg);
	case OPT_CONSISTENCY:
		return set_string(&ctx.consistency, optarg);
	case OPT_RESUME_CMD:
		return set_string(&ctx.resume_cmd, optarg);
	case OPT_INDEPENDENT:
		ctx.independent = 1;
		return 0;
	case OPT_EVERY:
		return set_string(&ctx.every, optarg);
	case OPT_TIMELIMIT:
		return set_string(&ctx.timelimit, optarg);
	}
	return -1;
}

static int is_local(void)
{
	spank_context_t c = spank_context();

	return c == S_CTX_LOCAL || c == S_CTX_ALLOCATOR;
}

/*
 * plugstack.conf arguments: helper=ABS config=ABS. The checkpoint signal and
 * its time are not the plugin's: slurm-snap.toml [protocol] is their one
 * source (cli_filter.lua is written from it). signal= and grace= of older
 * lines still load, so an upgrade cannot fail every job; they are ignored,
 * said at verbose level, and `slurm-snap doctor` asks to remove them.
 */
static int parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		const char *a = av[i];
		char *slot = NULL;

		if (!strncmp(a, "helper=", 7))
			slot = ctx.helper;
		else if (!strncmp(a, "config=", 7))
			slot = ctx.config;
		if (slot) {
			const char *v = a + 7;

			if (v[0] != '/' || strlen(v) >= PATH_MAX) {
				slurm_error(PREFIX "plugstack.conf argument '%s' must be an absolute path", a);
				return -1;
			}
			strcpy(slot, v);
			continue;
		}
		if (!strncmp(a, "signal=", 7) || !strncmp(a, "grace=", 6)) {
			slurm_verbose(PREFIX "plugstack.conf argument '%s' is no longer read "
				      "(slurm-snap.toml [protocol] names the signal); remove it", a);
			continue;
		}
		slurm_error(PREFIX "unknown plugstack.conf argument '%s' (expected helper=, config=)", a);
		return -1;
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	/* Options must be registered in every context or remote parsing fails. */
	for (struct spank_option *o = options; o->name; o++) {
		if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
			slurm_error(PREFIX "cannot register option --%s", o->name);
			return -1;
		}
	}
	if (snap_version_mismatch()) {
		/* Built for another Slurm: inert everywhere (version_guard.c). */
		snap_version_refuse(sp, spank_context() == S_CTX_SLURMD);
		return 0;
	}
	if (parse_args(ac, av) < 0)
		/* A bad plugstack line must not break jobs on the nodes. */
		return is_local() ? -1 : 0;
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (snap_version_mismatch()) {
		if (!is_local() || !ctx.given)
			return 0;
		snap_version_refuse(sp, 1);   /* the submission that asked: refused, with why */
		return -1;
	}
	return is_local() ? snap_local_post_opt(sp, &ctx) : 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return spank_remote(sp) == 1 && !snap_version_mismatch() ? snap_remote_user_init(sp, ctx.helper) : 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	return spank_remote(sp) == 1 && !snap_version_mismatch() ? snap_remote_task_init(sp) : 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void) sp;
	(void) ac;
	(void) av;
	free(ctx.volumes);
	free(ctx.consistency);
	free(ctx.resume_cmd);
	free(ctx.every);
	free(ctx.timelimit);
	ctx.volumes = ctx.consistency = ctx.resume_cmd = ctx.every = ctx.timelimit = NULL;
	return 0;
}
