/*
 * exec_map.c - map(fn, parallel, deterministic): applies a map function to
 * every element. This file holds the inline (parallel <= 1) form.
 */
#include "exec_ops.h"

#include <stdlib.h>

typedef struct map_iter {
	cwi_iter base;
	cwi_iter *input;
	cachew_op_ctx ctx;
	uint64_t index; /* elements seen at the input */
} map_iter;

static cachew_err
map_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	map_iter *m = (map_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	rv = cwi_iter_next(m->input, out, max);
	if (rv != CACHEW_OK)
		return rv;
	for (size_t i = n0; i < out->n; i++) {
		cwi_element *res = NULL;
		cwi_op_ctx_at(&m->ctx, m->index++);
		rv = cwi_apply_map(&m->ctx, it->node, it->pl, out->v[i], &res);
		if (rv != CACHEW_OK) {
			/* v[i] was consumed; drop the rest of the chunk. */
			for (size_t j = i + 1; j < out->n; j++)
				cwi_element_release(out->v[j]);
			out->n = i;
			return rv;
		}
		out->v[i] = res;
	}
	return CACHEW_OK;
}

static void
map_destroy(cwi_iter *it)
{
	map_iter *m = (map_iter *)it;
	cwi_iter_destroy(m->input);
	free(m);
}

static const cwi_iter_ops map_iter_ops = {
    .next = map_next,
    .destroy = map_destroy,
};

static cachew_err
map_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	map_iter *m = calloc(1, sizeof(*m));
	cachew_err rv;

	if (m == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	m->base.ops = &map_iter_ops;
	cwi_op_ctx_init(&m->ctx, node, args->pl);
	rv = cwi_iter_create(&m->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(m);
		return rv;
	}
	*out = &m->base;
	return CACHEW_OK;
}

static const cwi_param_spec map_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the map function"},
    {.name = "parallel", .type = CWI_P_INT,
	.flags = CWI_PF_PERF | CWI_PF_AUTO, .def_int = 1, .min = 0,
	.max = 1024, .help = "threads: 1 = inline, N, or auto"},
    {.name = "deterministic", .type = CWI_P_BOOL, .def_int = 1,
	.help = "keep input order under parallelism"},
};

const cwi_dataset_op cwi_op_map = {
    .name = "map",
    .doc = "applies a map function to every element",
    .params = map_params,
    .nparams = sizeof(map_params) / sizeof(map_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_FN_MAP,
    .iter_create = map_create,
};
