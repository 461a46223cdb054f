/*
 * check_autocache.c - autocaching decisions. (Placeholder: its tests are being written.)
 */
#include "cwt.h"

Suite *
cwt_autocache_suite(void)
{
	return suite_create("autocache");
}
