/*
 * check_provision.c - provisioners. (Placeholder: its tests are being written.)
 */
#include "cwt.h"

Suite *
cwt_provision_suite(void)
{
	return suite_create("provision");
}
