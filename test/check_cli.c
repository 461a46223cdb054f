/* check_cli.c - placeholder: the cli suite is being written this session. */
#include "cwt.h"

Suite *
cwt_cli_suite(void)
{
	return suite_create("cli");
}
