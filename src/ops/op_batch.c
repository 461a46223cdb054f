/*
 * op_batch.c - batch(n, drop_remainder) stacks n consecutive elements;
 * padded_batch(n, pad_value, drop_remainder, shape) does the same for
 * elements of varying shapes (the padding itself is in op_padded_batch.c).
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* batch(parallel=N) copies a batch's rows on N threads when the batch is
 * at least this large: below it a thread's start (tens of microseconds)
 * costs more than the copy it takes over. */
#define STACK_PARALLEL_MIN_BYTES (1u << 20)

/* Rows [from, to) of component c, copied into their places at dst. */
typedef struct stack_part {
	cwi_element *const *elems;
	uint32_t c;
	size_t row, from, to;
	uint8_t *dst;
} stack_part;

static void *
stack_part_run(void *arg)
{
	const stack_part *sp = arg;

	for (size_t i = sp->from; i < sp->to; i++)
		memcpy(sp->dst + i * sp->row,
		    cwi_tensor_data(&sp->elems[i]->comp[sp->c]), sp->row);
	return NULL;
}

/* Copies the k rows of component c into p, on up to `parallel` threads
 * (this one included) for a large batch. A thread that cannot start
 * leaves its rows to this one: the result is the same either way. */
static void
stack_rows(cwi_element *const *elems, size_t k, uint32_t c, size_t row,
    uint8_t *p, int parallel)
{
	stack_part parts[CWI_STACK_MAX_PARALLEL];
	pthread_t tid[CWI_STACK_MAX_PARALLEL];
	bool started[CWI_STACK_MAX_PARALLEL] = {false};
	size_t np = parallel < 1 ? 1 : (size_t)parallel;

	if (np > CWI_STACK_MAX_PARALLEL)
		np = CWI_STACK_MAX_PARALLEL;
	if (np > k)
		np = k;
	if (np <= 1 || (uint64_t)k * row < STACK_PARALLEL_MIN_BYTES)
		np = 1;
	for (size_t t = 0; t < np; t++) {
		parts[t] = (stack_part){.elems = elems, .c = c, .row = row,
		    .from = k * t / np, .to = k * (t + 1) / np, .dst = p};
		if (t > 0)
			started[t] = pthread_create(&tid[t], NULL,
			    stack_part_run, &parts[t]) == 0;
	}
	(void)stack_part_run(&parts[0]);
	for (size_t t = 1; t < np; t++) {
		if (started[t])
			pthread_join(tid[t], NULL);
		else
			(void)stack_part_run(&parts[t]);
	}
}

static cachew_err
stack_fixed(cwi_element *const *elems, size_t k, uint32_t c, cwi_tensor *dst,
    int parallel)
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
		stack_rows(elems, k, c, row, p, parallel);
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

/* One pass for the commonest batch: elements of one fixed-width scalar
 * (range | map | batch). Returns false, having built nothing, when the
 * elements are anything else, so the general path reports the mismatch. */
static bool
stack_scalars(cwi_element *const *elems, size_t k, cwi_element **out,
    cachew_err *rv)
{
	const cwi_tensor *t0 = &elems[0]->comp[0];
	uint8_t dtype = t0->dtype;
	size_t es = cwi_dtype_sizes[dtype & 15];
	int64_t shape[1] = {(int64_t)k};
	cwi_element *res;
	uint8_t *p;

	if (elems[0]->n != 1 || t0->rank != 0 || es == 0)
		return false;
	for (size_t i = 1; i < k; i++) {
		const cwi_tensor *t = &elems[i]->comp[0];
		if (elems[i]->n != 1 || t->rank != 0 || t->dtype != dtype)
			return false;
	}
	res = cwi_element_new(1);
	if (res == NULL) {
		*rv = CACHEW_ENOMEM;
		return true;
	}
	*rv = cwi_tensor_init_alloc(&res->comp[0], (cachew_dtype)dtype, 1,
	    shape, false, &p);
	if (*rv != CACHEW_OK) {
		cwi_element_release(res);
		return true;
	}
	for (size_t i = 0; i < k; i++, p += es)
		memcpy(p, cwi_tensor_data(&elems[i]->comp[0]), es);
	*out = res;
	return true;
}

cachew_err
cwi_stack(cwi_element *const *elems, size_t k, cwi_element **out, char *err,
    size_t errlen)
{
	return cwi_stack_parallel(elems, k, 1, out, err, errlen);
}

cachew_err
cwi_stack_parallel(cwi_element *const *elems, size_t k, int parallel,
    cwi_element **out, char *err, size_t errlen)
{
	const cwi_element *e0 = elems[0];
	cwi_element *res;
	char want[96], got[96];
	cachew_err rv = CACHEW_OK;

	if (stack_scalars(elems, k, out, &rv)) {
		if (rv != CACHEW_OK)
			snprintf(err, errlen, "%s", cwi_errmsg_get());
		return rv;
	}

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
			rv = stack_fixed(elems, k, c, &res->comp[c], parallel);
	}
	if (rv != CACHEW_OK) {
		snprintf(err, errlen, "%s", cwi_errmsg_get());
		cwi_element_release(res);
		return rv;
	}
	*out = res;
	return CACHEW_OK;
}

/* ---- batch and padded_batch: one collector, two ways to combine --------- */

typedef struct batch_iter {
	cwi_iter base;
	cwi_batch_group g;
	bool drop_remainder;
	cwi_pad_spec *pad; /* padded_batch; NULL for batch */
	int parallel;      /* batch: threads copying a large batch */
} batch_iter;

/* Elements requested from the input at a time while filling a batch. */
#define BATCH_PULL_MAX 4096

cachew_err
cwi_batch_group_init(cwi_batch_group *g, const cwi_node *node,
    const cwi_iter_args *args)
{
	cachew_err rv;

	memset(g, 0, sizeof(*g));
	g->n = (size_t)cwi_node_int(node, "n");
	rv = cwi_chunk_reserve(&g->pending,
	    g->n < BATCH_PULL_MAX ? g->n : BATCH_PULL_MAX);
	if (rv == CACHEW_OK)
		rv = cwi_iter_create(&g->input, node->inputs[0], args);
	if (rv != CACHEW_OK)
		cwi_chunk_free(&g->pending);
	return rv;
}

void
cwi_batch_group_fini(cwi_batch_group *g)
{
	cwi_iter_destroy(g->input);
	cwi_chunk_free(&g->pending);
}

cachew_err
cwi_batch_group_fill(cwi_batch_group *g, cwi_iter *it)
{
	cachew_err rv;

	while (!g->input_done && g->pending.n < g->n) {
		/* cwi_iter_next reserves room for what is asked: ask in
		 * bounded steps, so batch(n=1e9) | take(1) does not reserve
		 * gigabytes up front. */
		size_t want = g->n - g->pending.n, n0 = g->pending.n;
		rv = cwi_iter_next(g->input, &g->pending,
		    want < BATCH_PULL_MAX ? want : BATCH_PULL_MAX);
		if (rv == CACHEW_EOF)
			g->input_done = true;
		else if (rv != CACHEW_OK)
			return rv;
		/* The group is copied whole into the batch: over
		 * max_element_bytes, it fails before it grows more. */
		for (size_t i = n0; i < g->pending.n; i++)
			g->pending_bytes += cwi_element_nbytes(g->pending.v[i]);
		rv = cwi_pipeline_check_bytes(it->pl, it->node,
		    g->pending_bytes, "a batch of %zu elements (of %zu)",
		    g->pending.n, g->n);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

cachew_err
cwi_batch_group_save(const cwi_batch_group *g, cwi_state_writer *w)
{
	cachew_err rv;

	cwi_sw_array(w, 3);
	cwi_sw_bool(w, g->input_done);
	rv = cwi_sw_elements(w, g->pending.v, g->pending.n);
	return rv != CACHEW_OK ? rv : cwi_iter_save(g->input, w);
}

cachew_err
cwi_batch_group_restore(cwi_batch_group *g, cwi_state_reader *r,
    const char *op)
{
	if (!cwi_sr_array(r, op, 3) ||
	    !cwi_sr_bool(r, "input done", &g->input_done) ||
	    !cwi_sr_elements(r, "partial group", &g->pending))
		return cwi_sr_error(r);
	if (g->pending.n >= g->n) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "a partial group of %zu elements, for groups of %zu",
		    g->pending.n, g->n);
		return cwi_sr_error(r);
	}
	for (size_t i = 0; i < g->pending.n; i++)
		g->pending_bytes += cwi_element_nbytes(g->pending.v[i]);
	return cwi_iter_restore(g->input, r);
}

static cachew_err
batch_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	batch_iter *b = (batch_iter *)it;
	const char *name = it->node->op->name;
	char err[256];
	size_t got = 0;
	cachew_err rv;

	while (got < max) {
		rv = cwi_batch_group_fill(&b->g, it);
		if (rv != CACHEW_OK)
			return rv;
		if (b->g.pending.n > 0 && b->g.pending.n < b->g.n) {
			/* The last, partial group of a lease that keeps its
			 * tails: the client stitches it with other leases'. */
			cwi_chunk *tail = cwi_pipeline_tail_slot(it->pl,
			    it->node);
			if (tail != NULL) {
				if (!cwi_chunk_move_all(tail, &b->g.pending))
					return cwi_pipeline_fail(it->pl,
					    CACHEW_ENOMEM, "%s: out of memory",
					    name);
				b->g.pending_bytes = 0;
				break;
			}
		}
		if (b->g.pending.n == 0 ||
		    (b->g.pending.n < b->g.n && b->drop_remainder)) {
			cwi_chunk_clear(&b->g.pending);
			b->g.pending_bytes = 0;
			break;
		}
		cwi_element *res = NULL;
		if (b->pad != NULL)
			rv = cwi_stack_padded(b->g.pending.v, b->g.pending.n, b->pad,
			    cwi_pipeline_max_element(it->pl), &res, err,
			    sizeof(err));
		else
			rv = cwi_stack_parallel(b->g.pending.v, b->g.pending.n,
			    b->parallel, &res, err, sizeof(err));
		if (rv != CACHEW_OK)
			return cwi_pipeline_fail(it->pl, rv, "%s: %s", name, err);
		cwi_chunk_clear(&b->g.pending);
		b->g.pending_bytes = 0;
		cwi_chunk_push(out, res);
		got++;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
batch_destroy(cwi_iter *it)
{
	batch_iter *b = (batch_iter *)it;

	cwi_batch_group_fini(&b->g);
	free(b->pad);
	free(b);
}

static cachew_err
batch_save(cwi_iter *it, cwi_state_writer *w)
{
	return cwi_batch_group_save(&((batch_iter *)it)->g, w);
}

static cachew_err
batch_restore(cwi_iter *it, cwi_state_reader *r)
{
	return cwi_batch_group_restore(&((batch_iter *)it)->g, r,
	    it->node->op->name);
}

static const cwi_iter_ops batch_iter_ops = {
    .next = batch_next,
    .destroy = batch_destroy,
    .save = batch_save,
    .restore = batch_restore,
};

static cachew_err
batch_create_common(cwi_iter **out, const cwi_node *node,
    const cwi_iter_args *args, bool padded)
{
	batch_iter *b = calloc(1, sizeof(*b));
	cachew_err rv = CACHEW_OK;

	if (b == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	b->base.ops = &batch_iter_ops;
	b->drop_remainder = cwi_node_bool(node, "drop_remainder");
	b->parallel = 1;
	if (!padded && cwi_node_value(node, "parallel") != NULL) {
		/* auto: the pipeline's threads. Order is the input's either
		 * way: the threads share each batch's copy (fork-join). */
		int64_t par = cwi_node_int(node, "parallel");
		if (par == CACHEW_AUTO || par > args->pl->opts.threads)
			par = args->pl->opts.threads;
		b->parallel = par < 1 ? 1 : (int)par;
	}
	if (padded) {
		b->pad = malloc(sizeof(*b->pad));
		if (b->pad == NULL)
			rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		else
			rv = cwi_pad_spec_init(b->pad, node);
	}
	if (rv == CACHEW_OK)
		rv = cwi_batch_group_init(&b->g, node, args);
	if (rv != CACHEW_OK) {
		free(b->pad);
		free(b);
		return rv;
	}
	*out = &b->base;
	return CACHEW_OK;
}

static cachew_err
batch_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return batch_create_common(out, node, args, false);
}

static cachew_err
padded_batch_create(
    cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	return batch_create_common(out, node, args, true);
}

/* tf.data: batch(n) of c elements is ceil(c / n) batches (c / n with
 * drop_remainder), and its leading dimension is n only with
 * drop_remainder (the last batch may be smaller). A padded batch's other
 * dimensions are the batch maximum: known where the input's are (or set
 * by `shape`), -1 elsewhere. */
static cachew_err
batch_infer_common(cwi_node *node, const cwi_pad_spec *pad)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	int64_t n = cwi_node_int(node, "n");
	bool drop = cwi_node_bool(node, "drop_remainder");
	int64_t c = node->inputs[0]->card;
	char label[96];
	cachew_err rv;

	node->card = c < 0 ? c : drop ? c / n : c / n + (c % n != 0);
	if (!in->known)
		return CACHEW_OK;
	rv = cwi_spec_copy(&node->spec, in);
	for (uint32_t i = 0; rv == CACHEW_OK && i < in->n; i++) {
		cwi_comp_spec *s = &node->spec.comp[i];
		size_t pc = pad == NULL || pad->ncomp == 0 ? SIZE_MAX
		    : pad->shared			      ? 0
							      : i;
		if (s->rank == CWI_RANK_UNKNOWN)
			continue;
		if (s->rank == CACHEW_MAX_RANK) {
			cwi_spec_free(&node->spec);
			return cwi_fail(CACHEW_ETYPE, "%s: %s already has rank "
			    "%d, the most a tensor has", node->op->name,
			    cwi_comp_spec_label(in, i, label, sizeof(label)),
			    CACHEW_MAX_RANK);
		}
		for (unsigned d = 0; pad != NULL && pc < pad->ncomp &&
		     d < s->rank; d++)
			s->shape[d] = d < pad->rank[pc] ? pad->shape[pc][d] : -1;
		memmove(s->shape + 1, s->shape, s->rank * sizeof(s->shape[0]));
		s->shape[0] = drop ? n : -1;
		s->rank++;
	}
	return rv;
}

static cachew_err
batch_infer(cwi_node *node)
{
	return batch_infer_common(node, NULL);
}

static const cwi_param_spec batch_params[] = {
    {.name = "n", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = 1,
	.max = INT32_MAX, .help = "elements per batch"},
    {.name = "drop_remainder", .type = CWI_P_BOOL, .def_int = 0,
	.help = "drop a last batch smaller than n"},
    {.name = "parallel", .type = CWI_P_INT,
	.flags = CWI_PF_OPTIONAL | CWI_PF_PERF | CWI_PF_AUTO, .min = 1,
	.max = CWI_STACK_MAX_PARALLEL,
	.help = "threads that copy a batch of 1 MiB or more (auto: the "
		"threads option; absent: 1)"},
    {.name = "deterministic", .type = CWI_P_BOOL,
	.flags = CWI_PF_OPTIONAL | CWI_PF_PERF,
	.help = "accepted for tf.data's sake: batches always come in "
		"input order"},
};

const cwi_dataset_op cwi_op_batch = {
    .name = "batch",
    .doc = "stacks n consecutive elements along a new leading dimension",
    .params = batch_params,
    .nparams = sizeof(batch_params) / sizeof(batch_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = batch_create,
    .saves = "the elements of the partial batch, and the input",
    .infer = batch_infer,
    .note = "parallel=N is tf.data's num_parallel_calls: the copy of each "
	"batch of 1 MiB or more is shared by N threads (capped by the "
	"threads option), which helps with large elements such as decoded "
	"images. The threads split one batch, so batches keep the input's "
	"order whatever deterministic says.",
};

/* Checks the shape parameter when the node is built, so a malformed one is
 * reported by the parser rather than by the first iterator, and gives the
 * padded spec. */
static cachew_err
padded_batch_infer(cwi_node *node)
{
	cwi_pad_spec *spec = malloc(sizeof(*spec));
	cachew_err rv;

	if (spec == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	rv = cwi_pad_spec_init(spec, node);
	if (rv == CACHEW_OK)
		rv = batch_infer_common(node, spec);
	free(spec);
	return rv;
}

static const cwi_param_spec padded_batch_params[] = {
    {.name = "n", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED, .min = 1,
	.max = INT32_MAX, .help = "elements per batch"},
    {.name = "pad_value", .type = CWI_P_FLOATS, .def_float = 0.0,
	.help = "value of the padding, converted to each dtype: one for "
		"every component, a list of one per component, or a map "
		"by component name (others pad with 0)"},
    {.name = "drop_remainder", .type = CWI_P_BOOL, .def_int = 0,
	.help = "drop a last batch smaller than n"},
    {.name = "shape", .type = CWI_P_LIST, .flags = CWI_PF_OPTIONAL,
	.help = "padded shape ([d0, ...], -1 = batch maximum), or one "
		"such list per component; default: the batch maximum"},
};

const cwi_dataset_op cwi_op_padded_batch = {
    .name = "padded_batch",
    .doc = "stacks n consecutive elements, padding each component to a "
	   "common shape",
    .params = padded_batch_params,
    .nparams = sizeof(padded_batch_params) / sizeof(padded_batch_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .infer = padded_batch_infer,
    .iter_create = padded_batch_create,
    .saves = "the elements of the partial batch, and the input",
};
