/* check_core.c - placeholder: the core suite is being written. */
#include "cwt.h"

Suite *
cwt_core_suite(void)
{
	return suite_create("core");
}
