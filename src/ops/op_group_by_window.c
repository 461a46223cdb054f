/*
 * op_group_by_window.c - group_by_window(fn, window_size) and
 * bucket_by_sequence_length(element_length, bucket_boundaries,
 * bucket_batch_sizes, ...): tf.data's grouping of elements by a key, each
 * full group yielded as one batch.
 *
 * Both share one iterator. Every input element gets an i64 key (the map
 * function fn's output for group_by_window; the bucket of its length for
 * bucket_by_sequence_length) and joins its key's group; a group that
 * reaches its window size is stacked into one element and emptied. At the
 * end of the input the groups left are yielded in ascending key order (as
 * tf.data's, which keeps them in a std::map), unless drop_remainder.
 *
 * tf.data's group_by_window takes a reduce_func(key, window_dataset); here
 * the reduction is the one pipelines nearly always write, batching the
 * window (`lambda _, w: w.batch(window_size)`); bucket_by_sequence_length
 * pads the batch (padded_batch) unless no_padding, as tf.data's does.
 *
 * Groups are kept sorted by key (a binary search per element); a group
 * emptied is removed, so memory holds only elements still waiting.
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>

/* Elements pulled from the input at a time, at most. */
#define GBW_PULL_MAX 1024
#define GBW_PULL_MIN 64

typedef struct gbw_group {
	int64_t key;
	cwi_chunk elems;
	uint64_t bytes;
} gbw_group;

typedef struct gbw_iter {
	cwi_iter base;
	cwi_iter *input;
	bool bucket;         /* bucket_by_sequence_length */
	bool drop_remainder;
	/* group_by_window */
	cachew_op_ctx ctx;
	int64_t window_size;
	uint64_t index;      /* elements keyed so far: the fn's index */
	/* bucket_by_sequence_length */
	uint32_t len_comp;
	size_t nbounds;      /* buckets: nbounds + 1 */
	int64_t *bounds;
	int64_t *sizes;
	bool pad_to_boundary, no_padding;
	cwi_pad_spec pad;
	/* state */
	gbw_group *groups;   /* ascending keys, none empty */
	size_t ngroups, groups_cap;
	cwi_chunk in;        /* pulled, not yet keyed: in.v[in_pos..n) */
	size_t in_pos;
	bool input_done;
	size_t pull;
} gbw_iter;

/* ---- keys ---------------------------------------------------------------- */

/* The bucket of a length: the count of boundaries <= len, so bucket i
 * holds [bounds[i-1], bounds[i]) (tf.data's buckets_min <= len <
 * buckets_max). */
static int64_t
bucket_of(const gbw_iter *g, int64_t len)
{
	size_t lo = 0, hi = g->nbounds;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (g->bounds[mid] <= len)
			lo = mid + 1;
		else
			hi = mid;
	}
	return (int64_t)lo;
}

static cachew_err
bucket_key(gbw_iter *g, const cwi_element *e, int64_t *key)
{
	const cwi_node *node = g->base.node;
	const cwi_tensor *t;
	char got[96];

	if (g->len_comp >= e->n)
		return cwi_pipeline_fail(g->base.pl, CACHEW_ETYPE,
		    "%s: element_length is component %u but element %llu has "
		    "%u component%s", node->op->name, g->len_comp,
		    (unsigned long long)g->index, e->n, e->n == 1 ? "" : "s");
	t = &e->comp[g->len_comp];
	if (t->rank == 0)
		return cwi_pipeline_fail(g->base.pl, CACHEW_ETYPE,
		    "%s: component %u of element %llu is %s, a scalar: the "
		    "length is its dimension 0", node->op->name, g->len_comp,
		    (unsigned long long)g->index,
		    cwi_tensor_spec_str(t, got, sizeof(got)));
	*key = bucket_of(g, t->shape[0]);
	if (g->pad_to_boundary && !g->no_padding &&
	    (size_t)*key == g->nbounds)
		return cwi_pipeline_fail(g->base.pl, CACHEW_ERANGE,
		    "%s: element %llu has length %lld; with "
		    "pad_to_bucket_boundary=true, elements must have length < "
		    "max(bucket_boundaries) (%lld)", node->op->name,
		    (unsigned long long)g->index, (long long)t->shape[0],
		    (long long)(g->nbounds > 0 ? g->bounds[g->nbounds - 1] : 0));
	return CACHEW_OK;
}

/* fn's output for e (e stays the caller's): one i64 scalar. */
static cachew_err
fn_key(gbw_iter *g, cwi_element *e, int64_t *key)
{
	const cwi_node *node = g->base.node;
	cwi_element *k = NULL;
	char got[96];
	cachew_err rv;

	cwi_element_retain(e);
	cwi_op_ctx_at(&g->ctx, g->index);
	rv = cwi_apply_map(&g->ctx, node, g->base.pl, e, &k);
	if (rv != CACHEW_OK)
		return rv;
	if (k->n != 1 || k->comp[0].dtype != CACHEW_I64 ||
	    k->comp[0].rank != 0) {
		if (k->n == 1)
			cwi_tensor_spec_str(&k->comp[0], got, sizeof(got));
		else
			snprintf(got, sizeof(got), "%u components", k->n);
		cwi_element_release(k);
		return cwi_pipeline_fail(g->base.pl, CACHEW_ETYPE,
		    "%s(%s): the key of element %llu is %s; a key is one i64 "
		    "scalar", node->op->name, node->fn->name,
		    (unsigned long long)g->index, got);
	}
	memcpy(key, cwi_tensor_data(&k->comp[0]), sizeof(*key));
	cwi_element_release(k);
	return CACHEW_OK;
}

/* ---- groups -------------------------------------------------------------- */

static int64_t
window_of(const gbw_iter *g, int64_t key)
{
	return g->bucket ? g->sizes[key] : g->window_size;
}

/* The group of key, inserted (empty) where the order wants it. */
static gbw_group *
group_find(gbw_iter *g, int64_t key)
{
	size_t lo = 0, hi = g->ngroups;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (g->groups[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < g->ngroups && g->groups[lo].key == key)
		return &g->groups[lo];
	if (!CWI_GROW(g->groups, g->groups_cap, g->ngroups + 1))
		return NULL;
	memmove(g->groups + lo + 1, g->groups + lo,
	    (g->ngroups - lo) * sizeof(g->groups[0]));
	memset(&g->groups[lo], 0, sizeof(g->groups[0]));
	g->groups[lo].key = key;
	g->ngroups++;
	return &g->groups[lo];
}

static void
group_remove(gbw_iter *g, gbw_group *grp)
{
	size_t i = (size_t)(grp - g->groups);

	cwi_chunk_free(&grp->elems);
	memmove(g->groups + i, g->groups + i + 1,
	    (g->ngroups - i - 1) * sizeof(g->groups[0]));
	g->ngroups--;
}

/* The padded shape of a bucket's batch: every dimension the input's spec
 * does not know is padded to the bucket's boundary - 1 with
 * pad_to_bucket_boundary (tf.data's none_filler), else to the batch
 * maximum. */
static void
bucket_pad_spec(gbw_iter *g, int64_t key, const cwi_element *e0)
{
	const cwi_spec *in = &g->base.node->inputs[0]->spec;

	g->pad.ncomp = 0;
	g->pad.shared = false;
	if (!g->pad_to_boundary)
		return;
	g->pad.ncomp = e0->n;
	for (uint32_t c = 0; c < e0->n; c++) {
		const cwi_comp_spec *s = in->known && c < in->n ? &in->comp[c]
								: NULL;
		g->pad.rank[c] = e0->comp[c].rank;
		for (unsigned d = 0; d < e0->comp[c].rank; d++) {
			bool known = s != NULL && s->rank == e0->comp[c].rank &&
			    s->shape[d] >= 0;
			g->pad.shape[c][d] = known ? -1 : g->bounds[key] - 1;
		}
	}
}

/* Stacks grp's elements into one and pushes it onto out; empties grp. */
static cachew_err
group_emit(gbw_iter *g, gbw_group *grp, cwi_chunk *out)
{
	const cwi_node *node = g->base.node;
	cwi_element *res = NULL;
	char err[256];
	cachew_err rv;

	rv = cwi_chunk_reserve(out, 1);
	if (rv != CACHEW_OK)
		return cwi_pipeline_fail(g->base.pl, rv, "%s: out of memory",
		    node->op->name);
	if (!g->bucket || g->no_padding) {
		rv = cwi_stack(grp->elems.v, grp->elems.n, &res, err,
		    sizeof(err));
	} else {
		bucket_pad_spec(g, grp->key, grp->elems.v[0]);
		rv = cwi_stack_padded(grp->elems.v, grp->elems.n, &g->pad,
		    cwi_pipeline_max_element(g->base.pl), &res, err,
		    sizeof(err));
	}
	if (rv != CACHEW_OK)
		return cwi_pipeline_fail(g->base.pl, rv, "%s: key %lld: %s",
		    node->op->name, (long long)grp->key, err);
	cwi_chunk_push(out, res);
	group_remove(g, grp);
	return CACHEW_OK;
}

/* Keys e (a reference the iterator owns) into its group; a group that
 * fills is emitted into out. */
static cachew_err
group_add(gbw_iter *g, cwi_element *e, cwi_chunk *out)
{
	const cwi_node *node = g->base.node;
	gbw_group *grp;
	int64_t key = 0;
	cachew_err rv;

	rv = g->bucket ? bucket_key(g, e, &key) : fn_key(g, e, &key);
	if (rv != CACHEW_OK) {
		cwi_element_release(e);
		return rv;
	}
	g->index++;
	grp = group_find(g, key);
	if (grp == NULL || cwi_chunk_reserve(&grp->elems, 1) != CACHEW_OK) {
		cwi_element_release(e);
		return cwi_pipeline_fail(g->base.pl, CACHEW_ENOMEM,
		    "%s: out of memory", node->op->name);
	}
	cwi_chunk_push(&grp->elems, e);
	grp->bytes += cwi_element_nbytes(e);
	rv = cwi_pipeline_check_bytes(g->base.pl, node, grp->bytes,
	    "the group of key %lld (%zu elements)", (long long)key,
	    grp->elems.n);
	if (rv != CACHEW_OK)
		return rv;
	if ((int64_t)grp->elems.n >= window_of(g, key))
		return group_emit(g, grp, out);
	return CACHEW_OK;
}

/* ---- the iterator -------------------------------------------------------- */

static cachew_err
gbw_pull(gbw_iter *g)
{
	cachew_err rv;

	cwi_chunk_clear(&g->in);
	g->in_pos = 0;
	if (cwi_pipeline_cancelled(g->base.pl))
		return CACHEW_ECANCELED;
	rv = cwi_iter_next(g->input, &g->in, g->pull);
	if (rv == CACHEW_EOF) {
		g->input_done = true;
		return CACHEW_OK;
	}
	return rv;
}

static cachew_err
gbw_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	gbw_iter *g = (gbw_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	while (out->n - n0 < max) {
		if (g->in_pos < g->in.n) {
			cwi_element *e = g->in.v[g->in_pos];
			g->in.v[g->in_pos++] = NULL;
			rv = group_add(g, e, out);
			if (rv != CACHEW_OK)
				return rv;
			continue;
		}
		if (!g->input_done) {
			rv = gbw_pull(g);
			if (rv != CACHEW_OK)
				return rv;
			continue;
		}
		/* The input ended: the groups left, in key order. */
		if (g->ngroups == 0)
			break;
		if (g->drop_remainder) {
			while (g->ngroups > 0)
				group_remove(g, &g->groups[0]);
			break;
		}
		rv = group_emit(g, &g->groups[0], out);
		if (rv != CACHEW_OK)
			return rv;
	}
	return out->n > n0 ? CACHEW_OK : CACHEW_EOF;
}

static void
gbw_destroy(cwi_iter *it)
{
	gbw_iter *g = (gbw_iter *)it;

	cwi_iter_destroy(g->input);
	while (g->ngroups > 0)
		group_remove(g, &g->groups[0]);
	free(g->groups);
	for (size_t i = g->in_pos; i < g->in.n; i++)
		cwi_element_release(g->in.v[i]);
	g->in.n = 0;
	cwi_chunk_free(&g->in);
	free(g->bounds);
	free(g->sizes);
	free(g);
}

/* [index, input done, pulled not yet keyed, groups: [[key, elements],
 * ...], input]. */
static cachew_err
gbw_save(cwi_iter *it, cwi_state_writer *w)
{
	gbw_iter *g = (gbw_iter *)it;
	cachew_err rv;

	cwi_sw_array(w, 5);
	cwi_sw_uint(w, g->index);
	cwi_sw_bool(w, g->input_done);
	rv = cwi_sw_elements(w, g->in.v + g->in_pos, g->in.n - g->in_pos);
	cwi_sw_array(w, g->ngroups);
	for (size_t i = 0; rv == CACHEW_OK && i < g->ngroups; i++) {
		cwi_sw_array(w, 2);
		cwi_sw_int(w, g->groups[i].key);
		rv = cwi_sw_elements(w, g->groups[i].elems.v,
		    g->groups[i].elems.n);
	}
	return rv != CACHEW_OK ? rv : cwi_iter_save(g->input, w);
}

static bool
gbw_restore_group(gbw_iter *g, cwi_state_reader *r, int64_t *last)
{
	const char *name = g->base.node->op->name;
	int64_t key;
	gbw_group *grp;

	if (!cwi_sr_array(r, "group", 2) ||
	    !cwi_sr_int(r, "key", &key, g->bucket ? 0 : INT64_MIN,
		g->bucket ? (int64_t)g->nbounds : INT64_MAX))
		return false;
	if (g->ngroups > 0 && key <= *last)
		return cwi_sr_fail(r, CACHEW_ECORRUPT, "%s: group keys out of "
		    "order (%lld after %lld)", name, (long long)key,
		    (long long)*last);
	*last = key;
	grp = group_find(g, key);
	if (grp == NULL)
		return cwi_sr_fail(r, CACHEW_ENOMEM, "out of memory");
	if (!cwi_sr_elements(r, "group elements", &grp->elems))
		return false;
	if (grp->elems.n == 0 ||
	    (int64_t)grp->elems.n >= window_of(g, key))
		return cwi_sr_fail(r, CACHEW_ECORRUPT, "%s: a group of %zu "
		    "elements for key %lld, whose windows hold %lld", name,
		    grp->elems.n, (long long)key, (long long)window_of(g, key));
	for (size_t i = 0; i < grp->elems.n; i++)
		grp->bytes += cwi_element_nbytes(grp->elems.v[i]);
	return true;
}

static cachew_err
gbw_restore(cwi_iter *it, cwi_state_reader *r)
{
	gbw_iter *g = (gbw_iter *)it;
	uint64_t n = 0;
	int64_t last = 0;

	if (!cwi_sr_array(r, it->node->op->name, 5) ||
	    !cwi_sr_uint(r, "index", &g->index, UINT64_MAX) ||
	    !cwi_sr_bool(r, "input done", &g->input_done) ||
	    !cwi_sr_elements(r, "pulled", &g->in) ||
	    !cwi_sr_count(r, "groups", &n, UINT32_MAX))
		return cwi_sr_error(r);
	for (uint64_t i = 0; i < n; i++)
		if (!gbw_restore_group(g, r, &last))
			return cwi_sr_error(r);
	return cwi_iter_restore(g->input, r);
}

static const cwi_iter_ops gbw_iter_ops = {
    .next = gbw_next,
    .destroy = gbw_destroy,
    .save = gbw_save,
    .restore = gbw_restore,
};

/* ---- parameters ---------------------------------------------------------- */

/* A list of integers >= min, into a new array (free()). */
static cachew_err
int_list(const cwi_node *node, const char *key, int64_t min, int64_t **out,
    size_t *n)
{
	const cwi_value *v = cwi_node_value(node, key);
	int64_t *a;

	*out = NULL;
	*n = 0;
	if (v == NULL || v->type != CWI_V_LIST)
		return cwi_fail(CACHEW_EINVAL, "%s: %s must be a list of "
		    "integers", node->op->name, key);
	if (v->u.list.n > INT32_MAX)
		return cwi_fail(CACHEW_ERANGE, "%s: %s lists too many values",
		    node->op->name, key);
	a = malloc((v->u.list.n + 1) * sizeof(*a));
	if (a == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < v->u.list.n; i++) {
		const cwi_value *x = &v->u.list.items[i];
		if (x->type != CWI_V_INT || x->u.i < min) {
			free(a);
			return cwi_fail(CACHEW_EINVAL, "%s: %s[%zu] must be an "
			    "integer >= %lld", node->op->name, key, i,
			    (long long)min);
		}
		a[i] = x->u.i;
	}
	*out = a;
	*n = v->u.list.n;
	return CACHEW_OK;
}

/* Reads and checks the buckets: boundaries strictly increasing, one batch
 * size more than boundaries (tf.data's rule). */
static cachew_err
bucket_params(const cwi_node *node, int64_t **bounds, size_t *nbounds,
    int64_t **sizes)
{
	size_t nsizes;
	cachew_err rv;

	*sizes = NULL;
	rv = int_list(node, "bucket_boundaries", 1, bounds, nbounds);
	if (rv == CACHEW_OK)
		rv = int_list(node, "bucket_batch_sizes", 1, sizes, &nsizes);
	for (size_t i = 1; rv == CACHEW_OK && i < *nbounds; i++)
		if ((*bounds)[i] <= (*bounds)[i - 1])
			rv = cwi_fail(CACHEW_EINVAL, "%s: bucket_boundaries "
			    "must increase: %lld after %lld", node->op->name,
			    (long long)(*bounds)[i],
			    (long long)(*bounds)[i - 1]);
	if (rv == CACHEW_OK && nsizes != *nbounds + 1)
		rv = cwi_fail(CACHEW_EINVAL, "%s: bucket_batch_sizes has %zu "
		    "values; it must have one per bucket, len("
		    "bucket_boundaries) + 1 = %zu", node->op->name, nsizes,
		    *nbounds + 1);
	if (rv != CACHEW_OK) {
		free(*bounds);
		free(*sizes);
		*bounds = *sizes = NULL;
	}
	return rv;
}

static cachew_err
gbw_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	gbw_iter *g = calloc(1, sizeof(*g));
	int64_t largest;
	cachew_err rv = CACHEW_OK;

	if (g == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	g->base.ops = &gbw_iter_ops;
	g->bucket = strcmp(node->op->name, "bucket_by_sequence_length") == 0;
	g->drop_remainder = cwi_node_bool(node, "drop_remainder");
	if (g->bucket) {
		g->len_comp = (uint32_t)cwi_node_int(node, "element_length");
		g->pad_to_boundary = cwi_node_bool(node,
		    "pad_to_bucket_boundary");
		g->no_padding = cwi_node_bool(node, "no_padding");
		g->pad.pad_value = cwi_node_float(node, "pad_value");
		rv = bucket_params(node, &g->bounds, &g->nbounds, &g->sizes);
		largest = 1;
		for (size_t i = 0; rv == CACHEW_OK && i <= g->nbounds; i++)
			largest = g->sizes[i] > largest ? g->sizes[i] : largest;
	} else {
		g->window_size = cwi_node_int(node, "window_size");
		cwi_op_ctx_init(&g->ctx, node, args->pl, args->epoch);
		largest = g->window_size;
	}
	g->pull = largest < GBW_PULL_MIN ? GBW_PULL_MIN
	    : largest > GBW_PULL_MAX	 ? GBW_PULL_MAX
					 : (size_t)largest;
	if (rv == CACHEW_OK)
		rv = cwi_iter_create(&g->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(g->bounds);
		free(g->sizes);
		free(g);
		return rv;
	}
	*out = &g->base;
	return CACHEW_OK;
}

/* ---- build-time checks and specs ----------------------------------------- */

/* element_length: a component's index, or its name (resolved to the
 * index against the input's spec, so the canonical form holds the
 * index). */
static cachew_err
bucket_validate(cwi_node *node)
{
	cwi_value *v = (cwi_value *)cwi_node_value(node, "element_length");
	const cwi_spec *in = &node->inputs[0]->spec;
	int64_t *bounds = NULL, *sizes = NULL;
	size_t nbounds;
	cachew_err rv;
	int i;

	rv = bucket_params(node, &bounds, &nbounds, &sizes);
	free(bounds);
	free(sizes);
	if (rv != CACHEW_OK)
		return rv;
	if (v->type == CWI_V_NIL) {
		v->type = CWI_V_INT;
		v->u.i = 0;
	}
	if (v->type == CWI_V_INT) {
		if (v->u.i < 0 || v->u.i >= CACHEW_MAX_COMPONENTS ||
		    (in->known && (uint64_t)v->u.i >= in->n))
			return cwi_fail(CACHEW_EINVAL, "%s: element_length %lld "
			    "is not a component of the input (%u component%s)",
			    node->op->name, (long long)v->u.i,
			    in->known ? in->n : CACHEW_MAX_COMPONENTS,
			    in->known && in->n == 1 ? "" : "s");
		return CACHEW_OK;
	}
	if (v->type != CWI_V_STR)
		return cwi_fail(CACHEW_EINVAL, "%s: element_length must be a "
		    "component's index or name", node->op->name);
	if (!in->known)
		return cwi_fail(CACHEW_EINVAL, "%s: element_length '%s': the "
		    "input's components are not known when building: give the "
		    "component's index", node->op->name, v->u.s.ptr);
	i = cwi_spec_find(in, v->u.s.ptr);
	if (i < 0)
		return cwi_fail(CACHEW_ENOENT, "%s: no component is named "
		    "'%s'", node->op->name, v->u.s.ptr);
	cwi_value_free(v);
	v->type = CWI_V_INT;
	v->u.i = i;
	return CACHEW_OK;
}

/* Each component gains a leading dimension of -1 (or n: drop_remainder
 * and one batch size for every bucket). Where padding happens, the
 * dimensions the input does not know stay -1. Cardinality: unknown (0
 * stays 0), as tf.data's. */
static cachew_err
grouped_spec(cwi_node *node, int64_t lead)
{
	node->card = node->inputs[0]->card == 0 ? 0
						: CACHEW_CARDINALITY_UNKNOWN;
	return cwi_spec_batched(node, lead);
}

static cachew_err
bucket_infer(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	uint32_t c = (uint32_t)cwi_node_int(node, "element_length");
	int64_t *bounds = NULL, *sizes = NULL, lead = -1;
	size_t nbounds;
	char label[96];
	cachew_err rv;

	if (in->known && in->comp[c].rank == 0)
		return cwi_fail(CACHEW_ETYPE, "%s: element_length is %s, a "
		    "scalar: the length is a component's dimension 0",
		    node->op->name, cwi_comp_spec_label(in, c, label,
			sizeof(label)));
	rv = bucket_params(node, &bounds, &nbounds, &sizes);
	if (rv != CACHEW_OK)
		return rv;
	if (cwi_node_bool(node, "drop_remainder")) {
		lead = sizes[0];
		for (size_t i = 1; i <= nbounds; i++)
			if (sizes[i] != lead)
				lead = -1;
	}
	free(bounds);
	free(sizes);
	return grouped_spec(node, lead);
}

/* The key function's output must be one i64 scalar where its rule says
 * what it yields. */
static cachew_err
gbw_infer(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	bool drop = cwi_node_bool(node, "drop_remainder");
	cwi_spec key = {0};
	cachew_err rv = CACHEW_OK;

	if (in->known && node->fn->spec != NULL)
		rv = node->fn->spec(node, in, &key);
	if (rv == CACHEW_OK && key.known &&
	    (key.n != 1 ||
		(key.comp[0].dtype != CACHEW_INVALID &&
		    key.comp[0].dtype != CACHEW_I64) ||
		(key.comp[0].rank != CWI_RANK_UNKNOWN &&
		    key.comp[0].rank != 0))) {
		cwi_strbuf sb;
		cwi_strbuf_init(&sb);
		cwi_spec_print(&sb, &key);
		rv = cwi_fail(CACHEW_ETYPE, "%s: the key function %s yields "
		    "%s; a key is one i64 scalar", node->op->name,
		    node->fn->name, sb.data != NULL && !sb.oom ? sb.data : "?");
		cwi_strbuf_free(&sb);
	}
	cwi_spec_free(&key);
	if (rv != CACHEW_OK)
		return rv;
	return grouped_spec(node, drop ? cwi_node_int(node, "window_size") : -1);
}

static const cwi_param_spec gbw_params[] = {
    {.name = "fn", .type = CWI_P_STR, .flags = CWI_PF_REQUIRED,
	.help = "the key function (tf.data's key_func): a map function "
		"yielding one i64 scalar"},
    {.name = "window_size", .type = CWI_P_INT, .flags = CWI_PF_REQUIRED,
	.min = 1, .max = INT32_MAX,
	.help = "elements of one key batched together"},
    {.name = "drop_remainder", .type = CWI_P_BOOL, .def_int = 0,
	.help = "drop the groups left smaller than window_size at the "
		"input's end"},
};

const cwi_dataset_op cwi_op_group_by_window = {
    .name = "group_by_window",
    .doc = "groups elements by the i64 key a map function gives them and "
	   "yields each group of window_size elements as one batch",
    .params = gbw_params,
    .nparams = sizeof(gbw_params) / sizeof(gbw_params[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .flags = CWI_OPF_FN_MAP,
    .iter_create = gbw_create,
    .saves = "the key function's element index, the elements pulled but "
	"not yet keyed, every group's key and elements, and the input",
    .infer = gbw_infer,
    .note = "tf.data's `group_by_window(key_func, reduce_func, "
	"window_size)` with the reduce_func pipelines nearly always pass, "
	"`lambda key, window: window.batch(window_size)`: each group of "
	"`window_size` elements of one key is yielded as one batch, and at "
	"the input's end the groups left are yielded in ascending key order, "
	"as tf.data does (or dropped with `drop_remainder`, tf.data's "
	"`batch(window_size, drop_remainder=True)`). The key function is a "
	"registered map function (built-in, such as `mod`, from C or from a "
	"plugin) whose output is one i64 scalar; parameters it does not "
	"know go to it, as for map. A general reduce_func and "
	"window_size_func are left out: the pipeline string has no lambdas, "
	"and a registered function (cachew_op_def) maps one element to one "
	"element, not a dataset to a dataset; bucket_by_sequence_length is "
	"the window_size_func use tf.data itself builds on it. Through the "
	"service it runs in the client part, in split order in a private "
	"job.",
};

static const cwi_param_spec bucket_params_spec[] = {
    {.name = "element_length", .type = CWI_P_ANY, .def_int = 0,
	.help = "the component whose dimension 0 is the element's length "
		"(its index or name; default 0)"},
    {.name = "bucket_boundaries", .type = CWI_P_LIST,
	.flags = CWI_PF_REQUIRED,
	.help = "increasing lengths; bucket i holds lengths in "
		"[boundaries[i-1], boundaries[i])"},
    {.name = "bucket_batch_sizes", .type = CWI_P_LIST,
	.flags = CWI_PF_REQUIRED,
	.help = "the batch size of each bucket: len(bucket_boundaries) + 1 "
		"values"},
    {.name = "pad_value", .type = CWI_P_FLOAT, .def_float = 0.0,
	.help = "value of the padding, converted to each dtype "
		"(tf.data's padding_values)"},
    {.name = "pad_to_bucket_boundary", .type = CWI_P_BOOL, .def_int = 0,
	.help = "pad the unknown dimensions to the bucket's boundary - 1 "
		"instead of the batch maximum"},
    {.name = "no_padding", .type = CWI_P_BOOL, .def_int = 0,
	.help = "batch without padding (the elements of a batch must then "
		"have one shape)"},
    {.name = "drop_remainder", .type = CWI_P_BOOL, .def_int = 0,
	.help = "drop the buckets' partial batches at the input's end"},
};

/* element_length's default, the index 0, is set by bucket_validate (a
 * CWI_P_ANY param has no typed default). */
const cwi_dataset_op cwi_op_bucket_by_sequence_length = {
    .name = "bucket_by_sequence_length",
    .doc = "batches elements of similar length together: each goes to the "
	   "bucket of its length and a bucket's batch is padded to its "
	   "longest element",
    .params = bucket_params_spec,
    .nparams = sizeof(bucket_params_spec) / sizeof(bucket_params_spec[0]),
    .min_inputs = 1,
    .max_inputs = 1,
    .validate = bucket_validate,
    .iter_create = gbw_create,
    .saves = "the count of elements bucketed, the elements pulled but not "
	"yet bucketed, every bucket's elements, and the input",
    .infer = bucket_infer,
    .note = "tf.data's `bucket_by_sequence_length` (group_by_window keyed "
	"by the bucket, each bucket batched by padded_batch). tf.data's "
	"element_length_func is nearly always `lambda x: tf.shape(x)[0]`: "
	"here `element_length` names the component whose dimension 0 is the "
	"length. Bucket i holds the lengths in [bucket_boundaries[i-1], "
	"bucket_boundaries[i]); a bucket yields a batch when it holds "
	"bucket_batch_sizes[i] elements, and at the input's end the partial "
	"batches are yielded in bucket order. With `pad_to_bucket_boundary` "
	"every dimension the input's element spec does not know is padded "
	"to the bucket's boundary - 1, and an element of the last bucket "
	"(length >= the last boundary) is an error, as in tf.data. "
	"`padded_shapes` is left out (padded_batch's `shape` does it before "
	"or after), and `pad_value` is one value for every component "
	"(bytes components pad with empty strings). Through the service it "
	"runs in the client part, in split order in a private job.",
};
