/* check_formats.c - placeholder: the formats suite is being written (issue 3). */
#include "cwt.h"

Suite *
cwt_formats_suite(void)
{
	return suite_create("formats");
}
