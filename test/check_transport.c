/*
 * check_transport.c - placeholder suite (filled by the work on this module).
 */
#include "cwt.h"

Suite *
cwt_transport_suite(void)
{
	return suite_create("transport");
}
