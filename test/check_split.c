/*
 * check_split.c - placeholder suite (filled by the work on this module).
 */
#include "cwt.h"

Suite *
cwt_split_suite(void)
{
	return suite_create("split");
}
