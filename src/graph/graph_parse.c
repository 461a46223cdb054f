/* graph_parse.c - placeholder until the parser lands (this session). */
#include "graph.h"
cachew_err
cwi_value_parse(cwi_value *out, const char *text)
{
	(void)out;
	return cwi_fail(CACHEW_ENOTSUP, "literal parsing pending: %s", text);
}
cachew_err
cachew_dataset_parse(cachew_dataset **out, const char *pipeline)
{
	(void)out;
	return cwi_fail(CACHEW_ENOTSUP, "parser pending: %s", pipeline);
}
