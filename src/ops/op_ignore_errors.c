/*
 * op_ignore_errors.c - ignore_errors(log_warning=false): tf.data's
 * Dataset.ignore_errors. Elements whose production failed with a data
 * error are dropped and the stream goes on.
 *
 * Errors are sticky in cwi_iter_next (an iterator that failed stays
 * failed), so the dropping cannot happen here, after the failure: it
 * happens where the element fails. This iterator creates its input with
 * cwi_iter_args.drop pointing at its own cwi_drop, and every map and
 * filter below it (inline or parallel map, through the ops that create
 * their inputs with the args they got) drops an element whose function
 * fails with a data error (cwi_err_is_data: ECORRUPT, ETYPE, ERANGE,
 * EOP), counts it in this node's stats row (`dropped`) and, with
 * log_warning, logs it. Other errors (I/O, memory, cancellation, a bad
 * parameter) still end the stream, as do data errors of operators that
 * are not functions (a corrupt TFRecord frame).
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdlib.h>

typedef struct ignore_iter {
	cwi_iter base;
	cwi_iter *input;
	cwi_drop drop; /* what the functions below read (args.drop) */
} ignore_iter;

static cachew_err
ignore_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	return cwi_iter_next(((ignore_iter *)it)->input, out, max);
}

static void
ignore_destroy(cwi_iter *it)
{
	ignore_iter *g = (ignore_iter *)it;
	cwi_iter_destroy(g->input);
	free(g);
}

/* [input]: the count of dropped elements is a statistic, not a position. */
static cachew_err
ignore_save(cwi_iter *it, cwi_state_writer *w)
{
	cwi_sw_array(w, 1);
	return cwi_iter_save(((ignore_iter *)it)->input, w);
}

static cachew_err
ignore_restore(cwi_iter *it, cwi_state_reader *r)
{
	if (!cwi_sr_array(r, "ignore_errors", 1))
		return cwi_sr_error(r);
	return cwi_iter_restore(((ignore_iter *)it)->input, r);
}

static const cwi_iter_ops ignore_iter_ops = {
    .next = ignore_next,
    .destroy = ignore_destroy,
    .save = ignore_save,
    .restore = ignore_restore,
};

static cachew_err
ignore_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	ignore_iter *g = calloc(1, sizeof(*g));
	cwi_iter_args a = *args;
	cachew_err rv;

	if (g == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	g->base.ops = &ignore_iter_ops;
	g->drop.stats = cwi_pipeline_stats(args->pl, node);
	g->drop.log = cwi_node_bool(node, "log_warning");
	a.drop = &g->drop;
	rv = cwi_iter_create(&g->input, node->inputs[0], &a);
	if (rv != CACHEW_OK) {
		free(g);
		return rv;
	}
	*out = &g->base;
	return CACHEW_OK;
}

static const cwi_param_spec ignore_params[] = {
    {.name = "log_warning", .type = CWI_P_BOOL, .def_int = 0,
	.help = "log a warning (with the count so far) for each element "
		"dropped"},
};

const cwi_dataset_op cwi_op_ignore_errors = {
    .name = "ignore_errors",
    .doc = "drops elements whose map or filter function failed with a "
	   "data error (ECORRUPT, ETYPE, ERANGE, EOP) and goes on",
    .params = ignore_params,
    .nparams = sizeof(ignore_params) / sizeof(ignore_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = ignore_create,
    .saves = "the input (the count of dropped elements is a statistic)",
    .infer = cwi_infer_same_spec,
    .note = "An element is dropped where its function failed (a map or "
	"filter below, through the operators between them), so "
	"`map(f) | batch(2) | ignore_errors` loses only the failed element, "
	"where tf.data loses the batch being built. Other errors (I/O, out "
	"of memory, cancellation, bad parameters) and data errors of "
	"operators that are not functions (a corrupt TFRecord frame) still "
	"end the stream. The count of dropped elements is the node's "
	"`dropped` in cachew_iterator_stats. Through the service it runs on "
	"the workers with the functions below it; a client-side operator "
	"between them (take, repeat, ...) keeps it from reaching them.",
};
