/*
 * check_service.c - placeholder suite (filled by the work on this module).
 */
#include "cwt.h"

Suite *
cwt_service_suite(void)
{
	return suite_create("service");
}
