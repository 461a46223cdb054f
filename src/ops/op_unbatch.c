/*
 * op_unbatch.c - unbatch(): splits every element along dimension 0 into
 * its rows, as zero-copy views of the batch's buffers.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct unbatch_iter {
	cwi_iter base;
	cwi_iter *input;
	cwi_chunk in;      /* pulled batches: in.v[pos..n) not yet split */
	size_t pos;
	cwi_element *cur;  /* the batch being split */
	int64_t row, rows; /* next row of cur, and its row count */
	int64_t last_rows; /* rows of the previous batch: sizes the next pull */
	uint64_t index;    /* batches taken from the input */
	bool input_done;
} unbatch_iter;

/* Every component must have rank >= 1 and the same dimension 0. */
static cachew_err
check_batch(unbatch_iter *u, const cwi_element *e)
{
	char spec[96];

	for (uint32_t c = 0; c < e->n; c++) {
		const cwi_tensor *t = &e->comp[c];
		if (t->rank == 0)
			return cwi_pipeline_fail(u->base.pl, CACHEW_ETYPE,
			    "unbatch: component %u of element %llu is %s, a "
			    "scalar with no dimension 0 to split",
			    c, (unsigned long long)u->index,
			    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		if (t->shape[0] != e->comp[0].shape[0])
			return cwi_pipeline_fail(u->base.pl, CACHEW_ETYPE,
			    "unbatch: component %u of element %llu has %lld "
			    "rows but component 0 has %lld; all components "
			    "must share dimension 0",
			    c, (unsigned long long)u->index,
			    (long long)t->shape[0],
			    (long long)e->comp[0].shape[0]);
	}
	return CACHEW_OK;
}

/* Makes u->cur the next batch; CACHEW_EOF at the input's end. */
static cachew_err
next_batch(unbatch_iter *u, size_t want)
{
	cachew_err rv;

	cwi_element_release(u->cur);
	u->cur = NULL;
	if (u->pos == u->in.n) {
		u->in.n = 0;
		u->pos = 0;
		if (u->input_done)
			return CACHEW_EOF;
		rv = cwi_iter_next(u->input, &u->in, want);
		if (rv == CACHEW_EOF)
			u->input_done = true;
		if (rv != CACHEW_OK)
			return rv;
	}
	u->cur = u->in.v[u->pos++];
	rv = check_batch(u, u->cur);
	u->index++;
	if (rv != CACHEW_OK)
		return rv;
	u->row = 0;
	u->rows = u->cur->comp[0].shape[0];
	if (u->rows > 0)
		u->last_rows = u->rows;
	return CACHEW_OK;
}

/* Row r of every component of e, without the leading dimension. */
static cwi_element *
split_row(const cwi_element *e, int64_t r)
{
	cwi_element *row = cwi_element_new(e->n);

	if (row == NULL)
		return NULL;
	for (uint32_t c = 0; c < e->n; c++) {
		cwi_tensor *t = &row->comp[c];
		/* Cannot fail: rank >= 1 and r < rows were checked. */
		(void)cwi_tensor_slice(t, &e->comp[c], r, 1);
		memmove(t->shape, t->shape + 1,
		    (size_t)(t->rank - 1) * sizeof(t->shape[0]));
		t->rank--;
		t->shape[t->rank] = 0;
	}
	return row;
}

static cachew_err
unbatch_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	unbatch_iter *u = (unbatch_iter *)it;
	size_t got = 0;
	cachew_err rv;

	while (got < max) {
		if (u->cur == NULL || u->row == u->rows) {
			/* Pull about as many batches as the rows wanted. */
			size_t per = u->last_rows > 0 ? (size_t)u->last_rows : 1;
			rv = next_batch(u, (max - got + per - 1) / per);
			if (rv == CACHEW_EOF)
				break;
			if (rv != CACHEW_OK)
				return rv;
			continue;
		}
		cwi_element *e = split_row(u->cur, u->row);
		if (e == NULL)
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "unbatch: out of memory");
		cwi_chunk_push(out, e);
		u->row++;
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
unbatch_destroy(cwi_iter *it)
{
	unbatch_iter *u = (unbatch_iter *)it;

	cwi_iter_destroy(u->input);
	cwi_element_release(u->cur);
	for (size_t i = u->pos; i < u->in.n; i++)
		cwi_element_release(u->in.v[i]);
	free(u->in.v);
	free(u);
}

/* [index, last rows, input done, next row, the batch being split (none
 * or one), pulled batches, input]. */
static cachew_err
unbatch_save(cwi_iter *it, cwi_state_writer *w)
{
	unbatch_iter *u = (unbatch_iter *)it;
	bool cur = u->cur != NULL && u->row < u->rows;
	cachew_err rv;

	cwi_sw_array(w, 7);
	cwi_sw_uint(w, u->index);
	cwi_sw_int(w, u->last_rows);
	cwi_sw_bool(w, u->input_done);
	cwi_sw_int(w, cur ? u->row : 0);
	rv = cwi_sw_elements(w, &u->cur, cur ? 1 : 0);
	if (rv == CACHEW_OK)
		rv = cwi_sw_elements(w, u->in.v + u->pos, u->in.n - u->pos);
	if (rv == CACHEW_OK)
		rv = cwi_iter_save(u->input, w);
	return rv;
}

static cachew_err
unbatch_restore(cwi_iter *it, cwi_state_reader *r)
{
	unbatch_iter *u = (unbatch_iter *)it;
	cwi_chunk cur = {0};
	int64_t row = 0;

	if (!cwi_sr_array(r, "unbatch", 7) ||
	    !cwi_sr_uint(r, "index", &u->index, UINT64_MAX) ||
	    !cwi_sr_int(r, "last rows", &u->last_rows, 0, INT64_MAX) ||
	    !cwi_sr_bool(r, "input done", &u->input_done) ||
	    !cwi_sr_int(r, "row", &row, 0, INT64_MAX) ||
	    !cwi_sr_elements(r, "batch", &cur))
		goto fail;
	if (cur.n > 1) {
		cwi_sr_fail(r, CACHEW_ECORRUPT, "%zu current batches", cur.n);
		goto fail;
	}
	if (cur.n == 1) {
		const cwi_element *e = cur.v[0];
		for (uint32_t c = 0; c < e->n; c++)
			if (e->comp[c].rank == 0 ||
			    e->comp[c].shape[0] != e->comp[0].shape[0]) {
				cwi_sr_fail(r, CACHEW_ECORRUPT,
				    "the current batch has no common "
				    "dimension 0");
				goto fail;
			}
		if (row >= e->comp[0].shape[0]) {
			cwi_sr_fail(r, CACHEW_ECORRUPT,
			    "row %lld of a batch of %lld", (long long)row,
			    (long long)e->comp[0].shape[0]);
			goto fail;
		}
		u->cur = cur.v[0];
		u->row = row;
		u->rows = e->comp[0].shape[0];
		cur.n = 0;
	}
	cwi_chunk_free(&cur);
	if (!cwi_sr_elements(r, "pulled", &u->in))
		return cwi_sr_error(r);
	u->pos = 0;
	return cwi_iter_restore(u->input, r);
fail:
	cwi_chunk_free(&cur);
	return cwi_sr_error(r);
}

static const cwi_iter_ops unbatch_iter_ops = {
    .next = unbatch_next,
    .destroy = unbatch_destroy,
    .save = unbatch_save,
    .restore = unbatch_restore,
};

static cachew_err
unbatch_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	unbatch_iter *u = calloc(1, sizeof(*u));
	cachew_err rv;

	if (u == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	u->base.ops = &unbatch_iter_ops;
	rv = cwi_iter_create(&u->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(u);
		return rv;
	}
	*out = &u->base;
	return CACHEW_OK;
}

/* Drops dimension 0 of every component, which must have one (tf.data
 * refuses a scalar when building too). c batches of a known size k are
 * c * k elements. */
static cachew_err
unbatch_infer(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	int64_t rows = -1, c = node->inputs[0]->card;
	char label[96];
	cachew_err rv;

	node->card = c == CACHEW_CARDINALITY_INFINITE || c == 0
	    ? c : CACHEW_CARDINALITY_UNKNOWN;
	if (!in->known)
		return CACHEW_OK;
	rv = cwi_spec_copy(&node->spec, in);
	for (uint32_t i = 0; rv == CACHEW_OK && i < in->n; i++) {
		cwi_comp_spec *s = &node->spec.comp[i];
		if (s->rank == CWI_RANK_UNKNOWN) {
			rows = -2;
			continue;
		}
		if (s->rank == 0) {
			const char *dt = cachew_dtype_name(
			    (cachew_dtype)in->comp[i].dtype);
			cwi_spec_free(&node->spec);
			return cwi_fail(CACHEW_ETYPE, "unbatch: %s is a scalar "
			    "(%s[]): it has no dimension to split",
			    cwi_comp_spec_label(in, i, label, sizeof(label)),
			    dt != NULL ? dt : "?");
		}
		if (rows == -1 || (rows >= 0 && rows != s->shape[0]))
			rows = rows == -1 ? s->shape[0] : -2;
		s->rank--;
		memmove(s->shape, s->shape + 1, s->rank * sizeof(s->shape[0]));
		s->shape[s->rank] = 0;
	}
	if (rv == CACHEW_OK && c > 0 && rows >= 0)
		node->card = cwi_card_mul(c, rows);
	return rv;
}

const cwi_dataset_op cwi_op_unbatch = {
    .name = "unbatch",
    .doc = "splits every element along dimension 0 into its rows",
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = unbatch_create,
    .saves = "the batch being split and its next row, batches pulled ahead, "
	"and the input",
    .infer = unbatch_infer,
};
