/*
 * pipeline_builtins.c - the list of every built-in operator table, and the
 * public calls that register operators or build a node by name.
 */
#include "pipeline.h"
#include "../sources/sources.h"

#include <pthread.h>

static const cwi_dataset_op *const *const op_tables[] = {
    cwi_source_ops, cwi_transform_ops, cwi_exec_ops, cwi_cache_ops};
static const cachew_op_def *const *const fn_tables[] = {
    cwi_builtin_fns, cwi_source_fns};
static const cwi_fn_resume resumes[] = {
    {&cwi_fn_text_lines, &cwi_rec_fn_resume},
    {&cwi_fn_fixed_length_records, &cwi_rec_fn_resume},
    {&cwi_fn_tfrecord, &cwi_tfr_fn_resume},
};
static const cwi_builtins builtins = {
    .op_tables = op_tables,
    .nop_tables = sizeof(op_tables) / sizeof(op_tables[0]),
    .fn_tables = fn_tables,
    .nfn_tables = sizeof(fn_tables) / sizeof(fn_tables[0]),
    .resumes = resumes,
    .nresumes = sizeof(resumes) / sizeof(resumes[0]),
    .specs = cwi_builtin_fn_specs,
};

void
cwi_builtins_ready(void)
{
	cwi_registry_init(&builtins);
}

cachew_err
cachew_op_register(const cachew_op_def *def)
{
	cwi_builtins_ready();
	return cwi_registry_register(def);
}

cachew_err
cachew_source_register(const cachew_source_def *def)
{
	cwi_builtins_ready();
	return cwi_registry_register_source(def);
}

cachew_err
cachew_plugin_load(const char *path)
{
	cwi_builtins_ready();
	return cwi_registry_plugin_load(path);
}

cachew_err
cachew_dataset_apply(cachew_dataset **out, const char *op,
    cachew_dataset *const *inputs, size_t ninputs, const cachew_params *params)
{
	cwi_builtins_ready();
	if (out == NULL || op == NULL || (ninputs > 0 && inputs == NULL))
		return cwi_fail(CACHEW_EINVAL, "apply: NULL argument");
	for (size_t i = 0; i < ninputs; i++)
		if (inputs[i] == NULL)
			return cwi_fail(CACHEW_EINVAL, "apply: input %zu is NULL",
			    i);
	cwi_clear_errmsg();
	return cwi_node_build(out, op, inputs, ninputs, NULL,
	    params != NULL ? &params->map : NULL);
}
