/*
 * op_autocache.c - autocache(): marks the point where the policy engine may
 * cache the pipeline's output. Until a policy acts on it, it passes every
 * element through; being a pass-through, its fingerprint is its input's.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdlib.h>

typedef struct autocache_iter {
	cwi_iter base;
	cwi_iter *input;
} autocache_iter;

static cachew_err
autocache_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	return cwi_iter_next(((autocache_iter *)it)->input, out, max);
}

static void
autocache_destroy(cwi_iter *it)
{
	cwi_iter_destroy(((autocache_iter *)it)->input);
	free(it);
}

/* [input]: it holds nothing of its own. */
static cachew_err
autocache_save(cwi_iter *it, cwi_state_writer *w)
{
	cwi_sw_array(w, 1);
	return cwi_iter_save(((autocache_iter *)it)->input, w);
}

static cachew_err
autocache_restore(cwi_iter *it, cwi_state_reader *r)
{
	if (!cwi_sr_array(r, "autocache", 1))
		return cwi_sr_error(r);
	return cwi_iter_restore(((autocache_iter *)it)->input, r);
}

static const cwi_iter_ops autocache_iter_ops = {
    .next = autocache_next,
    .destroy = autocache_destroy,
    .save = autocache_save,
    .restore = autocache_restore,
};

static cachew_err
autocache_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	autocache_iter *a = calloc(1, sizeof(*a));
	cachew_err rv;

	if (a == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	a->base.ops = &autocache_iter_ops;
	rv = cwi_iter_create(&a->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(a);
		return rv;
	}
	*out = &a->base;
	return CACHEW_OK;
}

const cwi_dataset_op cwi_op_autocache = {
    .name = "autocache",
    .doc = "marks a point the cache policy may cache; passes elements "
	   "through",
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_PASSTHROUGH,
    .iter_create = autocache_create,
    .saves = "the input",
};
