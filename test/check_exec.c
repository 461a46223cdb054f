/* check_exec.c - placeholder: the exec suite is being written this session. */
#include "cwt.h"

Suite *
cwt_exec_suite(void)
{
	return suite_create("exec");
}
