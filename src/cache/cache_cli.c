/*
 * cache_cli.c - `cachew cache ...` (placeholder).
 */
#include "cache.h"

#include <stdio.h>

int
cwi_cache_cli(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fprintf(stderr, "cachew cache: not implemented yet\n");
	return 2;
}
