/* Remote context (slurmstepd and the tasks it starts). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "slurm_snap.h"

static void start_requeue_watch(spank_t sp, uint32_t job, const char *barrier, const char *helper);

/*
 * Remote (slurmstepd, before the tasks start): give the job's tasks the
 * job-control variables under their own names (SLURM_SPANK_SLURM_SNAP_X ->
 * SLURM_SNAP_X), which is what the rank-side client reads. String copies
 * only: nothing here may block or fail a job.
 */
int snap_remote_user_init(spank_t sp, const char *helper)
{
	char **env = NULL;
	char *copies[MAX_RESULT_VARS + 8];
	char barrier[PATH_MAX];
	int n = 0;
	uint32_t job = 0, step = 0, nodeid = 1;
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
	/* A step that runs ranks (not the batch script, extern or interactive
	 * step), on its first node, where rank 0 runs under block distribution. */
	if (spank_get_item(sp, S_JOB_ID, &job) == ESPANK_SUCCESS &&
	    spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS && step < 0xfffffff0u &&
	    spank_get_item(sp, S_JOB_NODEID, &nodeid) == ESPANK_SUCCESS && nodeid == 0 &&
	    spank_getenv(sp, RESULT_PREFIX "BARRIER_DIR", barrier, sizeof(barrier)) == ESPANK_SUCCESS &&
	    barrier[0] == '/')
		start_requeue_watch(sp, job, barrier, helper);
	return 0;
}

/*
 * Early release for ranks that cannot run scontrol (a container: Slurm's
 * OCI, pyxis/enroot): rank 0 writes "asked" in its decision file
 * (client/early.py) and this helper, started outside the container on the
 * step's first node, decides and requeues with the node's scontrol
 * (`slurm-snap hook watch-requeue`, as the job's user). Only for jobs that
 * want an early requeue (the site's early release, or
 * --snapshot-before-timelimit). A grandchild (this process never waits for
 * it), in its own session, with SIGUSR1/SIGUSR2 ignored so the checkpoint
 * signal sent to the whole step does not end it. Until rank 0 writes a
 * decision for the run's epoch it only looks for the file every half second
 * (no Python is started for a step that is never preempted), and it ends
 * with slurmstepd.
 */
static void start_requeue_watch(spank_t sp, uint32_t job, const char *barrier, const char *helper)
{
	char early[8] = "", margin[16] = "", restart[16] = "0", bin[PATH_MAX] = "";
	char job_s[16], parent_s[16], epoch[40], conf_env[PATH_MAX + 16], bin_env[PATH_MAX + 32];
	char decision[PATH_MAX];
	char *argv[20], *envp[8];
	int n = 0, e = 0;
	pid_t child, parent = getpid();
	const char *slurm_conf = getenv("SLURM_CONF");

	spank_getenv(sp, RESULT_PREFIX "EARLY_RELEASE", early, sizeof(early));
	spank_getenv(sp, RESULT_PREFIX "TIMELIMIT_MARGIN", margin, sizeof(margin));
	if (strcmp(early, "1") && !margin[0])
		return;
	if (helper[0] != '/' || access(helper, X_OK))
		return;
	spank_getenv(sp, "SLURM_RESTART_COUNT", restart, sizeof(restart));
	spank_getenv(sp, RESULT_PREFIX "SLURM_BIN", bin, sizeof(bin));
	if (strspn(restart, "0123456789") != strlen(restart) || strspn(margin, "0123456789") != strlen(margin))
		return;
	snprintf(job_s, sizeof(job_s), "%u", job);
	snprintf(parent_s, sizeof(parent_s), "%d", (int) parent);
	snprintf(epoch, sizeof(epoch), "preempt-%s", restart[0] ? restart : "0");
	/* jobdir.early_path(): <barrier>/<job>/ack/early-<epoch>.decision */
	if (snprintf(decision, sizeof(decision), "%s/%u/ack/early-%s.decision", barrier, job, epoch) >=
	    (int) sizeof(decision))
		return;
	argv[n++] = (char *) helper;
	argv[n++] = "hook";
	argv[n++] = "watch-requeue";
	argv[n++] = "--job";
	argv[n++] = job_s;
	argv[n++] = "--epoch";
	argv[n++] = epoch;
	argv[n++] = "--barrier-dir";
	argv[n++] = (char *) barrier;
	argv[n++] = "--parent";
	argv[n++] = parent_s;
	if (margin[0]) {
		argv[n++] = "--margin";
		argv[n++] = margin;
	}
	argv[n++] = strcmp(early, "1") ? "--no-early-release" : "--early-release";
	argv[n] = NULL;
	envp[e++] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
	envp[e++] = "LANG=C.UTF-8";
	if (slurm_conf && slurm_conf[0] == '/' && strlen(slurm_conf) < PATH_MAX) {
		snprintf(conf_env, sizeof(conf_env), "SLURM_CONF=%s", slurm_conf);
		envp[e++] = conf_env;
	}
	if (bin[0] == '/') {
		snprintf(bin_env, sizeof(bin_env), RESULT_PREFIX "SLURM_BIN=%s", bin);
		envp[e++] = bin_env;
	}
	envp[e] = NULL;

	child = fork();
	if (child < 0) {
		slurm_debug(PREFIX "cannot start the requeue watch: fork failed");
		return;
	}
	if (child == 0) {
		/* Only async-signal-safe calls from here to execve (slurmstepd has threads). */
		int null_fd;
		uid_t uid = geteuid();
		gid_t gid = getegid();

		if (fork() != 0)
			_exit(0);
		setsid();
		if (setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
			_exit(126);
		null_fd = open("/dev/null", O_RDWR);
		if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0)
			_exit(126);
		closefrom(3);
		signal(SIGUSR1, SIG_IGN);
		signal(SIGUSR2, SIG_IGN);
		for (;;) {
			struct stat st;
			struct timespec pause = {0, 500 * 1000000L};

			/* As the job's user: EPERM while slurmstepd lives, ESRCH after. */
			if (kill(parent, 0) < 0 && errno == ESRCH)
				_exit(0);
			if (stat(decision, &st) == 0)
				break;
			nanosleep(&pause, NULL);
		}
		execve(helper, argv, envp);
		_exit(127);
	}
	while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
		;
}

/* What the nodes' Prologs left for the job's user; see slurm_snap/jobdir.py. */
#define PROLOG_SUBDIR "prolog"
#define NOTICE_MAX 2048       /* jobdir.MAX_NOTICE: bytes read of each node's file */
#define NOTICE_FILES 64       /* nodes named; the rest are counted */
/*
 * How long task 0 waits for the other nodes' Prologs. Slurm starts a step's
 * tasks on a node once that node's Prolog is done (PrologFlags=Alloc runs
 * every node's at allocation, side by side), so the others are normally a
 * few hundred ms behind at most; a node whose Prolog died before writing
 * its file costs each step this long, once, and is named.
 */
#define PROLOG_WAIT_MS 15000
#define PROLOG_POLL_MS 50

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *) a, *(char *const *) b);
}

/* One node's file, each line prefixed; control characters shown as '?'. */
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

/* A small non-negative integer from the job's environment, else `fallback`. */
static long job_env_number(spank_t sp, const char *name, long fallback)
{
	char buf[32], *end;
	long v;

	if (spank_getenv(sp, name, buf, sizeof(buf)) != ESPANK_SUCCESS || !buf[0])
		return fallback;
	v = strtol(buf, &end, 10);
	return (*end || v < 0) ? fallback : v;
}

/* Entries of the run's prolog directory that are nodes' files (not temporaries). */
static int count_files(const char *dir)
{
	int n = 0;
	struct dirent *e;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d;

	if (dfd < 0)
		return -1;
	if (!(d = fdopendir(dfd))) {
		close(dfd);
		return -1;
	}
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/*
 * Task context (the task itself, as the user, its stdio the job's output):
 * print what the nodes' Prologs left in <barrier dir>/<job>/prolog/<run>/ --
 * a declared volume they refused, so the job runs without its snapshots and
 * the user must hear of it. Each node's Prolog writes its file (empty when
 * all was well) when it is done; this waits, bounded, until every node of
 * the job has one, since a step can start on this node before another
 * node's Prolog has finished. Task 0 of each step only, so a step of many
 * ranks says it once. Bounded reads, no link followed, nothing here fails a task.
 */
int snap_remote_task_init(spank_t sp)
{
	char barrier[PATH_MAX], dir[PATH_MAX], node[256];
	char *names[NOTICE_FILES];
	uint32_t task = 1, job = 0;
	struct dirent *e;
	int n = 0, more = 0, dfd, len, have;
	long nodes, restart, deadline;
	struct stat st;
	DIR *d;

	if (spank_get_item(sp, S_TASK_GLOBAL_ID, &task) != ESPANK_SUCCESS || task != 0)
		return 0;
	if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS)
		return 0;
	/* Set by user_init for opted-in jobs only: everyone else stops here. */
	if (spank_getenv(sp, RESULT_PREFIX "BARRIER_DIR", barrier, sizeof(barrier)) != ESPANK_SUCCESS ||
	    barrier[0] != '/')
		return 0;
	/* The job's environment has SLURM_RESTART_COUNT from its first requeue on. */
	restart = job_env_number(sp, "SLURM_RESTART_COUNT", 0);
	nodes = job_env_number(sp, "SLURM_JOB_NUM_NODES", job_env_number(sp, "SLURM_NNODES", 1));
	len = snprintf(dir, sizeof(dir), "%s/%u/" PROLOG_SUBDIR "/%ld", barrier, job, restart);
	if (len < 0 || (size_t) len >= sizeof(dir))
		return 0;
	/*
	 * This node's Prolog was done before this task started: without its file
	 * the slurm-snap Prolog did not run here (or died before the barrier
	 * directory was usable), and no other node's is worth waiting for.
	 */
	if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof(node)) == ESPANK_SUCCESS && node[0] &&
	    !strchr(node, '/')) {
		char own[PATH_MAX];

		len = snprintf(own, sizeof(own), "%s/%s", dir, node);
		if (len > 0 && (size_t) len < sizeof(own) && lstat(own, &st) < 0) {
			dprintf(STDERR_FILENO, PREFIX "the Prolog on %s left no word for job %u (is the slurm-snap "
				"Prolog configured there?); its volumes there may be unprotected\n", node, job);
			return 0;
		}
	}
	deadline = now_ms() + PROLOG_WAIT_MS;
	while ((have = count_files(dir)) < nodes && now_ms() < deadline) {
		struct timespec pause = {0, PROLOG_POLL_MS * 1000000L};

		nanosleep(&pause, NULL);
	}
	if (have < nodes)
		dprintf(STDERR_FILENO, PREFIX "%ld of %ld nodes' Prologs had not finished after %d s; what they "
			"found is in `slurm-snap show %u`\n", nodes - (have < 0 ? 0 : have), nodes,
			PROLOG_WAIT_MS / 1000, job);
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return 0;
	}
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;   /* ".", "..", the Prologs' temporaries */
		/* Most nodes' files are empty (all was well): only the others are named. */
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
		    st.st_size == 0)
			continue;
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
