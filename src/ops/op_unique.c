/*
 * op_unique.c - unique(): tf.data's unique. Yields the first occurrence
 * of every value of a dataset whose elements are one scalar integer
 * (u8, i32, i64) or string (bytes), in input order.
 *
 * The values seen so far live in an open-addressing hash set that grows
 * with the distinct values (tf.data keeps them all too). A string is
 * copied into the set rather than kept by reference: a text line is a
 * view of a large read buffer, and holding the view would pin every read
 * buffer of the input. Integers of any width are compared as i64 (every
 * element of one dataset has the same dtype).
 */
#include "ops.h"
#include "../exec/exec_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

typedef struct unique_key {
	uint64_t hash;
	int64_t value;   /* integers */
	uint8_t *bytes;  /* strings: a copy (NULL for the empty string) */
	size_t len;
	bool used;
} unique_key;

typedef struct unique_iter {
	cwi_iter base;
	cwi_iter *input;
	unique_key *slot; /* capacity a power of two, load <= 1/2 */
	size_t cap, count;
	uint8_t dtype;    /* of the first element; CACHEW_INVALID before */
	uint64_t index;   /* elements seen at the input */
} unique_iter;

static void
unique_keys_free(unique_iter *u)
{
	for (size_t i = 0; i < u->cap; i++)
		free(u->slot[i].bytes);
	free(u->slot);
	u->slot = NULL;
	u->cap = u->count = 0;
}

static bool
key_equal(const unique_key *k, uint8_t dtype, int64_t value,
    const uint8_t *bytes, size_t len)
{
	if (dtype != CACHEW_BYTES)
		return k->value == value;
	return k->len == len && (len == 0 || memcmp(k->bytes, bytes, len) == 0);
}

static bool
unique_grow(unique_iter *u)
{
	size_t cap = u->cap == 0 ? 64 : u->cap * 2;
	unique_key *slot = calloc(cap, sizeof(*slot));

	if (slot == NULL)
		return false;
	for (size_t i = 0; i < u->cap; i++) {
		size_t j;
		if (!u->slot[i].used)
			continue;
		for (j = u->slot[i].hash & (cap - 1); slot[j].used;
		    j = (j + 1) & (cap - 1))
			;
		slot[j] = u->slot[i];
	}
	free(u->slot);
	u->slot = slot;
	u->cap = cap;
	return true;
}

/* Adds the value unless the set holds it; *added says which. false on
 * ENOMEM. */
static bool
unique_insert(unique_iter *u, int64_t value, const uint8_t *bytes,
    size_t len, bool *added)
{
	uint64_t h = u->dtype == CACHEW_BYTES ? XXH3_64bits(bytes, len)
					      : cwi_mix64((uint64_t)value);
	size_t j;

	*added = false;
	if ((u->count + 1) * 2 > u->cap && !unique_grow(u))
		return false;
	for (j = h & (u->cap - 1); u->slot[j].used; j = (j + 1) & (u->cap - 1))
		if (u->slot[j].hash == h &&
		    key_equal(&u->slot[j], u->dtype, value, bytes, len))
			return true;
	if (u->dtype == CACHEW_BYTES && len > 0) {
		u->slot[j].bytes = malloc(len);
		if (u->slot[j].bytes == NULL)
			return false;
		memcpy(u->slot[j].bytes, bytes, len);
	}
	u->slot[j].hash = h;
	u->slot[j].value = value;
	u->slot[j].len = len;
	u->slot[j].used = true;
	u->count++;
	*added = true;
	return true;
}

static bool
dtype_ok(uint8_t dtype)
{
	return dtype == CACHEW_U8 || dtype == CACHEW_I32 ||
	    dtype == CACHEW_I64 || dtype == CACHEW_BYTES;
}

static int64_t
int_value(const cwi_tensor *t)
{
	const uint8_t *d = cwi_tensor_data(t);
	int32_t i32;
	int64_t i64;

	switch (t->dtype) {
	case CACHEW_U8:
		return d[0];
	case CACHEW_I32:
		memcpy(&i32, d, sizeof(i32));
		return i32;
	default:
		memcpy(&i64, d, sizeof(i64));
		return i64;
	}
}

/* Whether element e is new; refuses elements unique cannot take (the
 * spec did not say, after a user function). */
static cachew_err
unique_test(unique_iter *u, const cwi_element *e, bool *added)
{
	const cwi_tensor *t = &e->comp[0];
	char spec[64];
	const uint8_t *bytes = NULL;
	size_t len = 0;

	if (e->n != 1 || t->rank != 0 || !dtype_ok(t->dtype) ||
	    (u->dtype != CACHEW_INVALID && t->dtype != u->dtype))
		return cwi_pipeline_fail(u->base.pl, CACHEW_ETYPE,
		    "unique: element %llu is %s; unique takes elements of "
		    "one scalar integer or string component, all of one dtype",
		    (unsigned long long)u->index,
		    e->n == 1 ? cwi_tensor_spec_str(t, spec, sizeof(spec))
			      : "not one component");
	u->dtype = t->dtype;
	if (t->dtype == CACHEW_BYTES)
		bytes = cwi_tensor_str(t, 0, &len);
	if (!unique_insert(u, t->dtype == CACHEW_BYTES ? 0 : int_value(t),
		bytes, len, added))
		return cwi_pipeline_fail(u->base.pl, CACHEW_ENOMEM,
		    "unique: out of memory holding %zu distinct values",
		    u->count);
	return CACHEW_OK;
}

/* Keeps the pulled elements not seen before, in order; pulls again when
 * every one was a repeat, so an empty chunk means the end. */
static cachew_err
unique_next(cwi_iter *it, cwi_chunk *out, size_t max)
{
	unique_iter *u = (unique_iter *)it;
	size_t n0 = out->n;
	cachew_err rv;

	do {
		size_t kept = n0;
		/* An endless input of repeats never yields: let the
		 * iterator's destruction stop it. */
		if (cwi_pipeline_cancelled(it->pl))
			return CACHEW_ECANCELED;
		rv = cwi_iter_next(u->input, out, max);
		if (rv != CACHEW_OK)
			return rv;
		for (size_t i = n0; i < out->n; i++) {
			bool added = false;
			rv = unique_test(u, out->v[i], &added);
			if (rv != CACHEW_OK) {
				/* v[kept..i) were moved down or released:
				 * only v[n0..kept) go out before the error. */
				for (size_t k = i; k < out->n; k++)
					cwi_element_release(out->v[k]);
				out->n = kept;
				return rv;
			}
			u->index++;
			if (added)
				out->v[kept++] = out->v[i];
			else
				cwi_element_release(out->v[i]);
		}
		out->n = kept;
	} while (out->n == n0);
	return CACHEW_OK;
}

static void
unique_destroy(cwi_iter *it)
{
	unique_iter *u = (unique_iter *)it;

	cwi_iter_destroy(u->input);
	unique_keys_free(u);
	free(u);
}

/* The values seen, as one element of one rank-1 tensor in set order. */
static cachew_err
unique_keys_element(const unique_iter *u, cwi_element **out)
{
	cwi_element *e = cwi_element_new(1);
	int64_t shape[1] = {(int64_t)u->count};
	const void **items = NULL;
	size_t *lens = NULL, k = 0;
	uint8_t *data = NULL;
	cachew_err rv = CACHEW_ENOMEM;

	if (e == NULL)
		return cwi_fail(CACHEW_ENOMEM, "unique: out of memory");
	if (u->dtype != CACHEW_BYTES) {
		rv = cwi_tensor_init_alloc(&e->comp[0], CACHEW_I64, 1, shape,
		    false, &data);
		for (size_t i = 0; rv == CACHEW_OK && i < u->cap; i++)
			if (u->slot[i].used)
				memcpy(data + 8 * k++, &u->slot[i].value, 8);
	} else {
		items = calloc(u->count + 1, sizeof(*items));
		lens = calloc(u->count + 1, sizeof(*lens));
		if (items != NULL && lens != NULL) {
			for (size_t i = 0; i < u->cap; i++) {
				if (!u->slot[i].used)
					continue;
				items[k] = u->slot[i].bytes != NULL
				    ? (const void *)u->slot[i].bytes : "";
				lens[k++] = u->slot[i].len;
			}
			rv = cwi_tensor_init_bytes_list(&e->comp[0], 1, shape,
			    items, lens);
		}
		free(items);
		free(lens);
	}
	if (rv != CACHEW_OK) {
		cwi_element_release(e);
		return cwi_fail(CACHEW_ENOMEM, "unique: out of memory saving "
		    "%zu distinct values", u->count);
	}
	*out = e;
	return CACHEW_OK;
}

/* [index, dtype, [values], input]. */
static cachew_err
unique_save(cwi_iter *it, cwi_state_writer *w)
{
	unique_iter *u = (unique_iter *)it;
	cwi_element *keys;
	cachew_err rv = unique_keys_element(u, &keys);

	if (rv != CACHEW_OK)
		return rv;
	cwi_sw_array(w, 4);
	cwi_sw_uint(w, u->index);
	cwi_sw_uint(w, u->dtype);
	rv = cwi_sw_elements(w, &keys, 1);
	cwi_element_release(keys);
	return rv != CACHEW_OK ? rv : cwi_iter_save(u->input, w);
}

static cachew_err
unique_restore_keys(unique_iter *u, cwi_state_reader *r, const cwi_element *e)
{
	const cwi_tensor *t = &e->comp[0];
	uint8_t want = u->dtype == CACHEW_BYTES ? CACHEW_BYTES : CACHEW_I64;
	bool added;

	if (e->n != 1 || t->rank != 1 || t->dtype != want) {
		cwi_sr_fail(r, CACHEW_ECORRUPT, "unique: the saved values are "
		    "not a list of the saved dtype");
		return cwi_sr_error(r);
	}
	for (int64_t i = 0; i < t->shape[0]; i++) {
		const uint8_t *bytes = NULL;
		size_t len = 0;
		int64_t v = 0;
		if (u->dtype == CACHEW_BYTES)
			bytes = cwi_tensor_str(t, i, &len);
		else
			memcpy(&v, cwi_tensor_data(t) + 8 * i, sizeof(v));
		if (!unique_insert(u, v, bytes, len, &added))
			return cwi_fail(CACHEW_ENOMEM, "unique: out of memory");
		if (!added) {
			cwi_sr_fail(r, CACHEW_ECORRUPT,
			    "unique: a saved value repeats");
			return cwi_sr_error(r);
		}
	}
	return CACHEW_OK;
}

static cachew_err
unique_restore(cwi_iter *it, cwi_state_reader *r)
{
	unique_iter *u = (unique_iter *)it;
	cwi_chunk keys = {0};
	uint64_t dtype = 0;
	cachew_err rv;

	if (!cwi_sr_array(r, "unique", 4) ||
	    !cwi_sr_uint(r, "index", &u->index, UINT64_MAX) ||
	    !cwi_sr_uint(r, "dtype", &dtype, 255))
		return cwi_sr_error(r);
	if (dtype != CACHEW_INVALID && !dtype_ok((uint8_t)dtype)) {
		cwi_sr_fail(r, CACHEW_ECORRUPT, "unique: saved dtype %llu is "
		    "not an integer or string", (unsigned long long)dtype);
		return cwi_sr_error(r);
	}
	u->dtype = (uint8_t)dtype;
	if (!cwi_sr_elements(r, "values", &keys)) {
		cwi_chunk_free(&keys);
		return cwi_sr_error(r);
	}
	if (keys.n != 1) {
		cwi_sr_fail(r, CACHEW_ECORRUPT,
		    "unique: %zu saved value lists, not 1", keys.n);
		cwi_chunk_free(&keys);
		return cwi_sr_error(r);
	}
	rv = unique_restore_keys(u, r, keys.v[0]);
	cwi_chunk_free(&keys);
	return rv != CACHEW_OK ? rv : cwi_iter_restore(u->input, r);
}

static const cwi_iter_ops unique_iter_ops = {
    .next = unique_next,
    .destroy = unique_destroy,
    .save = unique_save,
    .restore = unique_restore,
};

static cachew_err
unique_create(cwi_iter **out, const cwi_node *node, const cwi_iter_args *args)
{
	unique_iter *u = calloc(1, sizeof(*u));
	cachew_err rv;

	if (u == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	u->base.ops = &unique_iter_ops;
	u->dtype = CACHEW_INVALID;
	rv = cwi_iter_create(&u->input, node->inputs[0], args);
	if (rv != CACHEW_OK) {
		free(u);
		return rv;
	}
	*out = &u->base;
	return CACHEW_OK;
}

/* The input's spec, which must be one scalar integer or string; the count
 * is unknown (0 stays 0). */
static cachew_err
unique_infer(cwi_node *node)
{
	const cwi_spec *in = &node->inputs[0]->spec;
	const cwi_comp_spec *c;
	cwi_strbuf sb;
	cachew_err rv;

	node->card = node->inputs[0]->card == 0 ? 0
						: CACHEW_CARDINALITY_UNKNOWN;
	if (!in->known)
		return CACHEW_OK;
	c = in->n == 1 ? &in->comp[0] : NULL;
	if (c != NULL && (c->rank == 0 || c->rank == CWI_RANK_UNKNOWN) &&
	    (c->dtype == CACHEW_INVALID || dtype_ok(c->dtype)))
		return cwi_spec_copy(&node->spec, in);
	cwi_strbuf_init(&sb);
	cwi_spec_print(&sb, in);
	rv = cwi_fail(CACHEW_ETYPE, "unique: elements are %s; unique takes "
	    "elements of one scalar integer (u8, i32, i64) or string "
	    "component", sb.data != NULL && !sb.oom ? sb.data : "?");
	cwi_strbuf_free(&sb);
	return rv;
}

const cwi_dataset_op cwi_op_unique = {
    .name = "unique",
    .doc = "yields the first occurrence of each distinct value, in input "
	   "order; elements are one scalar integer or string",
    .min_inputs = 1,
    .max_inputs = 1,
    .iter_create = unique_create,
    .saves = "the count of input elements read, every distinct value seen "
	"so far, and the input",
    .infer = unique_infer,
    .note = "Every distinct value is held until the iterator ends, as in "
	"tf.data. Through the service it runs in the client part, in split "
	"order in a private job, so it keeps the same first occurrences as "
	"in-process.",
};
