/*
 * Runs the Python helper's `hook validate-options` as the submitting user:
 * fork + execv (no shell), stdin /dev/null, other fds closed, own process
 * group killed after HELPER_TIMEOUT_SECONDS; stdout and stderr captured.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "slurm_snap.h"

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
int snap_run_validate(const struct snap_options *o, char *out, size_t out_cap)
{
	char *argv[16];
	int n = 0, outp[2], errp[2], status = 0, timed_out;
	char err[HELPER_STDERR_MAX];
	struct capture cs[2];
	pid_t pid;

	if (o->helper[0] == '\0' || o->config[0] == '\0') {
		slurm_error(PREFIX "plugstack.conf must give helper=/ABS/PATH and config=/ABS/PATH for the slurm-snap plugin");
		return -1;
	}
	if (access(o->helper, X_OK) != 0) {
		slurm_error(PREFIX "helper %s (plugstack.conf helper=) is missing or not executable: %s",
			    o->helper, strerror(errno));
		return -1;
	}
	argv[n++] = (char *) o->helper;
	argv[n++] = "--config";
	argv[n++] = (char *) o->config;
	argv[n++] = "hook";
	argv[n++] = "validate-options";
	if (o->volumes) {
		argv[n++] = "--volumes";
		argv[n++] = o->volumes;
	}
	argv[n++] = "--consistency";
	argv[n++] = o->consistency ? o->consistency : "app";
	if (o->resume_cmd) {
		argv[n++] = "--resume-cmd";
		argv[n++] = o->resume_cmd;
	}
	if (o->every) {
		argv[n++] = "--every";
		argv[n++] = o->every;
	}
	if (o->timelimit) {
		argv[n++] = "--before-timelimit";
		argv[n++] = o->timelimit;
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
		slurm_error(PREFIX "helper %s validate-options did not finish within %d s", o->helper, HELPER_TIMEOUT_SECONDS);
		return -1;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	if (cs[1].len) {
		report_helper_output(err);
		return -1;
	}
	if (WIFEXITED(status))
		slurm_error(PREFIX "invalid snapshot options (helper %s exited with %d)", o->helper, WEXITSTATUS(status));
	else
		slurm_error(PREFIX "helper %s killed by signal %d", o->helper, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	return -1;
}
