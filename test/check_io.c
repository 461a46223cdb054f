/* check_io.c - placeholder: the io suite is being written (issue 3). */
#include "cwt.h"

Suite *
cwt_io_suite(void)
{
	return suite_create("io");
}
