/*
 * cache_plan.c - rewriting a pipeline so that it writes, or reads, the
 * cache of one of its nodes (the policy engine's PUT and GET modes).
 *
 * Both rewrites keep every fingerprint of the pipeline: cache_put passes
 * its input through (fp = the input's) and cache_get's fp is the cached
 * node's (CWI_OPF_FP_PARAM). So a job whose pipeline was rewritten still
 * registers as the same dataset downstream of the cache point, and a
 * client's part of the pipeline is unchanged.
 */
#include "cache_int.h"

#include <stdio.h>

/* A copy of the graph `n` where node `at` is `repl` (a new reference is
 * taken on it); nodes that do not reach `at` are shared, the ones on the
 * way rebuilt with their own parameters. */
static cachew_err
replace(cwi_node *n, const cwi_node *at, cwi_node *repl, cwi_node **out)
{
	cwi_node *inputs[CWI_MAX_INPUTS];
	bool changed = false;
	cachew_err rv = CACHEW_OK;

	if (n == at) {
		*out = cachew_dataset_retain(repl);
		return CACHEW_OK;
	}
	for (size_t i = 0; i < n->ninputs; i++) {
		inputs[i] = NULL;
		if (rv == CACHEW_OK)
			rv = replace(n->inputs[i], at, repl, &inputs[i]);
		if (inputs[i] != n->inputs[i])
			changed = true;
	}
	if (rv == CACHEW_OK && !changed)
		*out = cachew_dataset_retain(n);
	else if (rv == CACHEW_OK)
		rv = cwi_node_build(out, n->op->name, inputs, n->ninputs, NULL,
		    &n->params.map);
	for (size_t i = 0; i < n->ninputs; i++)
		cachew_dataset_release(inputs[i]);
	return rv;
}

static bool
reaches(const cwi_node *n, const cwi_node *at)
{
	if (n == at)
		return true;
	for (size_t i = 0; i < n->ninputs; i++)
		if (reaches(n->inputs[i], at))
			return true;
	return false;
}

cachew_err
cwi_cache_plan_put(cwi_node *top, const cwi_node *at, const char *root,
    uint64_t write_id, cwi_node **out)
{
	cachew_params *p = NULL;
	cwi_node *put = NULL, *in = (cwi_node *)at;
	cachew_err rv;

	*out = NULL;
	if (!reaches(top, at))
		return cwi_fail(CACHEW_EINVAL,
		    "cache plan: the cache point is not in the pipeline");
	if (write_id > INT64_MAX)
		return cwi_fail(CACHEW_ERANGE,
		    "cache plan: write id %llu is over 2^63-1",
		    (unsigned long long)write_id);
	rv = cachew_params_create(&p);
	if (rv == CACHEW_OK)
		rv = cachew_params_set_str(p, "root", root);
	if (rv == CACHEW_OK && write_id != 0)
		rv = cachew_params_set_int(p, "write_id", (int64_t)write_id);
	if (rv == CACHEW_OK)
		rv = cwi_node_build(&put, "cache_put", &in, 1, NULL, &p->map);
	if (rv == CACHEW_OK)
		rv = replace(top, at, put, out);
	cachew_dataset_release(put);
	cachew_params_destroy(p);
	return rv;
}

cachew_err
cwi_cache_plan_get(cwi_node *top, const cwi_node *at, const char *root,
    cwi_node **out)
{
	cachew_params *p = NULL;
	cwi_node *get = NULL;
	char hex[33];
	cachew_err rv;

	*out = NULL;
	if (!reaches(top, at))
		return cwi_fail(CACHEW_EINVAL,
		    "cache plan: the cache point is not in the pipeline");
	cachew_fingerprint_hex(cwi_node_fp(at), hex);
	rv = cachew_params_create(&p);
	if (rv == CACHEW_OK)
		rv = cachew_params_set_str(p, "root", root);
	if (rv == CACHEW_OK)
		rv = cachew_params_set_str(p, "fingerprint", hex);
	if (rv == CACHEW_OK)
		rv = cwi_node_build(&get, "cache_get", NULL, 0, NULL, &p->map);
	if (rv == CACHEW_OK)
		rv = replace(top, at, get, out);
	cachew_dataset_release(get);
	cachew_params_destroy(p);
	return rv;
}
