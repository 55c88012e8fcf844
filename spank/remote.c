/* Remote context (slurmstepd). */
#include <stdlib.h>
#include <string.h>

#include "slurm_snap.h"

/*
 * Remote (slurmstepd, before the tasks start): give the job's tasks the
 * job-control variables under their own names (SLURM_SPANK_SLURM_SNAP_X ->
 * SLURM_SNAP_X), which is what the rank-side client reads. String copies
 * only: nothing here may block or fail a job.
 */
int snap_remote_user_init(spank_t sp)
{
	char **env = NULL;
	char *copies[MAX_RESULT_VARS + 8];
	int n = 0;
	size_t plen = strlen(JOB_ENV_PREFIX);

	if (spank_get_item(sp, S_JOB_ENV, &env) != ESPANK_SUCCESS || !env)
		return 0;
	/* Copy first: spank_setenv may reallocate the array being walked. */
	for (char **e = env; *e && n < (int) (sizeof(copies) / sizeof(copies[0])); e++) {
		if (!strncmp(*e, JOB_ENV_PREFIX RESULT_PREFIX, plen + strlen(RESULT_PREFIX)) &&
		    (copies[n] = strdup(*e + plen)))
			n++;
	}
	for (int i = 0; i < n; i++) {
		char *eq = strchr(copies[i], '=');

		if (eq) {
			*eq = '\0';
			if (spank_setenv(sp, copies[i], eq + 1, 1) != ESPANK_SUCCESS)
				slurm_debug(PREFIX "could not set %s in the job environment", copies[i]);
		}
		free(copies[i]);
	}
	return 0;
}
