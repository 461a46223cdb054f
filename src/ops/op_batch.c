/*
 * op_batch.c - batch(n, drop_remainder): stacks n consecutive elements.
 */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>

static cachew_err
stack_fixed(cwi_element *const *elems, size_t k, uint32_t c, cwi_tensor *dst)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	int64_t shape[CACHEW_MAX_RANK];
	size_t row;
	uint8_t *p;
	cachew_err rv;

	shape[0] = (int64_t)k;
	for (unsigned i = 0; i < t0->rank; i++)
		shape[i + 1] = t0->shape[i];
	rv = cwi_tensor_init_alloc(dst, (cachew_dtype)t0->dtype,
	    t0->rank + 1u, shape, false, &p);
	if (rv != CACHEW_OK)
		return rv;
	row = cwi_tensor_nbytes(t0);
	if (row == 8) {
		/* The common scalar case: let the compiler inline it. */
		for (size_t i = 0; i < k; i++)
			memcpy(p + i * 8, cwi_tensor_data(&elems[i]->comp[c]), 8);
	} else {
		for (size_t i = 0; i < k; i++)
			memcpy(p + i * row, cwi_tensor_data(&elems[i]->comp[c]),
			    row);
	}
	/* Inline results point into dst: nothing else to do. */
	return CACHEW_OK;
}

static cachew_err
stack_bytes(cwi_element *const *elems, size_t k, uint32_t c, cwi_tensor *dst)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	int64_t per = cwi_tensor_numel(t0);
	size_t total = 0, n = k * (size_t)per;
	cwi_buffer *data = NULL, *offs = NULL;
	uint64_t *o, pos = 0;
	cachew_err rv;

	for (size_t i = 0; i < k; i++)
		total += cwi_tensor_nbytes(&elems[i]->comp[c]);
	rv = cwi_buffer_alloc(&data, total, false);
	if (rv != CACHEW_OK)
		return rv;
	memset(dst, 0, sizeof(*dst));
	dst->dtype = CACHEW_BYTES;
	dst->rank = (uint8_t)(t0->rank + 1);
	dst->shape[0] = (int64_t)k;
	for (unsigned i = 0; i < t0->rank; i++)
		dst->shape[i + 1] = t0->shape[i];
	if (n <= 1) {
		o = dst->inl.u64;
	} else {
		rv = cwi_buffer_alloc(&offs, (n + 1) * sizeof(uint64_t), false);
		if (rv != CACHEW_OK) {
			cwi_buffer_unref(data);
			return rv;
		}
		o = (uint64_t *)offs->data;
	}
	o[0] = 0;
	for (size_t i = 0, j = 0; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[c];
		for (int64_t s = 0; s < per; s++, j++) {
			size_t len;
			const uint8_t *str = cwi_tensor_str(t, s, &len);
			if (len > 0)
				memcpy(data->data + pos, str, len);
			pos += len;
			o[j + 1] = pos;
		}
	}
	if (n == 0)
		o[1] = 0;
	dst->buf = data;
	dst->obuf = offs;
	return CACHEW_OK;
}

cachew_err
cwi_stack(cwi_element *const *elems, size_t k, cwi_element **out, char *err,
    size_t errlen)
{
	const cwi_element *e0 = elems[0];
	cwi_element *res;
	char want[96], got[96];
	cachew_err rv = CACHEW_OK;

	for (size_t i = 1; i < k; i++) {
		if (elems[i]->n != e0->n) {
			snprintf(err, errlen,
			    "element %zu has %u components, expected %u", i,
			    elems[i]->n, e0->n);
			return CACHEW_ETYPE;
		}
		for (uint32_t c = 0; c < e0->n; c++) {
			if (cwi_tensor_same_spec(&elems[i]->comp[c], &e0->comp[c]))
				continue;
			snprintf(err, errlen,
			    "element %zu component %u is %s, expected %s (use "
			    "padded_batch for varying shapes)",
			    i, c, cwi_tensor_spec_str(&elems[i]->comp[c], got,
				      sizeof(got)),
			    cwi_tensor_spec_str(&e0->comp[c], want, sizeof(want)));
			return CACHEW_ETYPE;
		}
	}
	for (uint32_t c = 0; c < e0->n; c++) {
		if (e0->comp[c].rank >= CACHEW_MAX_RANK) {
			snprintf(err, errlen,
			    "component %u already has the maximum rank %d", c,
			    CACHEW_MAX_RANK);
			return CACHEW_ETYPE;
		}
	}
	res = cwi_element_new(e0->n);
	if (res == NULL)
		return CACHEW_ENOMEM;
	for (uint32_t c = 0; c < e0->n && rv == CACHEW_OK; c++) {
		if (e0->comp[c].dtype == CACHEW_BYTES)
			rv = stack_bytes(elems, k, c, &res->comp[c]);
		else
			rv = stack_fixed(elems, k, c, &res->comp[c]);
	}
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "%s", cwi_errmsg_get());
		cwi_element_release(res);
		return rv;
	}
	*out = res;
	return CACHEW_OK;
}

typedef struct batch_iter {
	cwi_iter base;
	cwi_iter *input;
	size_t n;
	bool drop_remainder;
	bool input_done;
	cwi_chunk pending;
} batch_iter;

static cachew_err
batch_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	batch_iter *b = (batch_iter *)it;
	char err[256];
	size_t got = 0;
	cachew_err rv;

	while (got < max) {
		while (!b->input_done && b->pending.n < b->n) {
			rv = cwi_iter_next(b->input, &b->pending,
			    b->n - b->pending.n);
			if (rv == CACHEW_EOF)
				b->input_done = true;
			else if (rv != CACHEW_OK)
				return rv;
		}
		if (b->pending.n == 0 ||
		    (b->pending.n < b->n && b->drop_remainder)) {
			cwi_chunk_clear(&b->pending);
			break;
		}
		cwi_element *res = NULL;
		rv = cwi_stack(b->pending.v, b->pending.n, &res, err, sizeof(err));
		if (rv != CACHEW_OK)
			return cwi_pipeline_fail(it->pl, rv, "batch: %s", err);
		cwi_chunk_clear(&b->pending);
		cwi_chunk_push(out, res);
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
batch_destroy(cwi_iter *it)
{
	batch_iter *b = (batch_iter *)it;
	cwi_iter_destroy(b->input);
	cwi_chunk_free(&b->pending);
	free(b);
}

static const cwi_iter_ops batch_iter_ops = {
    .next = batch_next,
    .destroy = batch_destroy,
};

static cachew_err
batch_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	batch_iter *b = calloc(1, sizeof(*b));
	cachew_err rv;

	if (b == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	b->base.ops = &batch_iter_ops;
	b->n = (size_t)cwi_node_int(node, "n");
	b->drop_remainder = cwi_node_bool(node, "drop_remainder");
	rv = cwi_chunk_reserve(&b->pending, b->n);
	if (rv == CACHEW_OK)
		rv = cwi_iter_create(&b->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		cwi_chunk_free(&b->pending);
		free(b);
		return rv;
	}
	*out = &b->base;
	return CACHEW_OK;
}

static const cwi_param_spec batch_params[] = {
    {.name = "n", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = 1,
	.max = INT32_MAX, .help = "elements per batch"},
    {.name = "drop_remainder", .type = CWI_P_BOOL, .def_int = 0,
	.help = "drop a last batch smaller than n"},
};

const cwi_dataset_op cwi_op_batch = {
    .name = "batch",
    .doc = "stacks n consecutive elements along a new leading dimension",
    .params = batch_params,
    .nparams = sizeof(batch_params) / sizeof(batch_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = batch_create,
};
