/*
 * plugin_example.c - an operator plugin: two functions, `square` (map) and
 * `is_even` (filter), and a source, `squares(count, splits)`, usable from
 * any pipeline once the plugin is loaded:
 *
 *   cachew run --plugin build/plugin_example.so \
 *       "range(10) | filter(is_even) | map(square)"
 *   cachew run --plugin build/plugin_example.so "squares(count=100, splits=4)"
 *
 * A plugin is a shared object exporting cachew_plugin_init, which
 * registers its functions with cachew_op_register() and its sources with
 * cachew_source_register(), and optionally
 * cachew_plugin_identity, its name and version. Pipelines name
 * functions, so the same plugin loaded by a client and by remote workers
 * gives both the same operators without shipping code. See README.md.
 *
 * Build (the Makefile does this as build/plugin_example.so):
 *   cc -std=c11 -fPIC -shared -Iinclude -o plugin_example.so plugin_example.c
 * The plugin calls cachew_* functions of the program that loads it, so it
 * does not link libcachew itself.
 */
#include "cachew.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Both functions take no parameters. Rejecting unknown keys here makes a
 * typo such as `map(square, powr=3)` fail when the pipeline is built, with
 * a message, instead of being silently ignored. */
static cachew_err
no_params_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	if (cachew_params_count(params) > 0) {
		snprintf(err, errlen, "unknown parameter '%s' (takes none)",
		    cachew_params_key(params, 0));
		return CACHEW_EINVAL;
	}
	*state = NULL;
	return CACHEW_OK;
}

/* Squares every value of one fixed-width component in place. */
static cachew_err
square_component(cachew_op_ctx *ctx, cachew_element *e, size_t c)
{
	const cachew_tensor *t = cachew_element_component(e, c);
	cachew_dtype dtype = cachew_tensor_dtype(t);
	int64_t n = cachew_tensor_numel(t);
	void *data;
	cachew_err rv;

	if (dtype != CACHEW_I64 && dtype != CACHEW_F64)
		return cachew_op_ctx_fail(ctx,
		    "component %zu is %s; square handles i64 and f64", c,
		    cachew_dtype_name(dtype));
	/* Writable in place when this element and its buffer are ours alone
	 * (the usual case after range or batch); otherwise the library copies
	 * the buffer first, so upstream data is never modified. */
	rv = cachew_element_mutable_data(e, c, &data);
	if (rv != CACHEW_OK)
		return cachew_op_ctx_fail(ctx, "component %zu: %s", c,
		    cachew_strerror(rv));
	if (dtype == CACHEW_I64) {
		int64_t *x = data;
		for (int64_t i = 0; i < n; i++)
			x[i] = (int64_t)((uint64_t)x[i] * (uint64_t)x[i]);
	} else {
		double *x = data;
		for (int64_t i = 0; i < n; i++)
			x[i] *= x[i];
	}
	return CACHEW_OK;
}

/* Map contract: `in` is ours; on success hand it (modified) back in *out,
 * on failure release it and store nothing. */
static cachew_err
square_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	for (size_t c = 0; c < cachew_element_size(in); c++) {
		cachew_err rv = square_component(ctx, in, c);
		if (rv != CACHEW_OK) {
			cachew_element_release(in);
			return rv;
		}
	}
	*out = in;
	return CACHEW_OK;
}

/* Keeps elements whose component 0 is an even i64 scalar. */
static cachew_err
is_even_filter(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	const cachew_tensor *t = cachew_element_component(in, 0);
	const int64_t *v;

	if (cachew_tensor_dtype(t) != CACHEW_I64 || cachew_tensor_rank(t) != 0)
		return cachew_op_ctx_fail(ctx,
		    "component 0 must be an i64 scalar, got %s of rank %u",
		    cachew_dtype_name(cachew_tensor_dtype(t)),
		    cachew_tensor_rank(t));
	v = cachew_tensor_data(t);
	*keep = (*v % 2) == 0;
	return CACHEW_OK;
}

/* .version comes first: it tells the loading library which fields this
 * definition has, so a newer library keeps loading the plugin and an older
 * one refuses it with a message instead of misreading it. */
static const cachew_op_def square_def = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "square",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 5,
    .init = no_params_init,
    .map = square_map,
};

static const cachew_op_def is_even_def = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "is_even",
    .kind = CACHEW_OP_FILTER,
    .cost_ns = 2,
    .init = no_params_init,
    .filter = is_even_filter,
};

/* ---- a source: squares(count=10, splits=1) ------------------------------- */

/* Yields {n: i64, square: i64} for n = 0 .. count-1, cut into `splits`
 * contiguous splits of n. A split yields the same elements whoever opens
 * it, so the service can lease the splits to several workers (each element
 * once per epoch) and a saved position can reopen one. */
typedef struct squares_state {
	int64_t count;
	int64_t splits;
} squares_state;

typedef struct squares_seq {
	int64_t next, end;
} squares_seq;

static cachew_err
squares_int(const cachew_params *params, const char *key, int64_t def,
    int64_t min, int64_t max, int64_t *out, char *err, size_t errlen)
{
	cachew_err rv;

	*out = def;
	if (!cachew_params_has(params, key))
		return CACHEW_OK;
	rv = cachew_params_get_int(params, key, out);
	if (rv == CACHEW_OK && (*out < min || *out > max))
		rv = CACHEW_ERANGE;
	if (rv != CACHEW_OK)
		snprintf(err, errlen, "%s must be an integer from %lld to %lld",
		    key, (long long)min, (long long)max);
	return rv;
}

static cachew_err
squares_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	squares_state *st;
	int64_t count, splits;
	cachew_err rv;

	for (size_t i = 0; i < cachew_params_count(params); i++) {
		const char *k = cachew_params_key(params, i);
		if (strcmp(k, "count") != 0 && strcmp(k, "splits") != 0) {
			snprintf(err, errlen, "unknown parameter '%s' (takes "
			    "count, splits)", k);
			return CACHEW_EINVAL;
		}
	}
	rv = squares_int(params, "count", 10, 0, 3037000499, &count, err,
	    errlen); /* count * count fits in an i64 */
	if (rv == CACHEW_OK)
		rv = squares_int(params, "splits", 1, 1, 1000000, &splits, err,
		    errlen);
	if (rv != CACHEW_OK)
		return rv;
	st = malloc(sizeof(*st));
	if (st == NULL)
		return CACHEW_ENOMEM;
	st->count = count;
	st->splits = splits;
	*state = st;
	return CACHEW_OK;
}

static void
squares_fini(void *state)
{
	free(state);
}

static cachew_err
squares_splits(void *state, uint64_t *nsplits, char *err, size_t errlen)
{
	const squares_state *st = state;

	(void)err;
	(void)errlen;
	*nsplits = (uint64_t)st->splits;
	return CACHEW_OK;
}

static cachew_err
squares_open(cachew_op_ctx *ctx, uint64_t split, void **seq)
{
	const squares_state *st = cachew_op_ctx_state(ctx);
	squares_seq *q = malloc(sizeof(*q));

	if (q == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	/* Split k holds [k * count / splits, (k + 1) * count / splits). */
	q->next = (int64_t)split * st->count / st->splits;
	q->end = ((int64_t)split + 1) * st->count / st->splits;
	*seq = q;
	return CACHEW_OK;
}

static cachew_err
squares_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	squares_seq *q = seq;
	cachew_element *e = NULL;
	void *n, *sq;
	cachew_err rv;

	if (q->next >= q->end)
		return CACHEW_EOF;
	rv = cachew_element_create(&e, 2);
	if (rv == CACHEW_OK)
		rv = cachew_element_alloc(e, 0, CACHEW_I64, 0, NULL, &n);
	if (rv == CACHEW_OK)
		rv = cachew_element_alloc(e, 1, CACHEW_I64, 0, NULL, &sq);
	if (rv != CACHEW_OK) {
		cachew_element_release(e);
		return cachew_op_ctx_fail(ctx, "%s", cachew_strerror(rv));
	}
	*(int64_t *)n = q->next;
	*(int64_t *)sq = q->next * q->next;
	q->next++;
	*out = e;
	return CACHEW_OK;
}

static void
squares_close(void *seq)
{
	free(seq);
}

static const cachew_source_def squares_def = {
    .version = CACHEW_SOURCE_DEF_VERSION,
    .name = "squares",
    .doc = "squares(count=10, splits=1): {n, square} for n in [0, count), "
	   "in `splits` splits",
    .element_spec = "{n: i64[], square: i64[]}",
    .init = squares_init,
    .fini = squares_fini,
    .splits = squares_splits,
    .open = squares_open,
    .next = squares_next,
    .close = squares_close,
};

/* Who the plugin is: its name and version, with a hash of this file's
 * bytes that the library computes, are part of the fingerprint of every
 * pipeline using square or is_even, so caches made with one build are
 * never read with another, and the service runs such pipelines only on
 * workers that loaded this very build. Optional (without it the name is
 * the file's and the version empty), read before cachew_plugin_init. The
 * Makefile builds a second copy with another version for the tests. */
#ifndef PLUGIN_EXAMPLE_VERSION
#define PLUGIN_EXAMPLE_VERSION "1.0"
#endif
CACHEW_API const cachew_plugin_info cachew_plugin_identity;

const cachew_plugin_info cachew_plugin_identity = {
    .version = CACHEW_PLUGIN_INFO_VERSION,
    .name = "plugin_example",
    .plugin_version = PLUGIN_EXAMPLE_VERSION,
};

/* The init function. `abi` is the loading library's
 * CACHEW_VERSION_NUMBER: refuse another major version, or a library older
 * than the header this plugin was built against (it may lack functions the
 * plugin calls). */
CACHEW_API cachew_err cachew_plugin_init(unsigned abi);

cachew_err
cachew_plugin_init(unsigned abi)
{
	cachew_err rv;

	if (abi / 10000 != CACHEW_VERSION_MAJOR ||
	    abi / 100 < CACHEW_VERSION_NUMBER / 100)
		return CACHEW_ENOTSUP;
	rv = cachew_op_register(&square_def);
	if (rv == CACHEW_OK)
		rv = cachew_op_register(&is_even_def);
	if (rv == CACHEW_OK)
		rv = cachew_source_register(&squares_def);
	return rv;
}
