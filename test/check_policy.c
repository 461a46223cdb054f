/*
 * check_policy.c - scalers and fair share. (Placeholder: its tests are being written.)
 */
#include "cwt.h"

Suite *
cwt_policy_suite(void)
{
	return suite_create("policy");
}
