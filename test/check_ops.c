/* check_ops.c - placeholder: the ops suite is being written this session. */
#include "cwt.h"

Suite *
cwt_ops_suite(void)
{
	return suite_create("ops");
}
