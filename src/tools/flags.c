/*
 * flags.c - a command-line flag that takes a value, as every cachew
 * command reads one: "--name VALUE" or "--name=VALUE" (docs/cli.md).
 */
#include "tools.h"

#include <string.h>

int
cwi_flag_value(int argc, char **argv, int *i, const char *name,
    const char **value)
{
	const char *a = argv[*i];
	size_t len = strlen(name);

	if (strncmp(a, name, len) != 0)
		return 0;
	if (a[len] == '=') {
		*value = a + len + 1;
		return 1;
	}
	if (a[len] != '\0')
		return 0;
	if (*i + 1 >= argc)
		return -1;
	*value = argv[++*i];
	return 1;
}
