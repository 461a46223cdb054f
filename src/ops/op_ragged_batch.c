/*
 * op_ragged_batch.c - ragged_batch(n, drop_remainder, row_splits_dtype):
 * tf.data's ragged_batch over dense tensors.
 *
 * cachew tensors are dense, so a ragged batch is stored the way a
 * tf.RaggedTensor of ragged_rank 1 is underneath: a component whose
 * dimension 0 varies between elements becomes two components, its flat
 * values (the elements' rows concatenated: [sum of lengths, d1, ...]) and
 * its row_splits ([k + 1]: row_splits[i] is where element i's rows start,
 * row_splits[k] the total). A component of a fully known shape is
 * stacked as batch stacks it, as tf.data keeps such components dense.
 * docs/element-spec.md describes the layout.
 *
 * Which components are ragged is decided when the dataset is built, from
 * the input's element spec: those with rank >= 1 and an unknown
 * dimension. When the spec is not known (a user function upstream) every
 * component of rank >= 1 is ragged. Only dimension 0 may vary within a
 * batch (tf.data's nested row_splits for a second ragged dimension are
 * left out): elements whose other dimensions differ are refused.
 */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct ragged_iter {
	cwi_iter base;
	cwi_batch_group g;
	bool drop_remainder;
	bool spec_known;   /* else: every rank >= 1 component is ragged */
	bool ragged[CACHEW_MAX_COMPONENTS];
	cachew_dtype splits_dtype;
} ragged_iter;

/* A component of a known spec is ragged when it has a dimension the spec
 * does not know. */
static bool
comp_is_ragged(const cwi_comp_spec *s)
{
	if (s->rank == CWI_RANK_UNKNOWN)
		return true;
	for (unsigned d = 0; d < s->rank; d++)
		if (s->shape[d] < 0)
			return true;
	return false;
}

static cachew_err
splits_dtype_of(const cwi_node *node, cachew_dtype *dt)
{
	const char *s = cwi_node_str(node, "row_splits_dtype");

	if (strcmp(s, "i64") == 0 || strcmp(s, "int64") == 0)
		*dt = CACHEW_I64;
	else if (strcmp(s, "i32") == 0 || strcmp(s, "int32") == 0)
		*dt = CACHEW_I32;
	else
		return cwi_fail(CACHEW_EINVAL, "ragged_batch: row_splits_dtype "
		    "'%s' is neither i64 nor i32", s);
	return CACHEW_OK;
}

/* ---- one ragged component ------------------------------------------------- */

/* Checks that component c of every element has element 0's dtype, rank
 * >= 1 and dimensions 1.. (only dimension 0 may vary). */
static cachew_err
ragged_check(cwi_element *const *elems, size_t k, uint32_t c, char *err,
    size_t errlen)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	char got[96], want[96];

	for (size_t i = 0; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[c];
		bool same = t->dtype == t0->dtype && t->rank == t0->rank &&
		    t->rank >= 1;
		for (unsigned d = 1; same && d < t->rank; d++)
			same = t->shape[d] == t0->shape[d];
		if (same)
			continue;
		snprintf(err, errlen, "element %zu component %u is %s, expected "
		    "%s with only dimension 0 varying", i, c,
		    cwi_tensor_spec_str(t, got, sizeof(got)),
		    t0->rank == 0 ? "a tensor of rank >= 1"
				  : cwi_tensor_spec_str(t0, want, sizeof(want)));
		return CACHEW_ETYPE;
	}
	return CACHEW_OK;
}

/* The values of component c of the k elements, one after the other, as
 * one tensor of the given shape (which holds exactly that many values):
 * the flat values of a ragged component, or a dense stack. */
static cachew_err
concat_fixed(cwi_element *const *elems, size_t k, uint32_t c, unsigned rank,
    const int64_t *shape, cwi_tensor *dst)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	uint8_t *p;
	cachew_err rv;

	rv = cwi_tensor_init_alloc(dst, (cachew_dtype)t0->dtype, rank, shape,
	    false, &p);
	for (size_t i = 0; rv == CACHEW_OK && i < k; i++) {
		size_t len = cwi_tensor_nbytes(&elems[i]->comp[c]);
		if (len > 0)
			memcpy(p, cwi_tensor_data(&elems[i]->comp[c]), len);
		p += len;
	}
	return rv;
}

static cachew_err
concat_bytes(cwi_element *const *elems, size_t k, uint32_t c, unsigned rank,
    const int64_t *shape, cwi_tensor *dst)
{
	size_t total = 0, n = (size_t)cwi_shape_numel(rank, shape);
	cwi_buffer *data = NULL, *offs = NULL;
	uint64_t *o, pos = 0;
	cachew_err rv;

	for (size_t i = 0; i < k; i++)
		total += cwi_tensor_nbytes(&elems[i]->comp[c]);
	rv = cwi_buffer_alloc(&data, total, false);
	if (rv == CACHEW_OK && n > 1)
		rv = cwi_buffer_alloc(&offs, (n + 1) * sizeof(uint64_t), false);
	if (rv != CACHEW_OK) {
		cwi_buffer_unref(data);
		return rv;
	}
	memset(dst, 0, sizeof(*dst));
	dst->dtype = CACHEW_BYTES;
	dst->rank = (uint8_t)rank;
	memcpy(dst->shape, shape, rank * sizeof(shape[0]));
	o = n > 1 ? (uint64_t *)offs->data : dst->inl.u64;
	o[0] = 0;
	o[1] = 0;
	for (size_t i = 0, j = 0; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[c];
		int64_t m = cwi_tensor_numel(t);
		for (int64_t s = 0; s < m; s++, j++) {
			size_t len;
			const uint8_t *str = cwi_tensor_str(t, s, &len);
			if (len > 0)
				memcpy(data->data + pos, str, len);
			pos += len;
			o[j + 1] = pos;
		}
	}
	dst->buf = data;
	dst->obuf = offs;
	return CACHEW_OK;
}

static cachew_err
row_splits(cwi_element *const *elems, size_t k, uint32_t c, cachew_dtype dt,
    cwi_tensor *dst)
{
	int64_t shape[1] = {(int64_t)k + 1}, at = 0;
	uint8_t *p;
	cachew_err rv;

	rv = cwi_tensor_init_alloc(dst, dt, 1, shape, false, &p);
	for (size_t i = 0; rv == CACHEW_OK && i <= k; i++) {
		if (dt == CACHEW_I64) {
			memcpy(p + i * 8, &at, 8);
		} else {
			int32_t x = (int32_t)at;
			memcpy(p + i * 4, &x, 4);
		}
		if (i < k)
			at += elems[i]->comp[c].shape[0];
	}
	return rv;
}

/* Component c as flat values and row splits, into dst[0] and dst[1]. */
static cachew_err
ragged_comp(const ragged_iter *r, cwi_element *const *elems, size_t k,
    uint32_t c, cwi_tensor *dst, char *err, size_t errlen)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	int64_t shape[CACHEW_MAX_RANK];
	cachew_err rv;

	rv = ragged_check(elems, k, c, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(shape, t0->shape, t0->rank * sizeof(shape[0]));
	shape[0] = 0;
	for (size_t i = 0; i < k; i++)
		shape[0] += elems[i]->comp[c].shape[0];
	if (r->splits_dtype == CACHEW_I32 && shape[0] > INT32_MAX) {
		snprintf(err, errlen, "component %u has %lld rows in a batch, "
		    "more than i32 row_splits hold", c, (long long)shape[0]);
		return CACHEW_ERANGE;
	}
	rv = t0->dtype == CACHEW_BYTES
	    ? concat_bytes(elems, k, c, t0->rank, shape, &dst[0])
	    : concat_fixed(elems, k, c, t0->rank, shape, &dst[0]);
	if (rv == CACHEW_OK) {
		rv = row_splits(elems, k, c, r->splits_dtype, &dst[1]);
		if (rv != CACHEW_OK)
			cwi_tensor_clear(&dst[0]);
	}
	if (rv != CACHEW_OK)
		snprintf(err, errlen, "%s", cwi_errmsg_get());
	return rv;
}

/* Component c stacked as batch stacks it: every element's must have
 * element 0's dtype and shape. */
static cachew_err
dense_comp(cwi_element *const *elems, size_t k, uint32_t c, cwi_tensor *dst,
    char *err, size_t errlen)
{
	const cwi_tensor *t0 = &elems[0]->comp[c];
	int64_t shape[CACHEW_MAX_RANK];
	char got[96], want[96];
	cachew_err rv;

	for (size_t i = 1; i < k; i++) {
		if (cwi_tensor_same_spec(&elems[i]->comp[c], t0))
			continue;
		snprintf(err, errlen, "element %zu component %u is %s, expected "
		    "%s (the element spec says its shape is fixed)", i, c,
		    cwi_tensor_spec_str(&elems[i]->comp[c], got, sizeof(got)),
		    cwi_tensor_spec_str(t0, want, sizeof(want)));
		return CACHEW_ETYPE;
	}
	if (t0->rank >= CACHEW_MAX_RANK) {
		snprintf(err, errlen, "component %u already has the maximum "
		    "rank %d", c, CACHEW_MAX_RANK);
		return CACHEW_ETYPE;
	}
	shape[0] = (int64_t)k;
	memcpy(shape + 1, t0->shape, t0->rank * sizeof(shape[0]));
	rv = t0->dtype == CACHEW_BYTES
	    ? concat_bytes(elems, k, c, t0->rank + 1u, shape, dst)
	    : concat_fixed(elems, k, c, t0->rank + 1u, shape, dst);
	if (rv != CACHEW_OK)
		snprintf(err, errlen, "%s", cwi_errmsg_get());
	return rv;
}

/* ---- the batch ------------------------------------------------------------ */

/* Is component c ragged, for elements of e0's structure? */
static bool
is_ragged(const ragged_iter *r, const cwi_element *e0, uint32_t c)
{
	return r->spec_known ? r->ragged[c] : e0->comp[c].rank >= 1;
}

static cachew_err
ragged_stack(ragged_iter *r, cwi_element **out, char *err, size_t errlen)
{
	cwi_element *const *elems = r->g.pending.v;
	size_t k = r->g.pending.n;
	const cwi_element *e0 = elems[0];
	uint32_t nout = 0, o = 0;
	cwi_element *res;
	cachew_err rv = CACHEW_OK;

	for (size_t i = 1; i < k; i++) {
		if (elems[i]->n != e0->n) {
			snprintf(err, errlen, "element %zu has %u components, "
			    "expected %u", i, elems[i]->n, e0->n);
			return CACHEW_ETYPE;
		}
	}
	for (uint32_t c = 0; c < e0->n; c++)
		nout += is_ragged(r, e0, c) ? 2 : 1;
	if (nout > CACHEW_MAX_COMPONENTS) {
		snprintf(err, errlen, "%u components, %u of them ragged, make "
		    "%u, more than the maximum of %d", e0->n, nout - e0->n,
		    nout, CACHEW_MAX_COMPONENTS);
		return CACHEW_ETYPE;
	}
	res = cwi_element_new(nout);
	if (res == NULL) {
		snprintf(err, errlen, "out of memory");
		return CACHEW_ENOMEM;
	}
	for (uint32_t c = 0; c < e0->n && rv == CACHEW_OK; c++) {
		if (is_ragged(r, e0, c)) {
			rv = ragged_comp(r, elems, k, c, &res->comp[o], err,
			    errlen);
			o += 2;
			continue;
		}
		rv = dense_comp(elems, k, c, &res->comp[o], err, errlen);
		o++;
	}
	if (rv != CACHEW_OK) {
		cwi_element_release(res);
		return rv;
	}
	*out = res;
	return CACHEW_OK;
}

/* ---- the iterator: batch's collector ---------------------------------------- */

static cachew_err
ragged_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	ragged_iter *r = (ragged_iter *)it;
	char err[256];
	size_t got = 0;
	cachew_err rv;

	while (got < max) {
		rv = cwi_batch_group_fill(&r->g, it);
		if (rv != CACHEW_OK)
			return rv;
		if (r->g.pending.n == 0 ||
		    (r->g.pending.n < r->g.n && r->drop_remainder)) {
			cwi_chunk_clear(&r->g.pending);
			r->g.pending_bytes = 0;
			break;
		}
		cwi_element *res = NULL;
		rv = ragged_stack(r, &res, err, sizeof(err));
		if (rv != CACHEW_OK)
			return cwi_pipeline_fail(it->pl, rv, "ragged_batch: %s",
			    err);
		cwi_chunk_clear(&r->g.pending);
		r->g.pending_bytes = 0;
		if (cwi_chunk_reserve(out, 1) != CACHEW_OK) {
			cwi_element_release(res);
			return cwi_pipeline_fail(it->pl, CACHEW_ENOMEM,
			    "ragged_batch: out of memory");
		}
		cwi_chunk_push(out, res);
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
ragged_destroy(cwi_iter *it)
{
	ragged_iter *r = (ragged_iter *)it;

	cwi_batch_group_fini(&r->g);
	free(r);
}

static cachew_err
ragged_save(cwi_iter *it, cwi_state_writer *w)
{
	return cwi_batch_group_save(&((ragged_iter *)it)->g, w);
}

static cachew_err
ragged_restore(cwi_iter *it, cwi_state_reader *rd)
{
	return cwi_batch_group_restore(&((ragged_iter *)it)->g, rd,
	    "ragged_batch");
}

static const cwi_iter_ops ragged_iter_ops = {
    .next = ragged_next,
    .destroy = ragged_destroy,
    .save = ragged_save,
    .restore = ragged_restore,
};

static cachew_err
ragged_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	ragged_iter *r = calloc(1, sizeof(*r));
	cachew_err rv;

	if (r == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->base.ops = &ragged_iter_ops;
	r->drop_remainder = cwi_node_bool(node, "drop_remainder");
	r->spec_known = in->known;
	for (uint32_t c = 0; in->known && c < in->n; c++)
		r->ragged[c] = comp_is_ragged(&in->comp[c]);
	rv = splits_dtype_of(node, &r->splits_dtype);
	if (rv == CACHEW_OK)
		rv = cwi_batch_group_init(&r->g, node, args);
	if (rv != CACHEW_OK) {
		free(r);
		return rv;
	}
	*out = &r->base;
	return CACHEW_OK;
}

/* ---- spec ------------------------------------------------------------------- */

/* "<name>_row_splits" for a named component's splits, else unnamed. */
static cachew_err
splits_name(cwi_comp_spec *dst, const char *name)
{
	char buf[300];

	if (name == NULL)
		return cwi_comp_spec_name(dst, NULL);
	snprintf(buf, sizeof(buf), "%s_row_splits", name);
	return cwi_comp_spec_name(dst, buf);
}

/* A dense component as batch's; a ragged one as values [-1, d1, ...]
 * (n * d0 when both are known) and row_splits [n + 1] (-1 without
 * drop_remainder). Cardinality as batch. */
static cachew_err
ragged_infer(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	int64_t n = cwi_node_int(node, "n");
	bool drop = cwi_node_bool(node, "drop_remainder");
	int64_t c = node->inputs[0]->card;
	cachew_dtype sdt;
	uint32_t nout = 0, o = 0;
	char label[96];
	cachew_err rv;

	rv = splits_dtype_of(node, &sdt);
	if (rv != CACHEW_OK)
		return rv;
	node->card = c < 0 ? c : drop ? c / n : c / n + (c % n != 0);
	if (!in->known)
		return CACHEW_OK;
	for (uint32_t i = 0; i < in->n; i++) {
		const cwi_comp_spec *s = &in->comp[i];
		if (s->rank == CWI_RANK_UNKNOWN)
			return cwi_fail(CACHEW_ETYPE, "ragged_batch: the rank of "
			    "%s is not known: whether it is ragged must be",
			    cwi_comp_spec_label(in, i, label, sizeof(label)));
		if (s->rank == CACHEW_MAX_RANK && !comp_is_ragged(s))
			return cwi_fail(CACHEW_ETYPE, "ragged_batch: %s already "
			    "has rank %d, the most a tensor has",
			    cwi_comp_spec_label(in, i, label, sizeof(label)),
			    CACHEW_MAX_RANK);
		nout += comp_is_ragged(s) ? 2 : 1;
	}
	if (nout > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_ETYPE, "ragged_batch: %u components "
		    "would become %u (values and row_splits for each ragged "
		    "one), more than the maximum of %d", in->n, nout,
		    CACHEW_MAX_COMPONENTS);
	rv = cwi_spec_init(&node->spec, nout);
	for (uint32_t i = 0; rv == CACHEW_OK && i < in->n; i++) {
		const cwi_comp_spec *s = &in->comp[i];
		cwi_comp_spec *v = &node->spec.comp[o];
		v->dtype = s->dtype;
		rv = cwi_comp_spec_name(v, s->name);
		if (rv != CACHEW_OK)
			break;
		if (!comp_is_ragged(s)) {
			v->rank = (uint8_t)(s->rank + 1);
			v->shape[0] = drop ? n : -1;
			memcpy(v->shape + 1, s->shape,
			    s->rank * sizeof(s->shape[0]));
			o++;
			continue;
		}
		v->rank = s->rank;
		memcpy(v->shape, s->shape, s->rank * sizeof(s->shape[0]));
		v->shape[0] = drop && s->shape[0] >= 0 ? n * s->shape[0] : -1;
		node->spec.comp[o + 1].dtype = (uint8_t)sdt;
		node->spec.comp[o + 1].rank = 1;
		node->spec.comp[o + 1].shape[0] = drop ? n + 1 : -1;
		rv = splits_name(&node->spec.comp[o + 1], s->name);
		o += 2;
	}
	if (rv != CACHEW_OK)
		cwi_spec_free(&node->spec);
	return rv;
}

static const cwi_param_spec ragged_params[] = {
    {.name = "n", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = 1,
	.max = INT32_MAX, .help = "elements per batch"},
    {.name = "drop_remainder", .type = CWI_P_BOOL, .def_int = 0,
	.help = "drop a last batch smaller than n"},
    {.name = "row_splits_dtype", .type = CWI_P_STR, .def_str = "i64",
	.help = "dtype of the row_splits components: i64 or i32"},
};

const cwi_dataset_op cwi_op_ragged_batch = {
    .name = "ragged_batch",
    .doc = "batches n consecutive elements whose dimension 0 varies, each "
	   "such component as flat values and row_splits (a ragged tensor)",
    .params = ragged_params,
    .nparams = sizeof(ragged_params) / sizeof(ragged_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = ragged_create,
    .saves = "the elements of the partial batch, and the input",
    .infer = ragged_infer,
    .note = "tf.data's `ragged_batch`. Tensors here are dense, so a "
	"ragged batch is stored as tf.RaggedTensor stores one underneath: a "
	"component with a dimension the element spec does not know becomes "
	"two components, its flat values (the elements' rows one after the "
	"other, `[total rows, d1, ...]`) and its `row_splits` (`[n + 1]`, "
	"where each element's rows start; named `<name>_row_splits` for a "
	"named component); a component of a fully known shape is stacked "
	"as batch stacks it, as tf.data keeps it dense "
	"(docs/element-spec.md, \"Ragged batches\"). One ragged dimension "
	"(ragged_rank 1): the elements' other dimensions must agree within a "
	"batch. Through the service it runs in the client part, in split "
	"order in a private job.",
};
