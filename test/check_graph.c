/* check_graph.c - placeholder: the graph suite is being written this session. */
#include "cwt.h"

Suite *
cwt_graph_suite(void)
{
	return suite_create("graph");
}
