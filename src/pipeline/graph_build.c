/*
 * graph_build.c - the per-operator builders of the public API: each one
 * packs its arguments into named values and calls cwi_node_build.
 */
#include "pipeline.h"

#include <stdlib.h>

/* Named values under construction; the first failure sticks. */
typedef struct kv_builder {
	cwi_value map;
	cachew_err rv;
} kv_builder;

static void
kv_init(kv_builder *b)
{
	memset(b, 0, sizeof(*b));
	b->map.type = CWI_V_MAP;
}

static void
kv_put(kv_builder *b, const char *key, cwi_value *v)
{
	if (b->rv == CACHEW_OK)
		b->rv = cwi_map_set(&b->map, key, v);
	cwi_value_free(v);
}

static void
kv_int(kv_builder *b, const char *key, int64_t i)
{
	cwi_value v = {.type = CWI_V_INT, .u.i = i};
	kv_put(b, key, &v);
}

static void
kv_float(kv_builder *b, const char *key, double f)
{
	cwi_value v = {.type = CWI_V_FLOAT, .u.f = f};
	kv_put(b, key, &v);
}

static void
kv_bool(kv_builder *b, const char *key, int x)
{
	cwi_value v = {.type = CWI_V_BOOL, .u.b = x != 0};
	kv_put(b, key, &v);
}

static void
kv_str(kv_builder *b, const char *key, const char *s)
{
	cwi_value v = {0};
	if (s == NULL) {
		if (b->rv == CACHEW_OK)
			b->rv = cwi_fail(CACHEW_EINVAL, "'%s' is NULL", key);
		return;
	}
	if (b->rv == CACHEW_OK)
		b->rv = cwi_value_set_str(&v, s, strlen(s));
	kv_put(b, key, &v);
}

static void
kv_strs(kv_builder *b, const char *key, const char *const *s, size_t n)
{
	cwi_value list = {.type = CWI_V_LIST};
	for (size_t i = 0; i < n && b->rv == CACHEW_OK; i++) {
		cwi_value v = {0};
		if (s[i] == NULL) {
			b->rv = cwi_fail(CACHEW_EINVAL, "'%s' item %zu is NULL",
			    key, i);
			break;
		}
		b->rv = cwi_value_set_str(&v, s[i], strlen(s[i]));
		if (b->rv == CACHEW_OK)
			b->rv = cwi_value_list_push(&list, &v);
		cwi_value_free(&v);
	}
	kv_put(b, key, &list);
}

static void
kv_literal(kv_builder *b, const char *key, const char *text)
{
	cwi_value v = {0};
	if (text == NULL) {
		if (b->rv == CACHEW_OK)
			b->rv = cwi_fail(CACHEW_EINVAL, "'%s' is NULL", key);
		return;
	}
	if (b->rv == CACHEW_OK)
		b->rv = cwi_value_parse(&v, text);
	kv_put(b, key, &v);
}

static void
kv_fn(kv_builder *b, const char *fn, const cachew_params *fn_params)
{
	cwi_value v = {0};
	kv_str(b, "fn", fn);
	if (fn_params != NULL && b->rv == CACHEW_OK) {
		b->rv = cwi_value_copy(&v, &fn_params->map);
		kv_put(b, "fn_params", &v);
	}
}

static cachew_err
kv_build(kv_builder *b, cachew_dataset **out, const char *op,
    cachew_dataset *const *inputs, size_t ninputs)
{
	cachew_err rv = b->rv;

	cwi_builtins_ready();
	if (rv == CACHEW_OK && out == NULL)
		rv = cwi_fail(CACHEW_EINVAL, "%s: out is NULL", op);
	for (size_t i = 0; rv == CACHEW_OK && i < ninputs; i++)
		if (inputs[i] == NULL)
			rv = cwi_fail(CACHEW_EINVAL, "%s: input %zu is NULL", op,
			    i);
	if (rv == CACHEW_OK)
		rv = cwi_node_build(out, op, inputs, ninputs, NULL, &b->map);
	cwi_value_free(&b->map);
	return rv;
}

#define BEGIN         \
	kv_builder b; \
	cwi_clear_errmsg(); \
	kv_init(&b)

cachew_err
cachew_dataset_range(
    cachew_dataset **out, int64_t start, int64_t stop, int64_t step)
{
	BEGIN;
	kv_int(&b, "start", start);
	kv_int(&b, "stop", stop);
	kv_int(&b, "step", step);
	return kv_build(&b, out, "range", NULL, 0);
}

cachew_err
cachew_dataset_counter(cachew_dataset **out, int64_t start, int64_t step)
{
	BEGIN;
	kv_int(&b, "start", start);
	kv_int(&b, "step", step);
	return kv_build(&b, out, "counter", NULL, 0);
}

cachew_err
cachew_dataset_from_tensors(cachew_dataset **out, const char *values)
{
	BEGIN;
	kv_literal(&b, "values", values);
	return kv_build(&b, out, "from_tensors", NULL, 0);
}

cachew_err
cachew_dataset_from_list(cachew_dataset **out, const char *values)
{
	BEGIN;
	kv_literal(&b, "values", values);
	return kv_build(&b, out, "from_list", NULL, 0);
}

cachew_err
cachew_dataset_list_files(
    cachew_dataset **out, const char *glob, int shuffle, int64_t seed)
{
	BEGIN;
	kv_str(&b, "files", glob);
	kv_bool(&b, "shuffle", shuffle);
	kv_int(&b, "seed", seed);
	return kv_build(&b, out, "list_files", NULL, 0);
}

cachew_err
cachew_dataset_text_lines(
    cachew_dataset **out, const char *const *files, size_t nfiles)
{
	BEGIN;
	kv_strs(&b, "files", files, nfiles);
	return kv_build(&b, out, "text_lines", NULL, 0);
}

cachew_err
cachew_dataset_fixed_length_records(cachew_dataset **out,
    const char *const *files, size_t nfiles, int64_t record_bytes)
{
	BEGIN;
	kv_strs(&b, "files", files, nfiles);
	kv_int(&b, "record_bytes", record_bytes);
	return kv_build(&b, out, "fixed_length_records", NULL, 0);
}

cachew_err
cachew_dataset_map(cachew_dataset **out, cachew_dataset *in, const char *fn,
    const cachew_params *fn_params, int parallel)
{
	BEGIN;
	kv_fn(&b, fn, fn_params);
	kv_int(&b, "parallel", parallel);
	return kv_build(&b, out, "map", &in, 1);
}

cachew_err
cachew_dataset_read_file(cachew_dataset **out, cachew_dataset *in)
{
	BEGIN;
	return kv_build(&b, out, "read_file", &in, 1);
}

cachew_err
cachew_dataset_filter(cachew_dataset **out, cachew_dataset *in,
    const char *fn, const cachew_params *fn_params)
{
	BEGIN;
	kv_fn(&b, fn, fn_params);
	return kv_build(&b, out, "filter", &in, 1);
}

cachew_err
cachew_dataset_take_while(cachew_dataset **out, cachew_dataset *in,
    const char *fn, const cachew_params *fn_params)
{
	BEGIN;
	kv_fn(&b, fn, fn_params);
	return kv_build(&b, out, "take_while", &in, 1);
}

cachew_err
cachew_dataset_unique(cachew_dataset **out, cachew_dataset *in)
{
	BEGIN;
	return kv_build(&b, out, "unique", &in, 1);
}

static cachew_err
scan_build(cachew_dataset **out, cachew_dataset *in, const char *op,
    const char *reducer, const char *initial)
{
	BEGIN;
	kv_str(&b, "reducer", reducer);
	if (initial != NULL)
		kv_literal(&b, "initial", initial);
	return kv_build(&b, out, op, &in, 1);
}

cachew_err
cachew_dataset_scan(cachew_dataset **out, cachew_dataset *in,
    const char *reducer, const char *initial)
{
	return scan_build(out, in, "scan", reducer, initial);
}

cachew_err
cachew_dataset_reduce(cachew_dataset **out, cachew_dataset *in,
    const char *reducer, const char *initial)
{
	return scan_build(out, in, "reduce", reducer, initial);
}

cachew_err
cachew_dataset_window(cachew_dataset **out, cachew_dataset *in, int64_t size,
    int64_t shift, int64_t stride, int drop_remainder)
{
	BEGIN;
	kv_int(&b, "size", size);
	if (shift != 0)
		kv_int(&b, "shift", shift);
	kv_int(&b, "stride", stride);
	kv_bool(&b, "drop_remainder", drop_remainder);
	return kv_build(&b, out, "window", &in, 1);
}

cachew_err
cachew_dataset_group_by_window(cachew_dataset **out, cachew_dataset *in,
    const char *key_fn, const cachew_params *key_fn_params,
    int64_t window_size, int drop_remainder)
{
	BEGIN;
	kv_fn(&b, key_fn, key_fn_params);
	kv_int(&b, "window_size", window_size);
	kv_bool(&b, "drop_remainder", drop_remainder);
	return kv_build(&b, out, "group_by_window", &in, 1);
}

static void
kv_ints(kv_builder *b, const char *key, const int64_t *v, size_t n)
{
	cwi_value list = {.type = CWI_V_LIST};

	if (v == NULL && n > 0 && b->rv == CACHEW_OK)
		b->rv = cwi_fail(CACHEW_EINVAL, "'%s' is NULL", key);
	for (size_t i = 0; i < n && b->rv == CACHEW_OK; i++) {
		cwi_value x = {.type = CWI_V_INT, .u.i = v[i]};
		b->rv = cwi_value_list_push(&list, &x);
	}
	kv_put(b, key, &list);
}

/* A component's name, or its index in decimal. */
static void
kv_component(kv_builder *b, const char *key, const char *comp)
{
	size_t len = comp != NULL ? strlen(comp) : 0;
	bool digits = len > 0 && len < 4;

	for (size_t i = 0; digits && i < len; i++)
		digits = comp[i] >= '0' && comp[i] <= '9';
	if (comp == NULL)
		kv_int(b, key, 0);
	else if (digits)
		kv_int(b, key, strtoll(comp, NULL, 10));
	else
		kv_str(b, key, comp);
}

cachew_err
cachew_dataset_bucket_by_sequence_length(cachew_dataset **out,
    cachew_dataset *in, const char *element_length,
    const int64_t *bucket_boundaries, size_t nboundaries,
    const int64_t *bucket_batch_sizes, double pad_value,
    int pad_to_bucket_boundary, int no_padding, int drop_remainder)
{
	BEGIN;
	kv_component(&b, "element_length", element_length);
	kv_ints(&b, "bucket_boundaries", bucket_boundaries, nboundaries);
	kv_ints(&b, "bucket_batch_sizes", bucket_batch_sizes,
	    bucket_batch_sizes != NULL ? nboundaries + 1 : 0);
	kv_float(&b, "pad_value", pad_value);
	kv_bool(&b, "pad_to_bucket_boundary", pad_to_bucket_boundary);
	kv_bool(&b, "no_padding", no_padding);
	kv_bool(&b, "drop_remainder", drop_remainder);
	return kv_build(&b, out, "bucket_by_sequence_length", &in, 1);
}

cachew_err
cachew_dataset_ragged_batch(cachew_dataset **out, cachew_dataset *in,
    int64_t n, int drop_remainder, cachew_dtype row_splits_dtype)
{
	BEGIN;
	kv_int(&b, "n", n);
	kv_bool(&b, "drop_remainder", drop_remainder);
	kv_str(&b, "row_splits_dtype", cachew_dtype_name(row_splits_dtype));
	return kv_build(&b, out, "ragged_batch", &in, 1);
}

cachew_err
cachew_dataset_flat_map(cachew_dataset **out, cachew_dataset *in,
    const char *fn, const cachew_params *fn_params)
{
	BEGIN;
	kv_fn(&b, fn, fn_params);
	return kv_build(&b, out, "flat_map", &in, 1);
}

cachew_err
cachew_dataset_interleave(cachew_dataset **out, cachew_dataset *in,
    const char *fn, const cachew_params *fn_params, int64_t cycle,
    int64_t block, int parallel)
{
	BEGIN;
	kv_fn(&b, fn, fn_params);
	kv_int(&b, "cycle", cycle);
	kv_int(&b, "block", block);
	kv_int(&b, "parallel", parallel);
	return kv_build(&b, out, "interleave", &in, 1);
}

cachew_err
cachew_dataset_batch(
    cachew_dataset **out, cachew_dataset *in, int64_t n, int drop_remainder)
{
	BEGIN;
	kv_int(&b, "n", n);
	kv_bool(&b, "drop_remainder", drop_remainder);
	return kv_build(&b, out, "batch", &in, 1);
}

cachew_err
cachew_dataset_padded_batch(cachew_dataset **out, cachew_dataset *in,
    int64_t n, double pad_value, int drop_remainder)
{
	BEGIN;
	kv_int(&b, "n", n);
	kv_float(&b, "pad_value", pad_value);
	kv_bool(&b, "drop_remainder", drop_remainder);
	return kv_build(&b, out, "padded_batch", &in, 1);
}

cachew_err
cachew_dataset_unbatch(cachew_dataset **out, cachew_dataset *in)
{
	BEGIN;
	return kv_build(&b, out, "unbatch", &in, 1);
}

cachew_err
cachew_dataset_shuffle(cachew_dataset **out, cachew_dataset *in,
    int64_t buffer, int64_t seed, int reshuffle)
{
	BEGIN;
	kv_int(&b, "buffer", buffer);
	kv_int(&b, "seed", seed);
	kv_bool(&b, "reshuffle_each_iteration", reshuffle);
	return kv_build(&b, out, "shuffle", &in, 1);
}

cachew_err
cachew_dataset_repeat(cachew_dataset **out, cachew_dataset *in, int64_t count)
{
	BEGIN;
	kv_int(&b, "count", count);
	return kv_build(&b, out, "repeat", &in, 1);
}

cachew_err
cachew_dataset_take(cachew_dataset **out, cachew_dataset *in, int64_t n)
{
	BEGIN;
	kv_int(&b, "n", n);
	return kv_build(&b, out, "take", &in, 1);
}

cachew_err
cachew_dataset_skip(cachew_dataset **out, cachew_dataset *in, int64_t n)
{
	BEGIN;
	kv_int(&b, "n", n);
	return kv_build(&b, out, "skip", &in, 1);
}

cachew_err
cachew_dataset_prefetch(cachew_dataset **out, cachew_dataset *in, int64_t n)
{
	BEGIN;
	kv_int(&b, "n", n);
	return kv_build(&b, out, "prefetch", &in, 1);
}

cachew_err
cachew_dataset_shard(
    cachew_dataset **out, cachew_dataset *in, int64_t num, int64_t index)
{
	BEGIN;
	kv_int(&b, "num", num);
	kv_int(&b, "index", index);
	return kv_build(&b, out, "shard", &in, 1);
}

cachew_err
cachew_dataset_zip(cachew_dataset **out, cachew_dataset *const *inputs, size_t n)
{
	BEGIN;
	if (inputs == NULL && n > 0)
		b.rv = cwi_fail(CACHEW_EINVAL, "zip: inputs is NULL");
	return kv_build(&b, out, "zip", inputs, n);
}

cachew_err
cachew_dataset_concatenate(
    cachew_dataset **out, cachew_dataset *a, cachew_dataset *c)
{
	cachew_dataset *in[2] = {a, c};
	BEGIN;
	return kv_build(&b, out, "concatenate", in, 2);
}

static void
kv_floats(kv_builder *b, const char *key, const double *f, size_t n)
{
	cwi_value list = {.type = CWI_V_LIST};
	for (size_t i = 0; i < n && b->rv == CACHEW_OK; i++) {
		cwi_value v = {.type = CWI_V_FLOAT, .u.f = f[i]};
		b->rv = cwi_value_list_push(&list, &v);
	}
	kv_put(b, key, &list);
}

cachew_err
cachew_dataset_sample_from_datasets(cachew_dataset **out,
    cachew_dataset *const *inputs, size_t n, const double *weights,
    int64_t seed, int stop_on_empty_dataset)
{
	BEGIN;
	if (inputs == NULL && n > 0)
		b.rv = cwi_fail(CACHEW_EINVAL, "sample_from_datasets: inputs is "
		    "NULL");
	if (weights != NULL)
		kv_floats(&b, "weights", weights, n);
	kv_int(&b, "seed", seed);
	kv_bool(&b, "stop_on_empty_dataset", stop_on_empty_dataset);
	return kv_build(&b, out, "sample_from_datasets", inputs, n);
}

cachew_err
cachew_dataset_choose_from_datasets(cachew_dataset **out,
    cachew_dataset *const *inputs, size_t n, cachew_dataset *choice,
    int stop_on_empty_dataset)
{
	cachew_dataset *in[CWI_MAX_INPUTS];
	BEGIN;
	if ((inputs == NULL && n > 0) || choice == NULL)
		b.rv = cwi_fail(CACHEW_EINVAL, "choose_from_datasets: %s is "
		    "NULL", choice == NULL ? "choice" : "inputs");
	else if (n + 1 > CWI_MAX_INPUTS)
		b.rv = cwi_fail(CACHEW_EINVAL, "choose_from_datasets: %zu "
		    "datasets and the choice dataset are more than %d inputs",
		    n, CWI_MAX_INPUTS);
	else {
		for (size_t i = 0; i < n; i++)
			in[i] = inputs[i];
		in[n] = choice;
	}
	kv_bool(&b, "stop_on_empty_dataset", stop_on_empty_dataset);
	return kv_build(&b, out, "choose_from_datasets", in, b.rv == CACHEW_OK
	    ? n + 1 : 0);
}

cachew_err
cachew_dataset_enumerate(cachew_dataset **out, cachew_dataset *in, int64_t start)
{
	BEGIN;
	kv_int(&b, "start", start);
	return kv_build(&b, out, "enumerate", &in, 1);
}

cachew_err
cachew_dataset_autocache(cachew_dataset **out, cachew_dataset *in)
{
	BEGIN;
	return kv_build(&b, out, "autocache", &in, 1);
}

/* ---- issue 15, part A --------------------------------------------------- */

cachew_err
cachew_dataset_ignore_errors(cachew_dataset **out, cachew_dataset *in,
    int log_warning)
{
	BEGIN;
	kv_bool(&b, "log_warning", log_warning);
	return kv_build(&b, out, "ignore_errors", &in, 1);
}

cachew_err
cachew_dataset_rebatch(cachew_dataset **out, cachew_dataset *in,
    const int64_t *sizes, size_t nsizes, int drop_remainder)
{
	cwi_strbuf text = {0};
	cachew_err rv;

	if (sizes == NULL || nsizes == 0 || nsizes > 1024) {
		cwi_clear_errmsg();
		return cwi_fail(sizes == NULL ? CACHEW_EINVAL : CACHEW_ERANGE,
		    "rebatch: %zu sizes; give 1 to 1024", nsizes);
	}
	cwi_strbuf_append(&text, "[", 1);
	for (size_t i = 0; i < nsizes; i++)
		cwi_strbuf_printf(&text, "%s%lld", i > 0 ? ", " : "",
		    (long long)sizes[i]);
	cwi_strbuf_append(&text, "]", 1);
	if (text.oom) {
		cwi_strbuf_free(&text);
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	}
	{
		BEGIN;
		kv_literal(&b, "batch_size", text.data);
		kv_bool(&b, "drop_remainder", drop_remainder);
		rv = kv_build(&b, out, "rebatch", &in, 1);
	}
	cwi_strbuf_free(&text);
	return rv;
}

cachew_err
cachew_dataset_range_typed(cachew_dataset **out, int64_t start, int64_t stop,
    int64_t step, cachew_dtype output_type)
{
	const char *name = cachew_dtype_name(output_type);

	if (output_type == CACHEW_I64)
		return cachew_dataset_range(out, start, stop, step);
	BEGIN;
	kv_int(&b, "start", start);
	kv_int(&b, "stop", stop);
	kv_int(&b, "step", step);
	kv_str(&b, "output_type", name != NULL ? name : "?");
	return kv_build(&b, out, "range", NULL, 0);
}

cachew_err
cachew_dataset_random(cachew_dataset **out, int64_t seed,
    int rerandomize_each_iteration)
{
	BEGIN;
	kv_int(&b, "seed", seed);
	kv_bool(&b, "rerandomize_each_iteration", rerandomize_each_iteration);
	return kv_build(&b, out, "random", NULL, 0);
}

cachew_err
cachew_dataset_padded_batch_values(cachew_dataset **out, cachew_dataset *in,
    int64_t n, const char *pad_values, int drop_remainder)
{
	BEGIN;
	kv_int(&b, "n", n);
	kv_literal(&b, "pad_value", pad_values);
	kv_bool(&b, "drop_remainder", drop_remainder);
	return kv_build(&b, out, "padded_batch", &in, 1);
}

cachew_err
cachew_dataset_batch_parallel(cachew_dataset **out, cachew_dataset *in,
    int64_t n, int drop_remainder, int parallel, int deterministic)
{
	BEGIN;
	kv_int(&b, "n", n);
	kv_bool(&b, "drop_remainder", drop_remainder);
	kv_int(&b, "parallel", parallel);
	kv_bool(&b, "deterministic", deterministic);
	return kv_build(&b, out, "batch", &in, 1);
}

cachew_err
cachew_dataset_cache_memory(cachew_dataset **out, cachew_dataset *in,
    int64_t memory_limit)
{
	BEGIN;
	if (memory_limit < 0 && b.rv == CACHEW_OK)
		b.rv = cwi_fail(CACHEW_ERANGE, "cache: memory_limit %lld is "
		    "negative", (long long)memory_limit);
	if (memory_limit > 0)
		kv_int(&b, "memory_limit", memory_limit);
	return kv_build(&b, out, "cache", &in, 1);
}
