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
 *   - in remote context (slurmstepd, slurmd) it does nothing: the real work is
 *     done by the Prolog/Epilog entry points, never inside slurmstepd.
 *
 * Every message is prefixed "slurm-snap:".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

#ifndef SLURM_SNAP_VERSION
#define SLURM_SNAP_VERSION "unknown"
#endif

SPANK_PLUGIN(slurm-snap, 1)

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

enum opt_id {
	OPT_ON_PREEMPT = 1,
	OPT_VOLUMES,
	OPT_CONSISTENCY,
	OPT_RESUME_CMD,
};

/*
 * Option callbacks get no spank handle, so the parsed values have to live in
 * file-scope state; it is only written by option callbacks and read in
 * init_post_opt of the same process.
 */
static struct {
	int given;            /* any slurm-snap option seen */
	int on_preempt;
	char *volumes;
	char *consistency;
	char *resume_cmd;
	char helper[PATH_MAX];
	char config[PATH_MAX];
} ctx;

static int opt_cb(int val, const char *optarg, int remote);

static struct spank_option options[] = {
	{ "snapshot-on-preempt", NULL,
	  "Snapshot the job's declared volumes when the job is preempted "
	  "(ranks get SIGUSR1 and checkpoint first).",
	  0, OPT_ON_PREEMPT, opt_cb },
	{ "snapshot-volumes", "V[,V...]",
	  "Volumes to snapshot: volume class names (e.g. scratch,pfs) or "
	  "absolute paths inside the configured roots.",
	  1, OPT_VOLUMES, opt_cb },
	{ "snapshot-consistency", "app|crash",
	  "app (default): wait for every rank's checkpoint acknowledgement; "
	  "crash: cut without waiting.",
	  1, OPT_CONSISTENCY, opt_cb },
	{ "snapshot-resume-cmd", "CMD",
	  "Command recorded with the job that restore drills run to check a "
	  "snapshot can be resumed from.",
	  1, OPT_RESUME_CMD, opt_cb },
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
	}
	return -1;
}

static int is_local(void)
{
	spank_context_t c = spank_context();

	return c == S_CTX_LOCAL || c == S_CTX_ALLOCATOR;
}

/* plugstack.conf arguments: helper=ABS config=ABS signal=NAME grace=SECONDS */
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
		if (!strncmp(a, "signal=", 7) && a[7] != '\0')
			continue; /* used by cli_filter.lua; accepted here to keep one line of config */
		if (!strncmp(a, "grace=", 6)) {
			char *end = NULL;
			long g = strtol(a + 6, &end, 10);

			if (a[6] != '\0' && *end == '\0' && g >= 0 && g <= 86400)
				continue;
			slurm_error(PREFIX "plugstack.conf argument '%s': grace must be 0..86400 seconds", a);
			return -1;
		}
		slurm_error(PREFIX "unknown plugstack.conf argument '%s' (expected helper=, config=, signal=, grace=)", a);
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
	if (parse_args(ac, av) < 0)
		/* A bad plugstack line must not break jobs on the nodes. */
		return is_local() ? -1 : 0;
	return 0;
}

/* Cheap checks done before starting any interpreter. */
static int check_text(const char *option, const char *value, int allow_empty)
{
	size_t n = strlen(value);

	if (!allow_empty && n == 0) {
		slurm_error(PREFIX "--%s: empty value", option);
		return -1;
	}
	if (n > MAX_ITEM_LEN) {
		slurm_error(PREFIX "--%s: value longer than %d bytes", option, MAX_ITEM_LEN);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char) value[i];

		if (ch < 0x20 || ch == 0x7f) {
			slurm_error(PREFIX "--%s: control character (0x%02x) in '%.64s'", option, ch, value);
			return -1;
		}
	}
	return 0;
}

static int check_volumes(const char *list)
{
	const char *p = list;
	int count = 0;

	if (*list == '\0') {
		slurm_error(PREFIX "--snapshot-volumes: empty list ''");
		return -1;
	}
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t) (comma - p) : strlen(p);

		if (len == 0) {
			slurm_error(PREFIX "--snapshot-volumes: empty item in '%.256s'", list);
			return -1;
		}
		if (len > MAX_ITEM_LEN) {
			slurm_error(PREFIX "--snapshot-volumes: item longer than %d bytes in '%.64s...'", MAX_ITEM_LEN, p);
			return -1;
		}
		for (size_t i = 0; i < len; i++) {
			unsigned char ch = (unsigned char) p[i];

			if (ch < 0x20 || ch == 0x7f) {
				slurm_error(PREFIX "--snapshot-volumes: control character (0x%02x) in '%.*s'", ch, (int) (len > 256 ? 256 : len), p);
				return -1;
			}
		}
		if (++count > MAX_ITEMS) {
			slurm_error(PREFIX "--snapshot-volumes: more than %d volumes", MAX_ITEMS);
			return -1;
		}
		if (!comma)
			return 0;
		p = comma + 1;
	}
}

static int check_consistency(const char *c)
{
	if (!strcmp(c, "app") || !strcmp(c, "crash"))
		return 0;
	slurm_error(PREFIX "--snapshot-consistency: '%.64s' is not 'app' or 'crash'", c);
	return -1;
}

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Runs in the forked child only: never returns. */
static void exec_helper(char *const argv[], int out_fd, int err_fd)
{
	int null_fd = open("/dev/null", O_RDONLY);

	if (null_fd < 0 || dup2(null_fd, STDIN_FILENO) < 0 ||
	    dup2(out_fd, STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0)
		_exit(126);
	/* sbatch may hold sockets and files open; the helper must not inherit them. */
	closefrom(3);
	/* Own process group, so a timeout kills the helper and its children. */
	setpgid(0, 0);
	signal(SIGPIPE, SIG_DFL);
	execv(argv[0], argv);
	dprintf(STDERR_FILENO, "cannot execute %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

struct capture {
	int fd;
	char *buf;
	size_t cap;
	size_t len;
	int keep_tail;     /* stderr: the last line names the bad value */
};

static void capture_append(struct capture *c, const char *chunk, size_t n)
{
	if (c->len + n > c->cap - 1) {
		if (c->keep_tail) {
			size_t drop = c->len + n - (c->cap - 1);

			if (drop > c->len)
				drop = c->len;
			memmove(c->buf, c->buf + drop, c->len - drop);
			c->len -= drop;
		}
		if (n > c->cap - 1 - c->len)
			n = c->cap - 1 - c->len;
	}
	memcpy(c->buf + c->len, chunk, n);
	c->len += n;
	c->buf[c->len] = '\0';
}

/* Reads stdout and stderr until both close or the deadline. Returns 1 on timeout. */
static int collect_output(struct capture *cs, int ncs, double deadline)
{
	for (;;) {
		struct pollfd pfd[2];
		int open_fds = 0, r;
		double left = deadline - now_seconds();

		for (int i = 0; i < ncs; i++) {
			pfd[i].fd = cs[i].fd;
			pfd[i].events = POLLIN;
			pfd[i].revents = 0;
			if (cs[i].fd >= 0)
				open_fds++;
		}
		if (!open_fds)
			return 0;
		if (left <= 0)
			return 1;
		r = poll(pfd, ncs, (int) (left * 1000) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return 0;
		for (int i = 0; i < ncs; i++) {
			char chunk[1024];
			ssize_t n;

			if (cs[i].fd < 0 || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			n = read(cs[i].fd, chunk, sizeof(chunk));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				close(cs[i].fd);
				cs[i].fd = -1;
				continue;
			}
			capture_append(&cs[i], chunk, (size_t) n);
		}
	}
}

static void report_helper_output(char *buf)
{
	char *save = NULL;

	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (!strncmp(line, PREFIX, strlen(PREFIX)))
			line += strlen(PREFIX);
		if (*line)
			slurm_error(PREFIX "%s", line);
	}
}

/*
 * Runs `HELPER --config CONFIG hook validate-options ...` as the submitting
 * user. On success `out` holds the helper's stdout (KEY=VALUE lines).
 */
static int run_validate(char *out, size_t out_cap)
{
	char *argv[12];
	int n = 0, outp[2], errp[2], status = 0, timed_out;
	char err[HELPER_STDERR_MAX];
	struct capture cs[2];
	pid_t pid;

	if (ctx.helper[0] == '\0' || ctx.config[0] == '\0') {
		slurm_error(PREFIX "plugstack.conf must give helper=/ABS/PATH and config=/ABS/PATH for the slurm-snap plugin");
		return -1;
	}
	if (access(ctx.helper, X_OK) != 0) {
		slurm_error(PREFIX "helper %s (plugstack.conf helper=) is missing or not executable: %s",
			    ctx.helper, strerror(errno));
		return -1;
	}
	argv[n++] = ctx.helper;
	argv[n++] = "--config";
	argv[n++] = ctx.config;
	argv[n++] = "hook";
	argv[n++] = "validate-options";
	if (ctx.volumes) {
		argv[n++] = "--volumes";
		argv[n++] = ctx.volumes;
	}
	argv[n++] = "--consistency";
	argv[n++] = ctx.consistency ? ctx.consistency : "app";
	if (ctx.resume_cmd) {
		argv[n++] = "--resume-cmd";
		argv[n++] = ctx.resume_cmd;
	}
	argv[n] = NULL;

	if (pipe2(outp, O_CLOEXEC) < 0) {
		slurm_error(PREFIX "pipe: %s", strerror(errno));
		return -1;
	}
	if (pipe2(errp, O_CLOEXEC) < 0) {
		slurm_error(PREFIX "pipe: %s", strerror(errno));
		close(outp[0]);
		close(outp[1]);
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		slurm_error(PREFIX "fork: %s", strerror(errno));
		close(outp[0]);
		close(outp[1]);
		close(errp[0]);
		close(errp[1]);
		return -1;
	}
	if (pid == 0)
		exec_helper(argv, outp[1], errp[1]);
	close(outp[1]);
	close(errp[1]);
	out[0] = err[0] = '\0';
	cs[0] = (struct capture) { .fd = outp[0], .buf = out, .cap = out_cap, .keep_tail = 0 };
	cs[1] = (struct capture) { .fd = errp[0], .buf = err, .cap = sizeof(err), .keep_tail = 1 };
	timed_out = collect_output(cs, 2, now_seconds() + HELPER_TIMEOUT_SECONDS);
	for (int i = 0; i < 2; i++)
		if (cs[i].fd >= 0)
			close(cs[i].fd);
	if (timed_out) {
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);
	}
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (timed_out) {
		slurm_error(PREFIX "helper %s validate-options did not finish within %d s", ctx.helper, HELPER_TIMEOUT_SECONDS);
		return -1;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	if (cs[1].len) {
		report_helper_output(err);
		return -1;
	}
	if (WIFEXITED(status))
		slurm_error(PREFIX "invalid snapshot options (helper %s exited with %d)", ctx.helper, WEXITSTATUS(status));
	else
		slurm_error(PREFIX "helper %s killed by signal %d", ctx.helper, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	return -1;
}

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
		    check_text(line, eq + 1, 1) < 0) {
			slurm_error(PREFIX "helper printed an unusable result line for '%.64s'", line);
			return -1;
		}
		/* The marker and the option variables are ours to set, not the helper's. */
		if (!strcmp(line, "SLURM_SNAP") || !strcmp(line, "SLURM_SNAP_ON_PREEMPT") ||
		    !strcmp(line, "SLURM_SNAP_VOLUMES") || !strcmp(line, "SLURM_SNAP_CONSISTENCY") ||
		    !strcmp(line, "SLURM_SNAP_RESUME_CMD"))
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

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	char result[HELPER_STDOUT_MAX];

	(void) ac;
	(void) av;
	if (!is_local() || !ctx.given)
		return 0;
	/*
	 * srun inside an existing allocation inherits the job's options through
	 * the environment: they were checked at submission and the job-control
	 * environment is the job's already. Checking again would start Python
	 * for every step and could fail a step of a job that was valid.
	 */
	if (spank_context() == S_CTX_LOCAL && getenv("SLURM_JOB_ID"))
		return 0;
	if (ctx.volumes && check_volumes(ctx.volumes) < 0)
		return -1;
	if (ctx.consistency && check_consistency(ctx.consistency) < 0)
		return -1;
	if (ctx.resume_cmd && check_text("snapshot-resume-cmd", ctx.resume_cmd, 0) < 0)
		return -1;
	if (run_validate(result, sizeof(result)) < 0)
		return -1;
	if (export_env(sp, "SLURM_SNAP", "1") < 0)
		return -1;
	if (ctx.on_preempt && export_env(sp, "SLURM_SNAP_ON_PREEMPT", "1") < 0)
		return -1;
	if (ctx.volumes && export_env(sp, "SLURM_SNAP_VOLUMES", ctx.volumes) < 0)
		return -1;
	if (export_env(sp, "SLURM_SNAP_CONSISTENCY", ctx.consistency ? ctx.consistency : "app") < 0)
		return -1;
	if (ctx.resume_cmd && export_env(sp, "SLURM_SNAP_RESUME_CMD", ctx.resume_cmd) < 0)
		return -1;
	if (export_result(sp, result) < 0)
		return -1;
	slurm_debug(PREFIX "version %s: options accepted", SLURM_SNAP_VERSION);
	return 0;
}

/*
 * Remote (slurmstepd, before the tasks start): give the job's tasks the
 * job-control variables under their own names (SLURM_SPANK_SLURM_SNAP_X ->
 * SLURM_SNAP_X), which is what the rank-side client reads. String copies
 * only: nothing here may block or fail a job.
 */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char **env = NULL;
	char *copies[MAX_RESULT_VARS + 8];
	int n = 0;
	size_t plen = strlen(JOB_ENV_PREFIX);

	(void) ac;
	(void) av;
	if (!spank_remote(sp))
		return 0;
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

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void) sp;
	(void) ac;
	(void) av;
	free(ctx.volumes);
	free(ctx.consistency);
	free(ctx.resume_cmd);
	ctx.volumes = ctx.consistency = ctx.resume_cmd = NULL;
	return 0;
}
