/*
 * Shared declarations of the slurm-snap SPANK plugin's parts:
 *   slurm_snap.c  option table, plugstack arguments, context dispatch
 *   checks.c      cheap option checks done in C before any exec
 *   helper.c      exec of `slurm-snap hook validate-options` (argv, timeout)
 *   local.c       sbatch/srun/salloc side: check, validate, export
 *   remote.c      slurmstepd side: copy job-control variables for the ranks;
 *                 start the requeue watch for ranks without scontrol;
 *                 in each step's task 0, print the Prologs' notices
 *   version_guard.c  loaded by another Slurm than built for: stay inert, say so
 */
#ifndef SLURM_SNAP_PLUGIN_H
#define SLURM_SNAP_PLUGIN_H

#include <limits.h>
#include <stddef.h>

#include <slurm/spank.h>

#ifndef SLURM_SNAP_VERSION
#define SLURM_SNAP_VERSION "unknown"
#endif

#define PREFIX "slurm-snap: "
#define MAX_ITEMS 256
#define MAX_ITEM_LEN 4096
#define HELPER_TIMEOUT_SECONDS 20
/* Enough for the helper's one-line message plus a traceback's tail. */
#define HELPER_STDERR_MAX 8192
/* The helper's result: a few SLURM_SNAP_*=VALUE lines. */
#define HELPER_STDOUT_MAX 16384
#define RESULT_PREFIX "SLURM_SNAP_"
#define MAX_RESULT_VARS 32
/* Job-control variables arrive in the job's environment with this prefix. */
#define JOB_ENV_PREFIX "SLURM_SPANK_"

/* What the user asked for and where the helper is (from plugstack.conf). */
struct snap_options {
	int given;            /* any slurm-snap option seen */
	int on_preempt;
	int independent;      /* --snapshot-independent-ranks */
	char *volumes;
	char *consistency;
	char *resume_cmd;
	char *every;          /* --snapshot-every, checked by the helper */
	char *timelimit;      /* --snapshot-before-timelimit MARGIN, checked by the helper */
	char helper[PATH_MAX];
	char config[PATH_MAX];
};

int snap_check_text(const char *option, const char *value, int allow_empty);
int snap_check_volumes(const char *list);
int snap_check_consistency(const char *value);

int snap_run_validate(const struct snap_options *o, char *out, size_t out_cap);

int snap_local_post_opt(spank_t sp, const struct snap_options *o);
int snap_remote_user_init(spank_t sp, const char *helper);
int snap_remote_task_init(spank_t sp);

int snap_version_mismatch(void);
void snap_version_refuse(spank_t sp, int loud);

#endif
