/*
 * check_cache.c - placeholder suite (filled by the work on this module).
 */
#include "cwt.h"

Suite *
cwt_cache_suite(void)
{
	return suite_create("cache");
}
