/*
 * check_ops.c - the transformation operators of src/ops: exact outputs,
 * edge cases, errors (code and message), structure, randomness and
 * resource release.
 *
 * The functions the tests need (filters, flat_maps, maps that build bytes
 * or ragged tensors) are registered once per process under "ops_test_"
 * names.
 */
#include "cwt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- test functions ----------------------------------------------------- */

static int64_t
scalar_of(const cachew_element *e)
{
	return *(const int64_t *)cachew_tensor_data(
	    cachew_element_component(e, 0));
}

static cachew_err
is_even(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	(void)ctx;
	*keep = scalar_of(in) % 2 == 0;
	return CACHEW_OK;
}

static cachew_err
fail_at_5(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	if (scalar_of(in) == 5)
		return cachew_op_ctx_fail(ctx, "bad value %lld",
		    (long long)scalar_of(in));
	*keep = 1;
	return CACHEW_OK;
}

/* dup_n: x copies of the scalar x. */
typedef struct dup_seq {
	int64_t x, left;
} dup_seq;

static cachew_err
dup_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	dup_seq *s;
	int64_t x = scalar_of(in);

	if (x < 0)
		return cachew_op_ctx_fail(ctx, "negative count %lld",
		    (long long)x);
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->x = x;
	s->left = x;
	*seq = s;
	return CACHEW_OK;
}

static cachew_err
dup_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	dup_seq *s = seq;
	cachew_tensor *t;
	cachew_element *e;

	(void)ctx;
	if (s->left == 0)
		return CACHEW_EOF;
	s->left--;
	ck_assert_int_eq(cachew_element_create(&e, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_create_scalar(&t, CACHEW_I64, &s->x),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, 0, t), CACHEW_OK);
	cachew_tensor_release(t);
	*out = e;
	return CACHEW_OK;
}

static void
dup_close(void *seq)
{
	free(seq);
}

/* Sets component c of e to an i64 tensor of the given shape holding
 * 0, 1, 2, ... in row-major order. */
static void
set_iota(cachew_element *e, size_t c, unsigned rank, const int64_t *shape)
{
	int64_t *d, n = 1;

	for (unsigned i = 0; i < rank; i++)
		n *= shape[i];
	ck_assert_int_eq(cachew_element_alloc(e, c, CACHEW_I64, rank, shape,
			     (void **)&d),
	    CACHEW_OK);
	for (int64_t i = 0; i < n; i++)
		d[i] = i;
}

static cachew_element *
new_element(size_t n)
{
	cachew_element *e;
	ck_assert_int_eq(cachew_element_create(&e, n), CACHEW_OK);
	return e;
}

/* iota: x -> i64[x] = 0..x-1 */
static cachew_err
iota_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t shape[1] = {scalar_of(in)};
	cachew_element *e = new_element(1);

	(void)ctx;
	set_iota(e, 0, 1, shape);
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

/* mat: x -> i64[x, x] = 0..x*x-1 */
static cachew_err
mat_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t shape[2] = {scalar_of(in), scalar_of(in)};
	cachew_element *e = new_element(1);

	(void)ctx;
	set_iota(e, 0, 2, shape);
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

/* pair: x -> (i64[x] = 0..x-1, x) */
static cachew_err
pair_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t shape[1] = {scalar_of(in)};
	cachew_element *e = new_element(2);
	int64_t *d;

	(void)ctx;
	set_iota(e, 0, 1, shape);
	ck_assert_int_eq(cachew_element_alloc(e, 1, CACHEW_I64, 0, NULL,
			     (void **)&d),
	    CACHEW_OK);
	*d = shape[0];
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

/* ragged: x -> (i64[2], i64[3]): components that disagree on dim 0. */
static cachew_err
ragged_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t two[1] = {2}, three[1] = {3};
	cachew_element *e = new_element(2);

	(void)ctx;
	set_iota(e, 0, 1, two);
	set_iota(e, 1, 1, three);
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

static void
set_strings(cachew_element *e, size_t c, unsigned rank, const int64_t *shape,
    int64_t n, const char *prefix)
{
	char buf[16][32];
	const void *items[16];
	size_t lens[16];
	cachew_tensor *t;

	ck_assert_int_le(n, 16);
	for (int64_t i = 0; i < n; i++) {
		snprintf(buf[i], sizeof(buf[i]), "%s%lld", prefix, (long long)i);
		items[i] = buf[i];
		lens[i] = strlen(buf[i]);
	}
	ck_assert_int_eq(cachew_tensor_create_bytes(&t, rank, shape, items, lens),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, c, t), CACHEW_OK);
	cachew_tensor_release(t);
}

/* str: x -> the bytes scalar "s<x>" */
static cachew_err
str_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	char s[32];
	const void *items[1] = {s};
	size_t lens[1];
	cachew_element *e = new_element(1);
	cachew_tensor *t;

	(void)ctx;
	snprintf(s, sizeof(s), "s%lld", (long long)scalar_of(in));
	lens[0] = strlen(s);
	ck_assert_int_eq(cachew_tensor_create_bytes(&t, 0, NULL, items, lens),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(e, 0, t), CACHEW_OK);
	cachew_tensor_release(t);
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

/* strs: x -> bytes[x] = "0", "1", ... */
static cachew_err
strs_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t shape[1] = {scalar_of(in)};
	cachew_element *e = new_element(1);

	(void)ctx;
	set_strings(e, 0, 1, shape, shape[0], "");
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

/* Functions with a parameter keep it as their state. */
static cachew_err
int_param_init(const cachew_params *params, void **state, char *err,
    size_t errlen, const char *key, int64_t def)
{
	int64_t *v = malloc(sizeof(*v));

	if (v == NULL)
		return CACHEW_ENOMEM;
	*v = def;
	if (cachew_params_has(params, key) &&
	    cachew_params_get_int(params, key, v) != CACHEW_OK) {
		snprintf(err, errlen, "%s must be an integer", key);
		free(v);
		return CACHEW_EINVAL;
	}
	*state = v;
	return CACHEW_OK;
}

static cachew_err
wide_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	return int_param_init(params, state, err, errlen, "n", 40);
}

static cachew_err
dtype_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	const char *name = "i64";
	cachew_dtype *dt = malloc(sizeof(*dt));

	if (dt == NULL)
		return CACHEW_ENOMEM;
	if (cachew_params_has(params, "dtype"))
		(void)cachew_params_get_str(params, "dtype", &name);
	if (cachew_dtype_from_name(name, dt) != CACHEW_OK) {
		snprintf(err, errlen, "bad dtype '%s'", name);
		free(dt);
		return CACHEW_EINVAL;
	}
	*state = dt;
	return CACHEW_OK;
}

/* wide(n): x -> n scalar components, each x */
static cachew_err
wide_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t n = *(const int64_t *)cachew_op_ctx_state(ctx);
	int64_t x = scalar_of(in);
	cachew_element *e = new_element((size_t)n);

	for (int64_t c = 0; c < n; c++) {
		int64_t *d;
		ck_assert_int_eq(cachew_element_alloc(e, (size_t)c, CACHEW_I64, 0,
				     NULL, (void **)&d),
		    CACHEW_OK);
		*d = x;
	}
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

/* iota_as(dtype): x -> dtype[x] holding 1..x (bool: 1, 0, 1, ...; f16 and
 * bf16: zeros) */
static cachew_err
iota_as_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	cachew_dtype dt = *(const cachew_dtype *)cachew_op_ctx_state(ctx);
	int64_t shape[1] = {scalar_of(in)};
	cachew_element *e = new_element(1);
	void *d;

	ck_assert_int_eq(cachew_element_alloc(e, 0, dt, 1, shape, &d),
	    CACHEW_OK);
	for (int64_t i = 0; i < shape[0]; i++) {
		switch (dt) {
		case CACHEW_U8:
			((uint8_t *)d)[i] = (uint8_t)(i + 1);
			break;
		case CACHEW_BOOL:
			((uint8_t *)d)[i] = (uint8_t)((i + 1) % 2);
			break;
		case CACHEW_I32:
			((int32_t *)d)[i] = (int32_t)(i + 1);
			break;
		case CACHEW_I64:
			((int64_t *)d)[i] = i + 1;
			break;
		case CACHEW_F32:
			((float *)d)[i] = (float)(i + 1);
			break;
		case CACHEW_F64:
			((double *)d)[i] = (double)(i + 1);
			break;
		default:
			break;
		}
	}
	cachew_element_release(in);
	*out = e;
	return CACHEW_OK;
}

static void
free_state(void *state)
{
	free(state);
}

static void
register_all(void)
{
	static const cachew_op_def defs[] = {
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_is_even",
		.kind = CACHEW_OP_FILTER,
		.filter = is_even},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_fail_at_5",
		.kind = CACHEW_OP_FILTER,
		.filter = fail_at_5},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_dup_n",
		.kind = CACHEW_OP_FLAT_MAP,
		.flat_open = dup_open, .flat_next = dup_next,
		.flat_close = dup_close},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_iota",
		.kind = CACHEW_OP_MAP, .map = iota_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_mat",
		.kind = CACHEW_OP_MAP, .map = mat_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_pair",
		.kind = CACHEW_OP_MAP, .map = pair_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_ragged",
		.kind = CACHEW_OP_MAP,
		.map = ragged_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_str",
		.kind = CACHEW_OP_MAP, .map = str_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_strs",
		.kind = CACHEW_OP_MAP, .map = strs_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_wide",
		.kind = CACHEW_OP_MAP, .map = wide_map,
		.init = wide_init, .fini = free_state},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "ops_test_iota_as",
		.kind = CACHEW_OP_MAP,
		.map = iota_as_map, .init = dtype_init, .fini = free_state},
	};
	for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++)
		ck_assert_msg(cachew_op_register(&defs[i]) == CACHEW_OK,
		    "registering %s: %s", defs[i].name, cachew_errmsg());
}

static pthread_once_t register_once = PTHREAD_ONCE_INIT;

static void
setup(void)
{
	pthread_once(&register_once, register_all);
}

/* ---- helpers ------------------------------------------------------------ */

/* Runs p and returns its elements; fails the test if the run fails. */
static cachew_element **
run(const char *p, const cachew_options *opts, size_t *n)
{
	cachew_element **v;
	char err[1024];
	cachew_err rv = cwt_run(p, opts, &v, n, err, sizeof(err));

	ck_assert_msg(rv == CACHEW_OK, "'%s' failed: %s: %s", p,
	    cachew_strerror(rv), err);
	return v;
}

/* Component c of every element, comma-joined. */
static char *
join(const char *p, const cachew_options *opts, size_t c)
{
	size_t n;
	cachew_element **v = run(p, opts, &n);
	char *s = cwt_join_i64(v, n, c);
	cwt_free(v, n);
	return s;
}

#define ck_seq(pipeline, want)                                  \
	do {                                                    \
		char *got_ = cwt_seq(pipeline, NULL);           \
		ck_assert_msg(strcmp(got_, want) == 0,          \
		    "'%s' gave \"%s\", expected \"%s\"",        \
		    pipeline, got_, want);                      \
		free(got_);                                     \
	} while (0)

#define ck_seq_opts(pipeline, opts, want)                       \
	do {                                                    \
		char *got_ = cwt_seq(pipeline, opts);           \
		ck_assert_msg(strcmp(got_, want) == 0,          \
		    "'%s' gave \"%s\", expected \"%s\"",        \
		    pipeline, got_, want);                      \
		free(got_);                                     \
	} while (0)

/* Runs p expecting failure with `want` and a message containing `sub`. */
static void
expect_fail(const char *p, cachew_err want, const char *sub)
{
	cwt_run_fails(p, NULL, want, sub);
}

/* "i64[3]" for one component, "(i64[3], bytes[])" for more. */
static void
spec(const cachew_element *e, char *buf, size_t len)
{
	size_t n = 0, nc = cachew_element_size(e);

	buf[0] = '\0';
	if (nc > 1)
		n += (size_t)snprintf(buf + n, len - n, "(");
	for (size_t c = 0; c < nc; c++) {
		const cachew_tensor *t = cachew_element_component(e, c);
		const int64_t *shape = cachew_tensor_shape(t);
		n += (size_t)snprintf(buf + n, len - n, "%s%s[", c ? ", " : "",
		    cachew_dtype_name(cachew_tensor_dtype(t)));
		for (unsigned d = 0; d < cachew_tensor_rank(t); d++)
			n += (size_t)snprintf(buf + n, len - n, d ? ",%lld" : "%lld",
			    (long long)shape[d]);
		n += (size_t)snprintf(buf + n, len - n, "]");
	}
	if (nc > 1)
		snprintf(buf + n, len - n, ")");
}

#define ck_spec(e, want)                                        \
	do {                                                    \
		char spec_[256];                                \
		spec(e, spec_, sizeof(spec_));                  \
		ck_assert_str_eq(spec_, want);                  \
	} while (0)

/* The strings of a bytes component joined with '|'. */
static void
strings(const cachew_element *e, size_t c, char *buf, size_t len)
{
	const cachew_tensor *t = cachew_element_component(e, c);
	size_t n = 0;

	ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_BYTES);
	buf[0] = '\0';
	for (int64_t i = 0; i < cachew_tensor_numel(t); i++) {
		const void *d;
		size_t l;
		ck_assert_int_eq(cachew_tensor_bytes_at(t, i, &d, &l), CACHEW_OK);
		n += (size_t)snprintf(buf + n, len - n, "%s%.*s", i ? "|" : "",
		    (int)l, (const char *)d);
	}
}

#define ck_strings(e, c, want)                                  \
	do {                                                    \
		char s_[512];                                   \
		strings(e, c, s_, sizeof(s_));                  \
		ck_assert_str_eq(s_, want);                     \
	} while (0)

/* Runs p to its end and writes "name=elements" per node, comma-joined. */
static void
node_counts(const char *p, char *buf, size_t len)
{
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_op_stats rows[16];
	size_t n, w = 0;
	cachew_err rv;

	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK)
		cachew_element_release(e);
	ck_assert_int_eq(rv, CACHEW_EOF);
	ck_assert_int_eq(cachew_iterator_stats(it, rows, 16, &n), CACHEW_OK);
	buf[0] = '\0';
	for (size_t i = 0; i < n && i < 16; i++)
		w += (size_t)snprintf(buf + w, len - w, "%s%s=%llu", i ? "," : "",
		    rows[i].name, (unsigned long long)rows[i].elements);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
}

/* The i64 scalars of a run as a sorted, comma-joined string. */
static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static char *
sorted_seq(const char *p, const cachew_options *opts)
{
	size_t n;
	cachew_element **v = run(p, opts, &n);
	int64_t *x = calloc(n + 1, sizeof(*x));
	size_t cap = 16 * n + 1, w = 0;
	char *s = malloc(cap);

	ck_assert_ptr_nonnull(x);
	ck_assert_ptr_nonnull(s);
	for (size_t i = 0; i < n; i++)
		x[i] = cwt_i64(v[i], 0);
	qsort(x, n, sizeof(*x), cmp_i64);
	s[0] = '\0';
	for (size_t i = 0; i < n; i++)
		w += (size_t)snprintf(s + w, cap - w, "%s%lld", i ? "," : "",
		    (long long)x[i]);
	free(x);
	cwt_free(v, n);
	return s;
}

static cachew_options *
opts_with(int64_t seed, int64_t epoch)
{
	cachew_options *o = cwt_opts(seed, 0);
	ck_assert_int_eq(cachew_options_set_int(o, "epoch", epoch), CACHEW_OK);
	return o;
}

/* ---- batch -------------------------------------------------------------- */

START_TEST(batch_stacks_consecutive_elements)
{
	ck_seq("range(7) | batch(3)", "[0 1 2],[3 4 5],[6]");
}
END_TEST

START_TEST(batch_drop_remainder_drops_the_short_last_batch)
{
	ck_seq("range(7) | batch(3, drop_remainder=true)", "[0 1 2],[3 4 5]");
	ck_seq("range(2) | batch(3, drop_remainder=true)", "");
}
END_TEST

START_TEST(batch_larger_than_input_yields_one_batch)
{
	ck_seq("range(3) | batch(10)", "[0 1 2]");
}
END_TEST

START_TEST(batch_of_empty_input_is_empty)
{
	ck_seq("range(0) | batch(4)", "");
}
END_TEST

START_TEST(batch_huge_n_reserves_only_what_arrives)
{
	ck_seq("range(5) | batch(2000000000)", "[0 1 2 3 4]");
}
END_TEST

START_TEST(batch_stacks_rank_1_components_into_rank_2)
{
	size_t n;
	cachew_element **v = run("range(2, 4) | map(ops_test_pair) | "
				 "take(1) | repeat(2) | batch(2)",
	    NULL, &n);

	ck_assert_uint_eq(n, 1);
	ck_spec(v[0], "(i64[2,2], i64[2])");
	cwt_free(v, n);
}
END_TEST

START_TEST(batch_shape_mismatch_fails_naming_element_and_component)
{
	expect_fail("range(1, 4) | map(ops_test_iota) | batch(3)",
	    CACHEW_ETYPE,
	    "batch: element 1 component 0 is i64[2], expected i64[1] (use "
	    "padded_batch");
}
END_TEST

START_TEST(batch_stacks_bytes_scalars)
{
	size_t n;
	cachew_element **v = run("range(3) | map(ops_test_str) | batch(2)",
	    NULL, &n);

	ck_assert_uint_eq(n, 2);
	ck_spec(v[0], "bytes[2]");
	ck_strings(v[0], 0, "s0|s1");
	ck_spec(v[1], "bytes[1]");
	ck_strings(v[1], 0, "s2");
	cwt_free(v, n);
}
END_TEST

START_TEST(batch_stacks_bytes_vectors)
{
	size_t n;
	cachew_element **v = run("range(2, 3) | map(ops_test_strs) | repeat(3) "
				 "| batch(3)",
	    NULL, &n);

	ck_assert_uint_eq(n, 1);
	ck_spec(v[0], "bytes[3,2]");
	ck_strings(v[0], 0, "0|1|0|1|0|1");
	cwt_free(v, n);
}
END_TEST

START_TEST(batch_n_zero_is_rejected)
{
	expect_fail("range(3) | batch(0)", CACHEW_ERANGE,
	    "batch: parameter 'n' must be in [1, ");
}
END_TEST

/* ---- padded_batch ------------------------------------------------------- */

START_TEST(padded_batch_pads_to_the_batch_maximum)
{
	size_t n;
	cachew_element **v = run("range(1, 4) | map(ops_test_iota) | "
				 "padded_batch(3, pad_value=-1)",
	    NULL, &n);
	char *s = cwt_join_i64(v, n, 0);

	ck_assert_uint_eq(n, 1);
	ck_spec(v[0], "i64[3,3]");
	ck_assert_str_eq(s, "[0 -1 -1 0 1 -1 0 1 2]");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(padded_batch_pads_with_zero_by_default)
{
	ck_seq("range(1, 4) | map(ops_test_iota) | padded_batch(2)",
	    "[0 0 0 1],[0 1 2]");
}
END_TEST

START_TEST(padded_batch_pads_each_batch_to_its_own_maximum)
{
	ck_seq("range(0, 4) | map(ops_test_iota) | padded_batch(2, "
	       "pad_value=9)",
	    "[9 0],[0 1 9 0 1 2]");
}
END_TEST

START_TEST(padded_batch_pads_two_dimensions)
{
	ck_seq("range(1, 3) | map(ops_test_mat) | padded_batch(2, "
	       "pad_value=-1)",
	    "[0 -1 -1 -1 0 1 2 3]");
}
END_TEST

START_TEST(padded_batch_shape_pads_to_a_fixed_size)
{
	size_t n;
	cachew_element **v = run("range(1, 3) | map(ops_test_iota) | "
				 "padded_batch(2, pad_value=7, shape=[4])",
	    NULL, &n);
	char *s = cwt_join_i64(v, n, 0);

	ck_spec(v[0], "i64[2,4]");
	ck_assert_str_eq(s, "[0 7 7 7 0 1 7 7]");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(padded_batch_shape_minus_one_uses_the_batch_maximum)
{
	ck_seq("range(1, 3) | map(ops_test_mat) | padded_batch(2, "
	       "pad_value=-1, shape=[3, -1])",
	    "[0 -1 -1 -1 -1 -1 0 1 2 3 -1 -1]");
}
END_TEST

START_TEST(padded_batch_shape_per_component)
{
	size_t n;
	cachew_element **v = run("range(1, 3) | map(ops_test_pair) | "
				 "padded_batch(2, shape=[[3], []])",
	    NULL, &n);
	char *s0 = cwt_join_i64(v, n, 0), *s1 = cwt_join_i64(v, n, 1);

	ck_assert_uint_eq(n, 1);
	ck_spec(v[0], "(i64[2,3], i64[2])");
	ck_assert_str_eq(s0, "[0 0 0 0 1 0]");
	ck_assert_str_eq(s1, "[1 2]");
	free(s0);
	free(s1);
	cwt_free(v, n);
}
END_TEST

START_TEST(padded_batch_element_larger_than_shape_fails)
{
	expect_fail("range(1, 4) | map(ops_test_iota) | padded_batch(3, "
		    "shape=[2])",
	    CACHEW_ERANGE,
	    "padded_batch: element 2 component 0 is i64[3], larger than the "
	    "padded shape [2]");
}
END_TEST

START_TEST(padded_batch_shape_rank_mismatch_fails)
{
	expect_fail("range(1, 3) | map(ops_test_iota) | padded_batch(2, "
		    "shape=[2, 2])",
	    CACHEW_ETYPE,
	    "padded_batch: component 0 is i64[1] but the padded shape [2,2] has "
	    "2 dimensions");
}
END_TEST

START_TEST(padded_batch_rank_mismatch_between_elements_fails)
{
	expect_fail("concatenate(range(1, 2) | map(ops_test_iota), range(2, 3) "
		    "| map(ops_test_mat)) | padded_batch(2)",
	    CACHEW_ETYPE,
	    "padded_batch: element 1 component 0 is i64[2,2], expected the "
	    "dtype and rank of element 0's i64[1]");
}
END_TEST

/* A padded batch's size comes from its parameters (shape) or the largest
 * element: over max_element_bytes it fails before it is allocated. One
 * element padded to [65535, 65535] would be 34 GB. */
START_TEST(padded_batch_over_max_element_bytes_fails)
{
	expect_fail("from_tensors([[1]]) | padded_batch(1, shape=[65535, "
		    "65535])", CACHEW_ERANGE, "padded_batch: a batch of 1 "
		    "elements padded to [65535,65535] (component 0) would take "
		    "34358689800 bytes, over max_element_bytes (1073741824)");
}
END_TEST

/* A batch copies its elements into one: the group stops growing once it
 * is over max_element_bytes, naming how far it got. */
START_TEST(batch_over_max_element_bytes_fails)
{
	cachew_options *o = cwt_opts(1, 1);

	ck_assert_int_eq(cachew_options_set_int(o, "max_element_bytes", 4096),
	    CACHEW_OK);
	cwt_run_fails("range(1000) | batch(1000)", o, CACHEW_ERANGE,
	    "elements (of 1000) would take");
	cwt_run_fails("range(1000) | batch(1000)", o, CACHEW_ERANGE,
	    "bytes, over max_element_bytes (4096)");
	/* Within the limit, batches come as always. */
	ck_seq_opts("range(6) | batch(3)", o, "[0 1 2],[3 4 5]");
	cachew_options_destroy(o);
}
END_TEST

START_TEST(padded_batch_bad_shape_parameter_is_rejected_when_built)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "range(3) | padded_batch(2, shape=[-2])"),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "padded_batch: dimension 0 of shape must be an integer >= 0, or "
	    "-1"));
	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "range(3) | padded_batch(2, shape=[[1], 2])"),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "item 1 is not a list"));
}
END_TEST

START_TEST(padded_batch_drop_remainder_drops_the_short_last_batch)
{
	ck_seq("range(1, 6) | map(ops_test_iota) | padded_batch(2, "
	       "drop_remainder=true)",
	    "[0 0 0 1],[0 1 2 0 0 1 2 3]");
}
END_TEST

START_TEST(padded_batch_of_scalars_stacks)
{
	ck_seq("range(5) | padded_batch(2)", "[0 1],[2 3],[4]");
}
END_TEST

/* Each dtype: elements 1..x (bool 1,0), padded with pad_value. */
static void
check_pad(const char *dtype, double pad, const void *want, size_t want_len)
{
	char p[256];
	size_t n;
	cachew_element **v;
	const cachew_tensor *t;

	snprintf(p, sizeof(p),
	    "range(1, 3) | map(ops_test_iota_as, dtype=%s) | padded_batch(2, "
	    "pad_value=%.17g)",
	    dtype, pad);
	v = run(p, NULL, &n);
	ck_assert_uint_eq(n, 1);
	t = cachew_element_component(v[0], 0);
	ck_assert_uint_eq(cachew_tensor_nbytes(t), want_len);
	ck_assert_msg(memcmp(cachew_tensor_data(t), want, want_len) == 0,
	    "%s: padded bytes differ", p);
	cwt_free(v, n);
}

START_TEST(padded_batch_converts_pad_value_to_each_dtype)
{
	const uint8_t u8[] = {1, 7, 1, 2};
	const uint8_t b[] = {1, 1, 1, 0};
	const int32_t i32[] = {1, -3, 1, 2};
	const int64_t i64[] = {1, 1099511627776LL, 1, 2};
	const float f32[] = {1, 0.5f, 1, 2};
	const double f64[] = {1, 0.1, 1, 2};
	const uint16_t f16[] = {0, 0x4700, 0, 0};
	const uint16_t f16_tenth[] = {0, 0x2e66, 0, 0};
	const uint16_t f16_tiny[] = {0, 0x0002, 0, 0};
	const uint16_t f16_inf[] = {0, 0xfc00, 0, 0};
	const uint16_t bf16[] = {0, 0x40e0, 0, 0};

	check_pad("u8", 7, u8, sizeof(u8));
	check_pad("bool", 7, b, sizeof(b));
	check_pad("i32", -3, i32, sizeof(i32));
	check_pad("i64", 1099511627776.0, i64, sizeof(i64));
	check_pad("f32", 0.5, f32, sizeof(f32));
	check_pad("f64", 0.1, f64, sizeof(f64));
	check_pad("f16", 7, f16, sizeof(f16));
	check_pad("f16", 0.1, f16_tenth, sizeof(f16_tenth));
	check_pad("f16", 1e-7, f16_tiny, sizeof(f16_tiny));
	check_pad("f16", -1e6, f16_inf, sizeof(f16_inf));
	check_pad("bf16", 7, bf16, sizeof(bf16));
}
END_TEST

START_TEST(padded_batch_pad_value_that_does_not_fit_fails)
{
	expect_fail("range(1, 3) | map(ops_test_iota_as, dtype=u8) | "
		    "padded_batch(2, pad_value=300)",
	    CACHEW_EINVAL,
	    "padded_batch: pad_value 300 does not fit component 0's dtype u8");
	expect_fail("range(1, 3) | map(ops_test_iota_as, dtype=i32) | "
		    "padded_batch(2, pad_value=0.5)",
	    CACHEW_EINVAL, "pad_value 0.5 does not fit component 0's dtype i32");
}
END_TEST

START_TEST(padded_batch_pads_bytes_with_empty_strings)
{
	size_t n;
	cachew_element **v = run("range(1, 4) | map(ops_test_strs) | "
				 "padded_batch(3)",
	    NULL, &n);

	ck_assert_uint_eq(n, 1);
	ck_spec(v[0], "bytes[3,3]");
	ck_strings(v[0], 0, "0|||0|1||0|1|2");
	cwt_free(v, n);
}
END_TEST

START_TEST(padded_batch_bytes_scalars_stack)
{
	size_t n;
	cachew_element **v = run("range(2) | map(ops_test_str) | "
				 "padded_batch(4)",
	    NULL, &n);

	ck_assert_uint_eq(n, 1);
	ck_spec(v[0], "bytes[2]");
	ck_strings(v[0], 0, "s0|s1");
	cwt_free(v, n);
}
END_TEST

/* ---- unbatch ------------------------------------------------------------ */

START_TEST(unbatch_inverts_batch)
{
	ck_seq("range(10) | batch(3) | unbatch()",
	    "0,1,2,3,4,5,6,7,8,9");
}
END_TEST

START_TEST(unbatch_skips_empty_batches)
{
	ck_seq("range(0, 4) | map(ops_test_iota) | unbatch()", "0,0,1,0,1,2");
}
END_TEST

START_TEST(unbatch_keeps_inner_dimensions)
{
	size_t n;
	cachew_element **v = run("range(3, 4) | map(ops_test_mat) | unbatch()",
	    NULL, &n);
	char *s = cwt_join_i64(v, n, 0);

	ck_assert_uint_eq(n, 3);
	ck_spec(v[0], "i64[3]");
	ck_assert_str_eq(s, "[0 1 2],[3 4 5],[6 7 8]");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(unbatch_rows_are_views_of_the_batch)
{
	size_t n;
	cachew_element **v = run("range(8, 9) | map(ops_test_mat) | unbatch()",
	    NULL, &n);
	const char *r0, *r1;

	ck_assert_uint_eq(n, 8);
	r0 = cachew_tensor_data(cachew_element_component(v[0], 0));
	r1 = cachew_tensor_data(cachew_element_component(v[1], 0));
	/* Rows of 8 i64 values, 64 bytes apart in one buffer. */
	ck_assert_int_eq(r1 - r0, 64);
	cwt_free(v, n);
}
END_TEST

START_TEST(unbatch_splits_every_component)
{
	size_t n;
	cachew_element **v = run("range(2) | enumerate(start=10) | batch(2) | "
				 "unbatch()",
	    NULL, &n);
	char *s0 = cwt_join_i64(v, n, 0), *s1 = cwt_join_i64(v, n, 1);

	ck_assert_str_eq(s0, "10,11");
	ck_assert_str_eq(s1, "0,1");
	free(s0);
	free(s1);
	cwt_free(v, n);
}
END_TEST

START_TEST(unbatch_splits_bytes)
{
	size_t n;
	cachew_element **v = run("range(1, 4) | map(ops_test_strs) | unbatch()",
	    NULL, &n);

	ck_assert_uint_eq(n, 6);
	ck_spec(v[0], "bytes[]");
	ck_strings(v[0], 0, "0");
	ck_strings(v[1], 0, "0");
	ck_strings(v[2], 0, "1");
	ck_strings(v[5], 0, "2");
	cwt_free(v, n);
}
END_TEST

START_TEST(unbatch_of_batched_bytes_round_trips)
{
	size_t n;
	cachew_element **v = run("range(5) | map(ops_test_str) | batch(2) | "
				 "unbatch()",
	    NULL, &n);

	ck_assert_uint_eq(n, 5);
	ck_strings(v[0], 0, "s0");
	ck_strings(v[3], 0, "s3");
	ck_strings(v[4], 0, "s4");
	cwt_free(v, n);
}
END_TEST

START_TEST(unbatch_of_scalar_fails)
{
	/* Refused when building (tf.data too), at the stage's column. */
	expect_fail("range(3) | unbatch()", CACHEW_ETYPE,
	    "column 12: unbatch: component 0 is a scalar (i64[])");
}
END_TEST

START_TEST(unbatch_components_with_different_rows_fail)
{
	expect_fail("range(1) | map(ops_test_ragged) | unbatch()", CACHEW_ETYPE,
	    "unbatch: component 1 of element 0 has 3 rows but component 0 has "
	    "2");
}
END_TEST

/* ---- filter and flat_map ------------------------------------------------ */

START_TEST(filter_keeps_accepted_elements)
{
	ck_seq("range(10) | filter(ops_test_is_even)", "0,2,4,6,8");
}
END_TEST

START_TEST(filter_rejecting_everything_is_empty)
{
	ck_seq("range(1, 1000, 2) | filter(ops_test_is_even)", "");
}
END_TEST

START_TEST(filter_of_empty_input_is_empty)
{
	ck_seq("range(0) | filter(ops_test_is_even)", "");
}
END_TEST

START_TEST(filter_error_names_function_and_element)
{
	expect_fail("range(10) | filter(ops_test_fail_at_5)", CACHEW_EOP,
	    "filter(ops_test_fail_at_5): bad value 5 (element 5)");
}
END_TEST

START_TEST(filter_counts_elements_per_node)
{
	char counts[256];

	node_counts("range(100) | filter(ops_test_is_even)", counts,
	    sizeof(counts));
	ck_assert_str_eq(counts, "range=100,filter=50");
}
END_TEST

START_TEST(filter_needs_a_filter_function)
{
	expect_fail("range(3) | filter(ops_test_iota)", CACHEW_EINVAL,
	    "is a map function, not a filter function");
}
END_TEST

START_TEST(flat_map_emits_each_sequence_in_order)
{
	ck_seq("range(4) | flat_map(ops_test_dup_n)", "1,2,2,3,3,3");
}
END_TEST

START_TEST(flat_map_long_sequences_span_requests)
{
	size_t n;
	cachew_element **v = run("range(299, 302) | flat_map(ops_test_dup_n)",
	    NULL, &n);

	ck_assert_uint_eq(n, 299 + 300 + 301);
	ck_assert_int_eq(cwt_i64(v[0], 0), 299);
	ck_assert_int_eq(cwt_i64(v[298], 0), 299);
	ck_assert_int_eq(cwt_i64(v[299], 0), 300);
	ck_assert_int_eq(cwt_i64(v[n - 1], 0), 301);
	cwt_free(v, n);
}
END_TEST

START_TEST(flat_map_of_empty_sequences_is_empty)
{
	ck_seq("range(0, 1) | repeat(5) | flat_map(ops_test_dup_n)", "");
}
END_TEST

START_TEST(flat_map_error_names_function_and_element)
{
	expect_fail("range(-1, 3) | flat_map(ops_test_dup_n)", CACHEW_EOP,
	    "flat_map(ops_test_dup_n): negative count -1 (element 0)");
}
END_TEST

START_TEST(flat_map_counts_elements_per_node)
{
	char counts[256];

	node_counts("range(5) | flat_map(ops_test_dup_n)", counts,
	    sizeof(counts));
	ck_assert_str_eq(counts, "range=5,flat_map=10");
}
END_TEST

/* ---- shuffle ------------------------------------------------------------ */

START_TEST(shuffle_same_seed_gives_the_same_order)
{
	char *a = cwt_seq("range(100) | shuffle(10, seed=42)", NULL);
	char *b = cwt_seq("range(100) | shuffle(10, seed=42)", NULL);

	char *id = cwt_seq("range(100)", NULL);

	ck_assert_str_eq(a, b);
	ck_assert_str_ne(a, id);
	free(a);
	free(b);
	free(id);
}
END_TEST

START_TEST(shuffle_different_seeds_give_different_orders)
{
	char *a = cwt_seq("range(100) | shuffle(100, seed=1)", NULL);
	char *b = cwt_seq("range(100) | shuffle(100, seed=2)", NULL);

	ck_assert_str_ne(a, b);
	free(a);
	free(b);
}
END_TEST

START_TEST(shuffle_output_is_a_permutation)
{
	char *want = cwt_seq("range(1000)", NULL);
	char *got = sorted_seq("range(1000) | shuffle(64, seed=7)", NULL);
	char *all = sorted_seq("range(1000) | shuffle(5000, seed=7)", NULL);

	ck_assert_str_eq(got, want);
	ck_assert_str_eq(all, want);
	free(want);
	free(got);
	free(all);
}
END_TEST

START_TEST(shuffle_buffer_one_keeps_the_order)
{
	ck_seq("range(10) | shuffle(1, seed=3)", "0,1,2,3,4,5,6,7,8,9");
}
END_TEST

START_TEST(shuffle_moves_elements_at_most_a_buffer_ahead)
{
	size_t n;
	cachew_element **v = run("range(500) | shuffle(5, seed=9)", NULL, &n);

	ck_assert_uint_eq(n, 500);
	/* Output i is one of the first i + 5 inputs. */
	for (size_t i = 0; i < n; i++)
		ck_assert_int_lt(cwt_i64(v[i], 0), (int64_t)i + 5);
	cwt_free(v, n);
}
END_TEST

START_TEST(shuffle_order_does_not_depend_on_request_sizes)
{
	char *a = cwt_seq("range(200) | shuffle(16, seed=5)", NULL);
	char *b = cwt_seq("range(200) | shuffle(16, seed=5) | batch(7) | "
			  "unbatch()",
	    NULL);
	char *c = cwt_seq("range(200) | shuffle(16, seed=5) | batch(1) | "
			  "unbatch()",
	    NULL);

	ck_assert_str_eq(a, b);
	ck_assert_str_eq(a, c);
	free(a);
	free(b);
	free(c);
}
END_TEST

START_TEST(shuffle_seed_minus_one_follows_the_pipeline_seed)
{
	cachew_options *o1 = cwt_opts(1, 0), *o1b = cwt_opts(1, 0);
	cachew_options *o2 = cwt_opts(2, 0);
	char *a = cwt_seq("range(100) | shuffle(100)", o1);
	char *b = cwt_seq("range(100) | shuffle(100)", o1b);
	char *c = cwt_seq("range(100) | shuffle(100)", o2);

	ck_assert_str_eq(a, b);
	ck_assert_str_ne(a, c);
	free(a);
	free(b);
	free(c);
	cachew_options_destroy(o1);
	cachew_options_destroy(o1b);
	cachew_options_destroy(o2);
}
END_TEST

START_TEST(shuffle_explicit_seed_ignores_the_pipeline_seed)
{
	cachew_options *o1 = cwt_opts(1, 0), *o2 = cwt_opts(2, 0);
	char *a = cwt_seq("range(100) | shuffle(100, seed=8)", o1);
	char *b = cwt_seq("range(100) | shuffle(100, seed=8)", o2);

	ck_assert_str_eq(a, b);
	free(a);
	free(b);
	cachew_options_destroy(o1);
	cachew_options_destroy(o2);
}
END_TEST

/* Splits "a,b,...": the first half and the second half (n elements). */
static void
halves(const char *s, size_t n, char *first, char *second, size_t len)
{
	const char *p = s;
	for (size_t i = 0; i < n / 2; i++)
		p = strchr(p, ',') + 1;
	snprintf(first, len, "%.*s", (int)(p - s - 1), s);
	snprintf(second, len, "%s", p);
}

START_TEST(shuffle_reshuffles_each_repetition)
{
	char *s = cwt_seq("range(20) | shuffle(20, seed=3) | repeat(2)", NULL);
	char a[256], b[256];
	char *one = cwt_seq("range(20) | shuffle(20, seed=3)", NULL);

	halves(s, 40, a, b, sizeof(a));
	ck_assert_str_ne(a, b);
	ck_assert_str_eq(a, one); /* repetition 0 runs at epoch 0 */
	free(s);
	free(one);
}
END_TEST

START_TEST(shuffle_without_reshuffle_repeats_the_order)
{
	char *s = cwt_seq("range(20) | shuffle(20, seed=3, "
			  "reshuffle_each_iteration=false) | repeat(2)",
	    NULL);
	char a[256], b[256];

	halves(s, 40, a, b, sizeof(a));
	ck_assert_str_eq(a, b);
	ck_assert_str_ne(a, "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19");
	free(s);
}
END_TEST

START_TEST(shuffle_repetition_r_equals_epoch_option_r)
{
	cachew_options *e1 = opts_with(4, 1);
	char *s = cwt_seq("range(20) | shuffle(20, seed=3) | repeat(2)", NULL);
	char *second = cwt_seq("range(20) | shuffle(20, seed=3)", e1);
	char a[256], b[256];

	halves(s, 40, a, b, sizeof(a));
	ck_assert_str_eq(b, second);
	free(s);
	free(second);
	cachew_options_destroy(e1);
}
END_TEST

START_TEST(shuffle_epoch_option_reshuffles)
{
	cachew_options *e0 = opts_with(4, 0), *e1 = opts_with(4, 1);
	cachew_options *e1b = opts_with(4, 1);
	char *a = cwt_seq("range(50) | shuffle(50)", e0);
	char *b = cwt_seq("range(50) | shuffle(50)", e1);
	char *c = cwt_seq("range(50) | shuffle(50)", e1b);

	ck_assert_str_ne(a, b);
	ck_assert_str_eq(b, c);
	free(a);
	free(b);
	free(c);
	cachew_options_destroy(e0);
	cachew_options_destroy(e1);
	cachew_options_destroy(e1b);
}
END_TEST

START_TEST(shuffle_nested_repeats_give_distinct_permutations)
{
	char *s = cwt_seq("range(20) | shuffle(20, seed=3) | repeat(2) | "
			  "repeat(2)",
	    NULL);
	char part[4][128];
	const char *p = s;

	for (int i = 0; i < 4; i++) {
		const char *q = p;
		for (int k = 0; k < 19; k++)
			q = strchr(q, ',') + 1;
		q = strchr(q, ',');
		size_t len = q != NULL ? (size_t)(q - p) : strlen(p);
		snprintf(part[i], sizeof(part[i]), "%.*s", (int)len, p);
		p = q != NULL ? q + 1 : p + len;
	}
	for (int i = 0; i < 4; i++)
		for (int j = i + 1; j < 4; j++)
			ck_assert_msg(strcmp(part[i], part[j]) != 0,
			    "repetitions %d and %d have the same order", i, j);
	free(s);
}
END_TEST

START_TEST(shuffle_buffer_zero_is_rejected)
{
	expect_fail("range(3) | shuffle(0)", CACHEW_ERANGE,
	    "shuffle: parameter 'buffer' must be in [1, ");
}
END_TEST

START_TEST(shuffle_reports_its_buffer_in_stats)
{
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_op_stats rows[4];
	size_t n;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "range(100) | shuffle(10, seed=1)"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
	cachew_element_release(e);
	ck_assert_int_eq(cachew_iterator_stats(it, rows, 4, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	ck_assert_str_eq(rows[1].name, "shuffle");
	ck_assert_int_eq(rows[1].buffer_limit, 10);
	ck_assert_int_le(rows[1].buffered, 10);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
}
END_TEST

/* ---- repeat, take, skip, shard ------------------------------------------ */

START_TEST(repeat_repeats_count_times)
{
	ck_seq("range(3) | repeat(2)", "0,1,2,0,1,2");
}
END_TEST

START_TEST(repeat_forever_is_endless)
{
	ck_seq("range(3) | repeat() | take(7)", "0,1,2,0,1,2,0");
	ck_seq("range(3) | repeat(-1) | take(4)", "0,1,2,0");
}
END_TEST

START_TEST(repeat_zero_is_empty)
{
	ck_seq("range(3) | repeat(0)", "");
}
END_TEST

START_TEST(repeat_of_empty_input_stops)
{
	ck_seq("range(0) | repeat()", "");
	ck_seq("range(5) | skip(-1) | repeat()", "");
}
END_TEST

START_TEST(repeat_counts_elements_over_all_repetitions)
{
	char counts[256];

	node_counts("range(4) | repeat(3)", counts, sizeof(counts));
	ck_assert_str_eq(counts, "range=12,repeat=12");
}
END_TEST

START_TEST(take_yields_the_first_n)
{
	ck_seq("range(10) | take(3)", "0,1,2");
}
END_TEST

START_TEST(take_more_than_the_input_yields_all)
{
	ck_seq("range(3) | take(10)", "0,1,2");
}
END_TEST

START_TEST(take_zero_is_empty)
{
	ck_seq("range(3) | take(0)", "");
}
END_TEST

START_TEST(take_minus_one_yields_all)
{
	ck_seq("range(4) | take(-1)", "0,1,2,3");
}
END_TEST

START_TEST(take_stops_pulling_its_input)
{
	char counts[256];

	node_counts("range(1000) | take(5)", counts, sizeof(counts));
	ck_assert_str_eq(counts, "range=5,take=5");
	node_counts("range(3) | repeat() | take(5)", counts, sizeof(counts));
	ck_assert_str_eq(counts, "range=5,repeat=5,take=5");
}
END_TEST

START_TEST(take_below_minus_one_is_rejected)
{
	expect_fail("range(3) | take(-2)", CACHEW_ERANGE,
	    "take: parameter 'n' must be in [-1, ");
}
END_TEST

START_TEST(skip_drops_the_first_n)
{
	ck_seq("range(10) | skip(7)", "7,8,9");
}
END_TEST

START_TEST(skip_more_than_the_input_is_empty)
{
	ck_seq("range(3) | skip(5)", "");
}
END_TEST

START_TEST(skip_minus_one_drops_all)
{
	ck_seq("range(3000) | skip(-1)", "");
}
END_TEST

START_TEST(skip_zero_passes_all)
{
	ck_seq("range(3) | skip(0)", "0,1,2");
}
END_TEST

START_TEST(skip_then_take_selects_a_window)
{
	ck_seq("range(5000) | skip(2998) | take(3)", "2998,2999,3000");
}
END_TEST

START_TEST(shard_keeps_every_num_th_element)
{
	ck_seq("range(10) | shard(num=3, index=1)", "1,4,7");
	ck_seq("range(10) | shard(2, 0)", "0,2,4,6,8");
}
END_TEST

START_TEST(shards_partition_the_input)
{
	ck_seq("concatenate(concatenate(range(23) | shard(3, 0), range(23) | "
	       "shard(3, 1)), range(23) | shard(3, 2))",
	    "0,3,6,9,12,15,18,21,1,4,7,10,13,16,19,22,2,5,8,11,14,17,20");
}
END_TEST

START_TEST(shard_num_larger_than_the_input)
{
	ck_seq("range(3) | shard(num=10, index=2)", "2");
	ck_seq("range(3) | shard(num=10, index=5)", "");
	ck_seq("range(20000) | shard(num=9000, index=8999)", "8999,17999");
}
END_TEST

START_TEST(shard_index_must_be_below_num)
{
	expect_fail("range(10) | shard(num=3, index=3)", CACHEW_ERANGE,
	    "shard: index 3 must be less than num 3");
	expect_fail("range(10) | shard(num=0, index=0)", CACHEW_ERANGE,
	    "shard: parameter 'num' must be in [1, ");
}
END_TEST

/* ---- zip, concatenate, enumerate ---------------------------------------- */

START_TEST(zip_joins_components)
{
	size_t n;
	cachew_element **v = run("zip(range(3), range(10, 13))", NULL, &n);
	char *a = cwt_join_i64(v, n, 0), *b = cwt_join_i64(v, n, 1);

	ck_assert_uint_eq(n, 3);
	ck_spec(v[0], "(i64[], i64[])");
	ck_assert_str_eq(a, "0,1,2");
	ck_assert_str_eq(b, "10,11,12");
	free(a);
	free(b);
	cwt_free(v, n);
}
END_TEST

START_TEST(zip_as_a_stage_takes_the_upstream_first)
{
	char *s = join("range(3) | zip(range(10, 13))", NULL, 1);

	ck_assert_str_eq(s, "10,11,12");
	free(s);
	ck_seq("range(3) | zip(range(10, 13))", "0,1,2");
}
END_TEST

START_TEST(zip_ends_with_the_shortest_input)
{
	ck_seq("zip(range(100), range(2), range(50))", "0,1");
	ck_seq("zip(range(2), range(100))", "0,1");
	ck_seq("zip(range(0), range(100))", "");
}
END_TEST

START_TEST(zip_concatenates_multi_component_elements)
{
	size_t n;
	cachew_element **v = run("zip(range(2), range(1, 3) | map(ops_test_pair), "
				 "range(5) | enumerate(start=7))",
	    NULL, &n);

	ck_assert_uint_eq(n, 2);
	ck_spec(v[1], "(i64[], i64[2], i64[], i64[], i64[])");
	ck_assert_int_eq(cwt_i64(v[1], 0), 1);
	ck_assert_int_eq(cwt_i64(v[1], 2), 2);
	ck_assert_int_eq(cwt_i64(v[1], 3), 8);
	ck_assert_int_eq(cwt_i64(v[1], 4), 1);
	cwt_free(v, n);
}
END_TEST

START_TEST(zip_of_one_input_is_rejected)
{
	expect_fail("zip(range(3))", CACHEW_EINVAL,
	    "zip: needs at least 2 input pipelines, got 1");
}
END_TEST

START_TEST(zip_over_64_components_fails)
{
	expect_fail("zip(range(2) | map(ops_test_wide, n=40), range(2) | "
		    "map(ops_test_wide, n=40))",
	    CACHEW_ETYPE,
	    "zip: element 0 of the 2 inputs has 80 components in all, more than "
	    "the maximum of 64");
}
END_TEST

START_TEST(zip_moves_buffer_backed_components)
{
	size_t n;
	cachew_element **v = run("zip(range(6) | batch(3), range(10, 16) | "
				 "batch(3)) | unbatch()",
	    NULL, &n);
	char *a = cwt_join_i64(v, n, 0), *b = cwt_join_i64(v, n, 1);

	ck_assert_str_eq(a, "0,1,2,3,4,5");
	ck_assert_str_eq(b, "10,11,12,13,14,15");
	free(a);
	free(b);
	cwt_free(v, n);
}
END_TEST

START_TEST(concatenate_yields_the_first_then_the_second)
{
	ck_seq("concatenate(range(3), range(10, 12))", "0,1,2,10,11");
	ck_seq("range(2) | concatenate(range(5, 6))", "0,1,5");
}
END_TEST

START_TEST(concatenate_with_empty_inputs)
{
	ck_seq("concatenate(range(0), range(2))", "0,1");
	ck_seq("concatenate(range(2), range(0))", "0,1");
	ck_seq("concatenate(range(0), range(0))", "");
}
END_TEST

START_TEST(concatenate_allows_different_shapes)
{
	ck_seq("concatenate(range(1, 3) | map(ops_test_iota), range(3, 4) | "
	       "map(ops_test_iota))",
	    "[0],[0 1],[0 1 2]");
}
END_TEST

START_TEST(concatenate_dtype_mismatch_fails_naming_both_specs)
{
	expect_fail("concatenate(range(3), range(1, 4) | "
		    "map(ops_test_iota_as, dtype=f32))",
	    CACHEW_ETYPE,
	    "concatenate: element 0 of the second input is f32[1], expected "
	    "i64[]");
}
END_TEST

START_TEST(concatenate_component_count_mismatch_fails)
{
	expect_fail("concatenate(range(2), range(3) | skip(2) | "
		    "map(ops_test_pair))",
	    CACHEW_ETYPE,
	    "concatenate: element 0 of the second input is (i64[2], i64[]), "
	    "expected i64[]");
}
END_TEST

START_TEST(concatenate_needs_two_inputs)
{
	expect_fail("concatenate(range(3))", CACHEW_EINVAL,
	    "concatenate: needs 2 input pipelines, got 1");
}
END_TEST

START_TEST(enumerate_prepends_a_counter)
{
	size_t n;
	cachew_element **v = run("range(10, 13) | enumerate()", NULL, &n);
	char *a = cwt_join_i64(v, n, 0), *b = cwt_join_i64(v, n, 1);

	ck_spec(v[0], "(i64[], i64[])");
	ck_assert_str_eq(a, "0,1,2");
	ck_assert_str_eq(b, "10,11,12");
	free(a);
	free(b);
	cwt_free(v, n);
}
END_TEST

START_TEST(enumerate_starts_at_start)
{
	ck_seq("range(3) | enumerate(start=5)", "5,6,7");
	ck_seq("range(3) | enumerate(-1)", "-1,0,1");
}
END_TEST

START_TEST(enumerate_keeps_multi_component_elements)
{
	size_t n;
	cachew_element **v = run("range(2, 3) | map(ops_test_pair) | "
				 "enumerate()",
	    NULL, &n);

	ck_spec(v[0], "(i64[], i64[2], i64[])");
	cwt_free(v, n);
}
END_TEST

START_TEST(enumerate_of_64_components_fails)
{
	expect_fail("range(1) | map(ops_test_wide, n=64) | enumerate()",
	    CACHEW_ETYPE,
	    "enumerate: element 0 already has 64 components, the maximum");
}
END_TEST

/* ---- autocache ---------------------------------------------------------- */

START_TEST(autocache_passes_elements_through)
{
	ck_seq("range(5) | autocache()", "0,1,2,3,4");
}
END_TEST

START_TEST(autocache_keeps_the_input_fingerprint)
{
	cachew_dataset *a, *b;
	cachew_fingerprint fa, fb;

	ck_assert_int_eq(cachew_dataset_parse(&a, "range(5) | batch(2)"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&b,
			     "range(5) | batch(2) | autocache()"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_fingerprint(a, &fa), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_fingerprint(b, &fb), CACHEW_OK);
	ck_assert_uint_eq(fa.hi, fb.hi);
	ck_assert_uint_eq(fa.lo, fb.lo);
	cachew_dataset_release(a);
	cachew_dataset_release(b);
}
END_TEST

/* ---- the C builders and resource release -------------------------------- */

START_TEST(builders_build_every_operator)
{
	cachew_dataset *ds[20];
	cachew_dataset *zin[2];
	cachew_element **v;
	size_t n, k = 0;
	char err[512];
	char *s;

	ck_assert_int_eq(cachew_dataset_range(&ds[k++], 0, 40, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_shuffle(&ds[k], ds[k - 1], 1, 5, 1),
	    CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_filter(&ds[k], ds[k - 1],
			     "ops_test_is_even", NULL),
	    CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_shard(&ds[k], ds[k - 1], 2, 0),
	    CACHEW_OK);
	k++; /* 0, 4, 8, ... 36 */
	ck_assert_int_eq(cachew_dataset_skip(&ds[k], ds[k - 1], 1), CACHEW_OK);
	k++; /* 4, 8, ... 36 */
	ck_assert_int_eq(cachew_dataset_take(&ds[k], ds[k - 1], 3), CACHEW_OK);
	k++; /* 4, 8, 12 */
	ck_assert_int_eq(cachew_dataset_repeat(&ds[k], ds[k - 1], 2), CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_padded_batch(&ds[k], ds[k - 1], 4, 0, 0),
	    CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_unbatch(&ds[k], ds[k - 1]), CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_batch(&ds[k], ds[k - 1], 2, 1), CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_unbatch(&ds[k], ds[k - 1]), CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_enumerate(&ds[k], ds[k - 1], 100),
	    CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_autocache(&ds[k], ds[k - 1]), CACHEW_OK);
	k++;
	ck_assert_int_eq(cachew_dataset_range(&ds[k++], 0, 3, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_flat_map(&ds[k], ds[k - 1],
			     "ops_test_dup_n", NULL),
	    CACHEW_OK);
	k++; /* 1, 2, 2 */
	ck_assert_int_eq(cachew_dataset_concatenate(&ds[k], ds[k - 1], ds[k - 1]),
	    CACHEW_OK);
	k++; /* 1, 2, 2, 1, 2, 2 */
	zin[0] = ds[k - 4];
	zin[1] = ds[k - 1];
	ck_assert_int_eq(cachew_dataset_zip(&ds[k], zin, 2), CACHEW_OK);
	k++;
	ck_assert_int_eq(cwt_run_ds(ds[k - 1], NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "100,101,102,103,104,105");
	free(s);
	s = cwt_join_i64(v, n, 1);
	ck_assert_str_eq(s, "4,8,12,4,8,12");
	free(s);
	s = cwt_join_i64(v, n, 2);
	ck_assert_str_eq(s, "1,2,2,1,2,2");
	free(s);
	cwt_free(v, n);
	for (size_t i = 0; i < k; i++)
		cachew_dataset_release(ds[i]);
}
END_TEST

START_TEST(destroy_mid_stream_frees_everything)
{
	static const char *const pipelines[] = {
	    "range(1000) | shuffle(100, seed=1) | batch(7) | unbatch()",
	    "range(1, 1000) | map(ops_test_iota) | take(50) | "
	    "padded_batch(4) | unbatch()",
	    "range(1000) | flat_map(ops_test_dup_n)",
	    "zip(range(1000) | map(ops_test_str), range(1000) | batch(3)) | "
	    "enumerate()",
	    "concatenate(range(10), range(100)) | repeat() | shard(3, 1) | "
	    "skip(5) | autocache()",
	    "range(100) | filter(ops_test_is_even) | map(ops_test_strs) | "
	    "unbatch()",
	};

	for (size_t i = 0; i < sizeof(pipelines) / sizeof(pipelines[0]); i++) {
		cachew_dataset *ds;
		cachew_iterator *it;
		cachew_element *e;

		ck_assert_msg(cachew_dataset_parse(&ds, pipelines[i]) == CACHEW_OK,
		    "%s: %s", pipelines[i], cachew_errmsg());
		ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
		for (int k = 0; k < 40; k++) {
			ck_assert_msg(cachew_iterator_next(it, &e) == CACHEW_OK,
			    "%s: %s", pipelines[i], cachew_iterator_errmsg(it));
			cachew_element_release(e);
		}
		cachew_iterator_destroy(it);
		cachew_dataset_release(ds);
	}
}
END_TEST

START_TEST(destroy_mid_stream_stops_prefetch_threads)
{
	static const char *const pipelines[] = {
	    "range(100000) | shuffle(100, seed=1) | prefetch(8) | batch(4) | "
	    "unbatch() | take(50)",
	    "range(100000) | flat_map(ops_test_dup_n) | prefetch(16) | "
	    "shard(3, 2)",
	    "zip(range(100000) | prefetch(4), range(100000) | batch(2) | "
	    "prefetch(4)) | enumerate() | prefetch(2)",
	};

	for (size_t i = 0; i < sizeof(pipelines) / sizeof(pipelines[0]); i++) {
		cachew_dataset *ds;
		cachew_iterator *it;
		cachew_element *e;

		ck_assert_msg(cachew_dataset_parse(&ds, pipelines[i]) == CACHEW_OK,
		    "%s: %s", pipelines[i], cachew_errmsg());
		ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
		for (int k = 0; k < 20; k++) {
			ck_assert_msg(cachew_iterator_next(it, &e) == CACHEW_OK,
			    "%s: %s", pipelines[i], cachew_iterator_errmsg(it));
			cachew_element_release(e);
		}
		cachew_iterator_destroy(it);
		cachew_dataset_release(ds);
	}
}
END_TEST

START_TEST(destroy_stops_a_filter_that_rejects_an_endless_input)
{
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;

	/* After 0, 1, 2 the prefetch thread sits in filter, which never
	 * finds an even number: only the cancellation can stop it.
	 * prefetch(2): with chunks of 2 (the sizer's choice, timing-
	 * dependent) element 2 is the first of a chunk the thread never
	 * fills; the consumer must get it all the same (it hung here when
	 * a prefetch published only full chunks). */
	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "concatenate(range(3), range(1, 9000000000000000000, "
			     "2) | filter(ops_test_is_even)) | prefetch(2)"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	for (int64_t k = 0; k < 3; k++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		ck_assert_int_eq(cwt_i64(e, 0), k);
		cachew_element_release(e);
	}
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(errors_are_sticky)
{
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;

	/* Rows that differ are only found when iterating. */
	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "zip(range(3) | batch(2), range(3) | batch(3)) | "
			     "unbatch() | repeat()"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	rv = cachew_iterator_next(it, &e);
	ck_assert_int_eq(rv, CACHEW_ETYPE);
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_ETYPE);
	ck_assert_ptr_nonnull(strstr(cachew_iterator_errmsg(it), "unbatch: "));
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
}
END_TEST

/* ---- suite -------------------------------------------------------------- */

static void
add(Suite *s, const char *name, const TTest *test)
{
	TCase *tc = tcase_create(name);
	tcase_add_checked_fixture(tc, setup, NULL);
	tcase_add_test(tc, test);
	suite_add_tcase(s, tc);
}

#define ADD(s, t) add(s, #t, t)

Suite *
cwt_ops_suite(void)
{
	Suite *s = suite_create("ops");

	ADD(s, batch_stacks_consecutive_elements);
	ADD(s, batch_drop_remainder_drops_the_short_last_batch);
	ADD(s, batch_larger_than_input_yields_one_batch);
	ADD(s, batch_of_empty_input_is_empty);
	ADD(s, batch_huge_n_reserves_only_what_arrives);
	ADD(s, batch_stacks_rank_1_components_into_rank_2);
	ADD(s, batch_shape_mismatch_fails_naming_element_and_component);
	ADD(s, batch_stacks_bytes_scalars);
	ADD(s, batch_stacks_bytes_vectors);
	ADD(s, batch_n_zero_is_rejected);
	ADD(s, batch_over_max_element_bytes_fails);

	ADD(s, padded_batch_pads_to_the_batch_maximum);
	ADD(s, padded_batch_pads_with_zero_by_default);
	ADD(s, padded_batch_pads_each_batch_to_its_own_maximum);
	ADD(s, padded_batch_pads_two_dimensions);
	ADD(s, padded_batch_shape_pads_to_a_fixed_size);
	ADD(s, padded_batch_shape_minus_one_uses_the_batch_maximum);
	ADD(s, padded_batch_shape_per_component);
	ADD(s, padded_batch_element_larger_than_shape_fails);
	ADD(s, padded_batch_shape_rank_mismatch_fails);
	ADD(s, padded_batch_rank_mismatch_between_elements_fails);
	ADD(s, padded_batch_bad_shape_parameter_is_rejected_when_built);
	ADD(s, padded_batch_over_max_element_bytes_fails);
	ADD(s, padded_batch_drop_remainder_drops_the_short_last_batch);
	ADD(s, padded_batch_of_scalars_stacks);
	ADD(s, padded_batch_converts_pad_value_to_each_dtype);
	ADD(s, padded_batch_pad_value_that_does_not_fit_fails);
	ADD(s, padded_batch_pads_bytes_with_empty_strings);
	ADD(s, padded_batch_bytes_scalars_stack);

	ADD(s, unbatch_inverts_batch);
	ADD(s, unbatch_skips_empty_batches);
	ADD(s, unbatch_keeps_inner_dimensions);
	ADD(s, unbatch_rows_are_views_of_the_batch);
	ADD(s, unbatch_splits_every_component);
	ADD(s, unbatch_splits_bytes);
	ADD(s, unbatch_of_batched_bytes_round_trips);
	ADD(s, unbatch_of_scalar_fails);
	ADD(s, unbatch_components_with_different_rows_fail);

	ADD(s, filter_keeps_accepted_elements);
	ADD(s, filter_rejecting_everything_is_empty);
	ADD(s, filter_of_empty_input_is_empty);
	ADD(s, filter_error_names_function_and_element);
	ADD(s, filter_counts_elements_per_node);
	ADD(s, filter_needs_a_filter_function);
	ADD(s, flat_map_emits_each_sequence_in_order);
	ADD(s, flat_map_long_sequences_span_requests);
	ADD(s, flat_map_of_empty_sequences_is_empty);
	ADD(s, flat_map_error_names_function_and_element);
	ADD(s, flat_map_counts_elements_per_node);

	ADD(s, shuffle_same_seed_gives_the_same_order);
	ADD(s, shuffle_different_seeds_give_different_orders);
	ADD(s, shuffle_output_is_a_permutation);
	ADD(s, shuffle_buffer_one_keeps_the_order);
	ADD(s, shuffle_moves_elements_at_most_a_buffer_ahead);
	ADD(s, shuffle_order_does_not_depend_on_request_sizes);
	ADD(s, shuffle_seed_minus_one_follows_the_pipeline_seed);
	ADD(s, shuffle_explicit_seed_ignores_the_pipeline_seed);
	ADD(s, shuffle_reshuffles_each_repetition);
	ADD(s, shuffle_without_reshuffle_repeats_the_order);
	ADD(s, shuffle_repetition_r_equals_epoch_option_r);
	ADD(s, shuffle_epoch_option_reshuffles);
	ADD(s, shuffle_nested_repeats_give_distinct_permutations);
	ADD(s, shuffle_buffer_zero_is_rejected);
	ADD(s, shuffle_reports_its_buffer_in_stats);

	ADD(s, repeat_repeats_count_times);
	ADD(s, repeat_forever_is_endless);
	ADD(s, repeat_zero_is_empty);
	ADD(s, repeat_of_empty_input_stops);
	ADD(s, repeat_counts_elements_over_all_repetitions);
	ADD(s, take_yields_the_first_n);
	ADD(s, take_more_than_the_input_yields_all);
	ADD(s, take_zero_is_empty);
	ADD(s, take_minus_one_yields_all);
	ADD(s, take_stops_pulling_its_input);
	ADD(s, take_below_minus_one_is_rejected);
	ADD(s, skip_drops_the_first_n);
	ADD(s, skip_more_than_the_input_is_empty);
	ADD(s, skip_minus_one_drops_all);
	ADD(s, skip_zero_passes_all);
	ADD(s, skip_then_take_selects_a_window);
	ADD(s, shard_keeps_every_num_th_element);
	ADD(s, shards_partition_the_input);
	ADD(s, shard_num_larger_than_the_input);
	ADD(s, shard_index_must_be_below_num);

	ADD(s, zip_joins_components);
	ADD(s, zip_as_a_stage_takes_the_upstream_first);
	ADD(s, zip_ends_with_the_shortest_input);
	ADD(s, zip_concatenates_multi_component_elements);
	ADD(s, zip_of_one_input_is_rejected);
	ADD(s, zip_over_64_components_fails);
	ADD(s, zip_moves_buffer_backed_components);
	ADD(s, concatenate_yields_the_first_then_the_second);
	ADD(s, concatenate_with_empty_inputs);
	ADD(s, concatenate_allows_different_shapes);
	ADD(s, concatenate_dtype_mismatch_fails_naming_both_specs);
	ADD(s, concatenate_component_count_mismatch_fails);
	ADD(s, concatenate_needs_two_inputs);
	ADD(s, enumerate_prepends_a_counter);
	ADD(s, enumerate_starts_at_start);
	ADD(s, enumerate_keeps_multi_component_elements);
	ADD(s, enumerate_of_64_components_fails);

	ADD(s, autocache_passes_elements_through);
	ADD(s, autocache_keeps_the_input_fingerprint);

	ADD(s, builders_build_every_operator);
	ADD(s, destroy_mid_stream_frees_everything);
	ADD(s, destroy_mid_stream_stops_prefetch_threads);
	ADD(s, destroy_stops_a_filter_that_rejects_an_endless_input);
	ADD(s, errors_are_sticky);
	return s;
}
