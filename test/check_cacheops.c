/*
 * check_cacheops.c - placeholder suite (filled by the work on this module).
 */
#include "cwt.h"

Suite *
cwt_cacheops_suite(void)
{
	return suite_create("cacheops");
}
