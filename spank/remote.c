/* Remote context (slurmstepd and the tasks it starts). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* What the nodes' Prologs left for the job's user; see slurm_snap/jobdir.py. */
#define NOTICE_SUBDIR "notice"
#define NOTICE_MAX 2048       /* jobdir.MAX_NOTICE: bytes read of each node's file */
#define NOTICE_FILES 64       /* nodes named; the rest are counted */

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* One node's notice, each line prefixed; control characters shown as '?'. */
static void print_notice(int dfd, const char *name)
{
	char buf[NOTICE_MAX + 1];
	struct stat st;
	ssize_t n;
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0)
		return;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (n = read(fd, buf, NOTICE_MAX)) <= 0) {
		close(fd);
		return;
	}
	close(fd);
	buf[n] = '\0';
	for (char *line = buf, *end; line && *line; line = end ? end + 1 : NULL) {
		end = strchr(line, '\n');
		if (end)
			*end = '\0';
		for (char *c = line; *c; c++)
			if ((unsigned char) *c < 0x20 || *c == 0x7f)
				*c = '?';
		if (*line)
			dprintf(STDERR_FILENO, PREFIX "%s\n", line);
	}
}

/*
 * Task context (the task itself, as the user, its stdio the job's output):
 * print what the nodes' Prologs left in <barrier dir>/<job>/notice/ -- a
 * declared volume they refused, so the job runs without its snapshots and
 * the user must hear of it. Task 0 of each step only, so a step of many ranks
 * says it once. Bounded reads, no link followed, nothing here can fail a task.
 */
int snap_remote_task_init(spank_t sp)
{
	char barrier[PATH_MAX], dir[PATH_MAX];
	char *names[NOTICE_FILES];
	uint32_t task = 1, job = 0;
	struct dirent *e;
	int n = 0, more = 0, dfd, len;
	DIR *d;

	if (spank_get_item(sp, S_TASK_GLOBAL_ID, &task) != ESPANK_SUCCESS || task != 0)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
		return 0;
	/* Set by user_init for opted-in jobs only: everyone else stops here. */
	if (spank_getenv(sp, RESULT_PREFIX "BARRIER_DIR", barrier, sizeof(barrier)) != ESPANK_SUCCESS ||
	    barrier[0] != '/')
		return 0;
	len = snprintf(dir, sizeof(dir), "%s/%u/" NOTICE_SUBDIR, barrier, job);
	if (len < 0 || (size_t) len >= sizeof(dir))
		return 0;
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return 0;   /* no notice: every volume was prepared */
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return 0;
	}
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;   /* ".", "..", the Prolog's temporaries */
		if (n == NOTICE_FILES || !(names[n] = strdup(e->d_name))) {
			more++;
			continue;
		}
		n++;
	}
	qsort(names, n, sizeof(names[0]), by_name);
	for (int i = 0; i < n; i++) {
		print_notice(dirfd(d), names[i]);
		free(names[i]);
	}
	if (more)
		dprintf(STDERR_FILENO, PREFIX "and %d more nodes' notices in %s\n", more, dir);
	closedir(d);
	return 0;
}
