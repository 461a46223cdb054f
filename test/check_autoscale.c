/*
 * check_autoscale.c - policies in the dispatcher, end to end. (Placeholder: its tests are being written.)
 */
#include "cwt.h"

Suite *
cwt_autoscale_suite(void)
{
	return suite_create("autoscale");
}
