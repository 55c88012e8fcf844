/* Prints the API number ("current") of the libslurm it is linked with; the
 * Makefile compiles it into the plugin (see version_guard.c). Build only. */
#include <stdio.h>
#include <slurm/slurm.h>

int main(void)
{
	printf("%ld\n", (slurm_api_version() >> 16) & 0xff);
	return 0;
}
