/*
 * Test double of the SPANK API for the plugin's local context (tests/unit/
 * test_spank_local.py): links spank/checks.c, helper.c and local.c as sbatch
 * loads them, and calls snap_local_post_opt() with the options on its argv
 *   harness helper=PATH config=PATH [drill=V] [volumes=V] [consistency=V]
 *           [resume=V] [every=V] [timelimit=V] [on_preempt] [independent]
 * Prints each job-control variable set ("SET NAME=VALUE"), each error
 * ("ERROR text") and the result ("RC n"), one line each, on stdout.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "slurm_snap.h"

spank_err_t spank_job_control_setenv(spank_t sp, const char *name, const char *value, int overwrite)
{
	(void) sp;
	(void) overwrite;
	printf("SET %s=%s\n", name, value);
	return ESPANK_SUCCESS;
}

const char *spank_strerror(spank_err_t err)
{
	(void) err;
	return "error";
}

spank_context_t spank_context(void)
{
	return S_CTX_ALLOCATOR;   /* sbatch */
}

static void say(const char *head, const char *fmt, va_list ap)
{
	printf("%s ", head);
	vprintf(fmt, ap);
	printf("\n");
}

void slurm_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say("ERROR", fmt, ap);
	va_end(ap);
}

void slurm_debug(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say("DEBUG", fmt, ap);
	va_end(ap);
}

int main(int argc, char **argv)
{
	struct snap_options o = { .given = 1 };

	for (int i = 1; i < argc; i++) {
		char *eq = strchr(argv[i], '=');
		char *v = eq ? eq + 1 : NULL;
		size_t k = eq ? (size_t) (eq - argv[i]) : strlen(argv[i]);

#define KEY(name) (k == strlen(name) && !strncmp(argv[i], name, k))
		if (KEY("helper") && v)
			snprintf(o.helper, sizeof(o.helper), "%s", v);
		else if (KEY("config") && v)
			snprintf(o.config, sizeof(o.config), "%s", v);
		else if (KEY("drill") && v)
			o.drill = v;
		else if (KEY("volumes") && v)
			o.volumes = v;
		else if (KEY("consistency") && v)
			o.consistency = v;
		else if (KEY("resume") && v)
			o.resume_cmd = v;
		else if (KEY("every") && v)
			o.every = v;
		else if (KEY("timelimit") && v)
			o.timelimit = v;
		else if (KEY("on_preempt"))
			o.on_preempt = 1;
		else if (KEY("independent"))
			o.independent = 1;
		else {
			fprintf(stderr, "harness: unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	fflush(stdout);
	printf("RC %d\n", snap_local_post_opt(NULL, &o));
	return 0;
}
