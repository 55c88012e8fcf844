/* Cheap checks of option values, done in C before any interpreter starts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slurm_snap.h"

int snap_check_text(const char *option, const char *value, int allow_empty)
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

int snap_check_volumes(const char *list)
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

int snap_check_consistency(const char *c)
{
	if (!strcmp(c, "app") || !strcmp(c, "crash"))
		return 0;
	slurm_error(PREFIX "--snapshot-consistency: '%.64s' is not 'app' or 'crash'", c);
	return -1;
}

/*
 * A restore test id: 1 to 2^31-1 in decimal, no sign, no leading zero (the
 * inventory's ids are 32-bit). The whole check of a drill job's option: no
 * helper runs for it (local.c).
 */
int snap_check_drill(const char *value)
{
	size_t n = strlen(value);

	if (n == 0 || n > 10 || strspn(value, "0123456789") != n || value[0] == '0' ||
	    strtoull(value, NULL, 10) > 2147483647ULL) {
		slurm_error(PREFIX "--snapshot-drill: '%.64s' is not a restore test id", value);
		return -1;
	}
	return 0;
}
