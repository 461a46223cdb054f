/* check_sources.c - placeholder: the sources suite is being written this session. */
#include "cwt.h"

Suite *
cwt_sources_suite(void)
{
	return suite_create("sources");
}
