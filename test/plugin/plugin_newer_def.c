/*
 * plugin_newer_def.c - a plugin as built against a cachew.h newer than the
 * library that loads it: its one operator's definition says version
 * CACHEW_OP_DEF_VERSION + 1. check_cli.c loads it (as
 * <build>/plugin_newer_def.so) to see the registry refuse the definition
 * with a message naming the operator, this file and both versions.
 */
#include "cachew.h"

static cachew_err
pass_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	*out = in;
	return CACHEW_OK;
}

static const cachew_op_def future_def = {
    .version = CACHEW_OP_DEF_VERSION + 1,
    .name = "future_pass",
    .kind = CACHEW_OP_MAP,
    .map = pass_map,
};

CACHEW_API cachew_err cachew_plugin_init(unsigned abi);

cachew_err
cachew_plugin_init(unsigned abi)
{
	(void)abi;
	return cachew_op_register(&future_def);
}
