/*
 * Local context (sbatch, salloc, srun): check the options, let the helper
 * validate them, then put them into the job-control environment that
 * Prolog/Epilog/PrologSlurmctld/EpilogSlurmctld see as SPANK_SLURM_SNAP*.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurm_snap.h"

static int export_env(spank_t sp, const char *name, const char *value)
{
	spank_err_t rc = spank_job_control_setenv(sp, name, value, 1);

	if (rc != ESPANK_SUCCESS) {
		slurm_error(PREFIX "cannot set job-control variable %s: %s", name, spank_strerror(rc));
		return -1;
	}
	return 0;
}

/*
 * The helper's stdout: SLURM_SNAP_NAME=VALUE lines (barrier dir, signal...)
 * the ranks need. They travel in the job-control environment, so they survive
 * requeue and --export=NONE; user_init copies them into the job's environment.
 */
static int export_result(spank_t sp, char *out)
{
	char *save = NULL;
	int count = 0;

	for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');
		size_t klen;

		if (!eq || strncmp(line, RESULT_PREFIX, strlen(RESULT_PREFIX)))
			continue; /* not a result line: ignore, never fail a submission on chatter */
		*eq = '\0';
		klen = strlen(line);
		if (klen > 64 || strspn(line, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != klen ||
		    snap_check_text(line, eq + 1, 1) < 0) {
			slurm_error(PREFIX "helper printed an unusable result line for '%.64s'", line);
			return -1;
		}
		/* The marker and the option variables are ours to set, not the helper's. */
		if (!strcmp(line, "SLURM_SNAP") || !strcmp(line, "SLURM_SNAP_ON_PREEMPT") ||
		    !strcmp(line, "SLURM_SNAP_VOLUMES") || !strcmp(line, "SLURM_SNAP_CONSISTENCY") ||
		    !strcmp(line, "SLURM_SNAP_RESUME_CMD") || !strcmp(line, "SLURM_SNAP_INDEPENDENT") ||
		    !strcmp(line, "SLURM_SNAP_EVERY") || !strcmp(line, "SLURM_SNAP_TIMELIMIT"))
			continue;
		if (++count > MAX_RESULT_VARS) {
			slurm_error(PREFIX "helper printed more than %d result lines", MAX_RESULT_VARS);
			return -1;
		}
		if (export_env(sp, line, eq + 1) < 0)
			return -1;
	}
	return 0;
}

int snap_local_post_opt(spank_t sp, const struct snap_options *o)
{
	char result[HELPER_STDOUT_MAX];

	if (!o->given)
		return 0;
	/*
	 * srun inside an existing allocation inherits the job's options through
	 * the environment: they were checked at submission and the job-control
	 * environment is the job's already. Checking again would start Python
	 * for every step and could fail a step of a job that was valid.
	 */
	if (spank_context() == S_CTX_LOCAL && getenv("SLURM_JOB_ID"))
		return 0;
	if (o->volumes && snap_check_volumes(o->volumes) < 0)
		return -1;
	if (o->consistency && snap_check_consistency(o->consistency) < 0)
		return -1;
	if (o->resume_cmd && snap_check_text("snapshot-resume-cmd", o->resume_cmd, 0) < 0)
		return -1;
	if (o->every && snap_check_text("snapshot-every", o->every, 0) < 0)
		return -1;
	if (o->timelimit && snap_check_text("snapshot-before-timelimit", o->timelimit, 0) < 0)
		return -1;
	if (snap_run_validate(o, result, sizeof(result)) < 0)
		return -1;
	if (export_env(sp, "SLURM_SNAP", "1") < 0)
		return -1;
	if (o->on_preempt && export_env(sp, "SLURM_SNAP_ON_PREEMPT", "1") < 0)
		return -1;
	/* The ranks read it as SLURM_SNAP_INDEPENDENT (remote.c's copy). */
	if (o->independent && export_env(sp, "SLURM_SNAP_INDEPENDENT", "1") < 0)
		return -1;
	if (o->volumes && export_env(sp, "SLURM_SNAP_VOLUMES", o->volumes) < 0)
		return -1;
	if (export_env(sp, "SLURM_SNAP_CONSISTENCY", o->consistency ? o->consistency : "app") < 0)
		return -1;
	if (o->resume_cmd && export_env(sp, "SLURM_SNAP_RESUME_CMD", o->resume_cmd) < 0)
		return -1;
	if (o->every && export_env(sp, "SLURM_SNAP_EVERY", o->every) < 0)
		return -1;
	/* The hooks read it as SPANK_SLURM_SNAP_TIMELIMIT; the ranks read the
	 * helper's SLURM_SNAP_TIMELIMIT_MARGIN (seconds). */
	if (o->timelimit && export_env(sp, "SLURM_SNAP_TIMELIMIT", o->timelimit) < 0)
		return -1;
	if (export_result(sp, result) < 0)
		return -1;
	slurm_debug(PREFIX "version %s: options accepted", SLURM_SNAP_VERSION);
	return 0;
}
