/*
 * op_rebatch.c - rebatch(batch_size, drop_remainder): tf.data's rebatch.
 * The input's elements are batches; their rows are regrouped into batches
 * of batch_size rows, or of the sizes of a list taken in turn, crossing
 * the input's batch boundaries (range(6) | batch(4) | rebatch(3) is
 * [0 1 2], [3 4 5]). The last batch may be smaller unless drop_remainder.
 *
 * The rows come from an unbatch iterator over the same input (zero-copy
 * views of the input's batches); each output batch is one cwi_stack of
 * its rows, the one copy batch makes too.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

/* Sizes a list may hold: a cycle longer than this is no use to anyone. */
#define REBATCH_MAX_SIZES 1024

typedef struct rebatch_iter {
	cwi_iter base;
	cwi_iter *rows;   /* unbatch of the input */
	int64_t *sizes;
	size_t nsizes;
	size_t next_size; /* index into sizes of the next batch */
	bool drop_remainder;
	bool rows_done;
	cwi_chunk pending; /* rows of the batch being built */
} rebatch_iter;

/* Reads batch_size (an int, or a list of them) into sizes; CACHEW_EINVAL
 * or CACHEW_ERANGE through cwi_fail. */
static cachew_err
rebatch_sizes(const cwi_node *node, int64_t **sizes, size_t *n)
{
	const cwi_value *v = cwi_node_value(node, "batch_size");
	const cwi_value *items = v;
	size_t k = 1;

	if (v != NULL && v->type == CWI_V_LIST) {
		items = v->u.list.items;
		k = v->u.list.n;
		if (k == 0 || k > REBATCH_MAX_SIZES)
			return cwi_fail(CACHEW_ERANGE, "rebatch: batch_size "
			    "lists %zu sizes; give 1 to %d", k,
			    REBATCH_MAX_SIZES);
	}
	*sizes = calloc(k, sizeof(**sizes));
	if (*sizes == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < k; i++) {
		if (items == NULL || items[i].type != CWI_V_INT) {
			free(*sizes);
			*sizes = NULL;
			return cwi_fail(CACHEW_EINVAL, "rebatch: batch_size must "
			    "be an integer or a list of integers (item %zu is "
			    "not)", i);
		}
		if (items[i].u.i < 1 || items[i].u.i > INT32_MAX) {
			free(*sizes);
			*sizes = NULL;
			return cwi_fail(CACHEW_ERANGE, "rebatch: batch size %lld "
			    "(item %zu) is outside [1, %d]",
			    (long long)items[i].u.i, i, INT32_MAX);
		}
		(*sizes)[i] = items[i].u.i;
	}
	*n = k;
	return CACHEW_OK;
}

static cachew_err
rebatch_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	rebatch_iter *r = (rebatch_iter *)it;
	char err[256];
	size_t got = 0;
	cachew_err rv;

	while (got < max) {
		size_t want = (size_t)r->sizes[r->next_size];
		uint64_t bytes = 0;
		while (!r->rows_done && r->pending.n < want) {
			size_t step = want - r->pending.n;
			rv = cwi_iter_next(r->rows, &r->pending,
			    step < 4096 ? step : 4096);
			if (rv == CACHEW_EOF)
				r->rows_done = true;
			else if (rv != CACHEW_OK)
				return rv;
		}
		if (r->pending.n == 0 ||
		    (r->pending.n < want && r->drop_remainder)) {
			cwi_chunk_clear(&r->pending);
			break;
		}
		for (size_t i = 0; i < r->pending.n; i++)
			bytes += cwi_element_nbytes(r->pending.v[i]);
		rv = cwi_pipeline_check_bytes(it->pl, it->node, bytes,
		    "a batch of %zu rows", r->pending.n);
		if (rv != CACHEW_OK)
			return rv;
		cwi_element *res = NULL;
		rv = cwi_stack(r->pending.v, r->pending.n, &res, err,
		    sizeof(err));
		if (rv != CACHEW_OK)
			return cwi_pipeline_fail(it->pl, rv, "rebatch: %s", err);
		cwi_chunk_clear(&r->pending);
		cwi_chunk_push(out, res);
		r->next_size = (r->next_size + 1) % r->nsizes;
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
rebatch_destroy(cwi_iter *it)
{
	rebatch_iter *r = (rebatch_iter *)it;

	cwi_iter_destroy(r->rows);
	cwi_chunk_free(&r->pending);
	free(r->sizes);
	free(r);
}

/* [next size index, rows done, rows of the partial batch, the rows'
 * unbatch state (with the input's)]. */
static cachew_err
rebatch_save(cwi_iter *it, cwi_state_writer *w)
{
	rebatch_iter *r = (rebatch_iter *)it;
	cachew_err rv;

	cwi_sw_array(w, 4);
	cwi_sw_uint(w, r->next_size);
	cwi_sw_bool(w, r->rows_done);
	rv = cwi_sw_elements(w, r->pending.v, r->pending.n);
	if (rv == CACHEW_OK)
		rv = cwi_iter_save(r->rows, w);
	return rv;
}

static cachew_err
rebatch_restore(cwi_iter *it, cwi_state_reader *rd)
{
	rebatch_iter *r = (rebatch_iter *)it;
	uint64_t next = 0;

	if (!cwi_sr_array(rd, "rebatch", 4) ||
	    !cwi_sr_uint(rd, "next size", &next, r->nsizes - 1) ||
	    !cwi_sr_bool(rd, "rows done", &r->rows_done) ||
	    !cwi_sr_elements(rd, "partial batch", &r->pending))
		return cwi_sr_error(rd);
	r->next_size = (size_t)next;
	if (r->pending.n >= (size_t)r->sizes[r->next_size]) {
		cwi_sr_fail(rd, CACHEW_ECORRUPT,
		    "a partial batch of %zu rows, for a batch of %lld",
		    r->pending.n, (long long)r->sizes[r->next_size]);
		return cwi_sr_error(rd);
	}
	return cwi_iter_restore(r->rows, rd);
}

static const cwi_iter_ops rebatch_iter_ops = {
    .next = rebatch_next,
    .destroy = rebatch_destroy,
    .save = rebatch_save,
    .restore = rebatch_restore,
};

static cachew_err
rebatch_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	rebatch_iter *r = calloc(1, sizeof(*r));
	cwi_iter *rows = NULL;
	cachew_err rv;

	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->base.ops = &rebatch_iter_ops;
	r->drop_remainder = cwi_node_bool(node, "drop_remainder");
	rv = rebatch_sizes(node, &r->sizes, &r->nsizes);
	/* The rows: unbatch's iterator over this node's input, with the
	 * fields cwi_iter_create fills (no stats row of its own). */
	if (rv == CACHEW_OK)
		rv = cwi_op_unbatch.iter_create(&rows, node, args);
	if (rv != CACHEW_OK) {
		free(r->sizes);
		free(r);
		return rv;
	}
	rows->pl = args->pl;
	rows->node = node;
	rows->stats = NULL;
	rows->done = CACHEW_OK;
	rows->pending = CACHEW_OK;
	rows->epoch = args->epoch;
	rows->drop = args->drop;
	r->rows = rows;
	*out = &r->base;
	return CACHEW_OK;
}

/* The batches of `rows` rows cut by sizes in turn. */
static int64_t
rebatch_count(int64_t rows, const int64_t *sizes, size_t n, bool drop)
{
	int64_t cycle = 0, count, rem;

	for (size_t i = 0; i < n; i++)
		cycle += sizes[i];
	count = rows / cycle * (int64_t)n;
	rem = rows % cycle;
	for (size_t i = 0; i < n && rem >= sizes[i]; i++) {
		rem -= sizes[i];
		count++;
	}
	return count + (rem > 0 && !drop);
}

/* The input's spec, each component's leading dimension the batch size
 * when every batch has that size (one size with drop_remainder), else -1;
 * the rows' count from unbatch's rule, cut by the sizes. */
static cachew_err
rebatch_infer(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	int64_t *sizes = NULL, rows = -1, c = node->inputs[0]->card;
	size_t n = 0;
	bool drop = cwi_node_bool(node, "drop_remainder");
	char label[96];
	cachew_err rv;

	rv = rebatch_sizes(node, &sizes, &n);
	if (rv != CACHEW_OK)
		return rv;
	node->card = c == CACHEW_CARDINALITY_INFINITE || c == 0
	    ? c : CACHEW_CARDINALITY_UNKNOWN;
	if (in->known)
		rv = cwi_spec_copy(&node->spec, in);
	for (uint32_t i = 0; in->known && rv == CACHEW_OK && i < in->n; i++) {
		cwi_comp_spec *s = &node->spec.comp[i];
		if (s->rank == CWI_RANK_UNKNOWN) {
			rows = -2;
			continue;
		}
		if (s->rank == 0) {
			cwi_spec_free(&node->spec);
			rv = cwi_fail(CACHEW_ETYPE, "rebatch: %s is a scalar: "
			    "rebatch takes batches (elements with a leading "
			    "dimension)",
			    cwi_comp_spec_label(in, i, label, sizeof(label)));
			break;
		}
		if (rows == -1 || (rows >= 0 && rows != s->shape[0]))
			rows = rows == -1 ? s->shape[0] : -2;
		s->shape[0] = n == 1 && drop ? sizes[0] : -1;
	}
	if (rv == CACHEW_OK && c > 0 && rows >= 0 &&
	    cwi_card_mul(c, rows) >= 0)
		node->card = rebatch_count(cwi_card_mul(c, rows), sizes, n,
		    drop);
	free(sizes);
	return rv;
}

static const cwi_param_spec rebatch_params[] = {
    {.name = "batch_size", .type = CWI_P_ANY, .flags = CWI_PF_REQUIRED,
	.help = "rows per batch, or a list of sizes used in turn (each "
		"1 to 2^31-1)"},
    {.name = "drop_remainder", .type = CWI_P_BOOL, .def_int = 0,
	.help = "drop a last batch smaller than its size"},
};

const cwi_dataset_op cwi_op_rebatch = {
    .name = "rebatch",
    .doc = "regroups the rows of batched elements into batches of "
	   "batch_size rows, or of a list of sizes in turn",
    .params = rebatch_params,
    .nparams = sizeof(rebatch_params) / sizeof(rebatch_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = rebatch_create,
    .saves = "the index of the next size, the rows of the partial batch, "
	"and the rows' unbatch state with the input",
    .infer = rebatch_infer,
    .note = "As tf.data's rebatch, batches take rows across the input's "
	"batch boundaries, and with a list the sizes repeat in turn "
	"(`batch_size=[2, 1, 1]`). Through the service it runs in the client "
	"part (it groups by position in the whole stream).",
};
