/*
 * The plugin in a Slurm it was not built for.
 *
 * Slurm loads a SPANK plugin only if its plugin_version has Slurm's own
 * major.minor. When it does not (the site upgraded Slurm and left the old
 * package), a `required` plugin stops sbatch for every job ("Failed to
 * initialize plugin stack", measured on 22.05) and keeps slurmd from
 * starting: the whole cluster pays for slurm-snap's install mistake.
 *
 * So the version check is ours, and it refuses without breaking anything.
 * A constructor (dlopen runs it before Slurm reads plugin_version) asks the
 * loading process's libslurm for its API number and compares it with the
 * one this plugin was built against (SLURM_SNAP_SLURM_API, measured by the
 * Makefile from the libslurm beside the headers). When they differ, the
 * plugin presents the loader's release in plugin_version so Slurm loads it,
 * and then stays inert: it registers the options (so a job that names one
 * fails at submission with the reason, not "unrecognized option"), acts in
 * no context, and says once which two versions disagree. Jobs that use no
 * --snapshot-* option, slurmd and slurmstepd carry on unaffected.
 *
 * The release shown to Slurm is read from the API number: libslurm's
 * "current" has gone up by one per release (22.05: 38, 23.02: 39, 23.11:
 * 40, 24.05: 41, 24.11: 42, then two a year, May and November). A release
 * the rule does not know leaves plugin_version alone: Slurm then refuses the
 * plugin itself, as it would without this file, after the message below.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "slurm_snap.h"

#ifndef SLURM_SNAP_SLURM_API
#error "SLURM_SNAP_SLURM_API (the built-against libslurm's API number) comes from spank/Makefile"
#endif

/* Not const: the constructor below may present the loader's release. */
unsigned int plugin_version = SLURM_VERSION_NUMBER;

static long loaded_api;   /* the loader's API number when it is not ours, else 0 */
static int told;

/* The release (SLURM_VERSION_NUM(major, minor, 0)) whose libslurm has API
 * number `api`; 0 when the rule above does not know it. */
static unsigned int release_of_api(long api)
{
	if (api == 38)
		return SLURM_VERSION_NUM(22, 5, 0);
	if (api == 39)
		return SLURM_VERSION_NUM(23, 2, 0);
	if (api >= 40 && api < 80)
		return SLURM_VERSION_NUM(23 + (api - 39) / 2, api % 2 ? 5 : 11, 0);
	return 0;
}

__attribute__((constructor)) static void snap_version_guard(void)
{
	long (*api_version)(void) = (long (*)(void)) dlsym(RTLD_DEFAULT, "slurm_api_version");
	long api;
	unsigned int release;

	if (!api_version)
		return;   /* not loaded by a Slurm program: nothing to compare */
	api = (api_version() >> 16) & 0xff;
	if (api == SLURM_SNAP_SLURM_API)
		return;
	loaded_api = api;
	release = release_of_api(api);
	if (release)
		plugin_version = release;
	else
		fprintf(stderr, PREFIX "this plugin was built for Slurm %d.%02d (libslurm API %d) and is "
			"loaded by a Slurm with libslurm API %ld: install the slurm-snap package built for "
			"that Slurm\n", SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER),
			SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER), SLURM_SNAP_SLURM_API, api);
}

int snap_version_mismatch(void)
{
	return loaded_api != 0;
}

/*
 * One message naming both versions: at error level where an admin reads it
 * (slurmd's log, and the submission that asked for a --snapshot-* option),
 * at verbose level for every other submission, which it does not affect.
 */
void snap_version_refuse(spank_t sp, int loud)
{
	char *running = NULL;
	char loader[32];

	if (told && !loud)
		return;
	told = 1;
	/* S_SLURM_VERSION (a char **) is the same item in 22.05's and 24.11's spank.h. */
	if (spank_get_item(sp, S_SLURM_VERSION, &running) != ESPANK_SUCCESS || !running) {
		unsigned int r = release_of_api(loaded_api);

		snprintf(loader, sizeof(loader), "%d.%02d", SLURM_VERSION_MAJOR(r), SLURM_VERSION_MINOR(r));
		running = loader;
	}
	(loud ? slurm_error : slurm_verbose)(
		PREFIX "this plugin was built for Slurm %d.%02d (its headers %d.%02d.%d) and Slurm %s "
		"loaded it: it stays inactive, --snapshot-* options are refused and other jobs are not "
		"affected; install the slurm-snap package built for Slurm %s and restart slurmd",
		SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER), SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER),
		SLURM_VERSION_MAJOR(SLURM_VERSION_NUMBER), SLURM_VERSION_MINOR(SLURM_VERSION_NUMBER),
		SLURM_VERSION_MICRO(SLURM_VERSION_NUMBER), running, running);
}
