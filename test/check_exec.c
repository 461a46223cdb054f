/*
 * check_exec.c - the threaded executor: parallel map, prefetch, interleave,
 * autotuning budgets, errors and cancellation. Pipelines are built with the
 * C builders; results are compared exactly (order or multiset), never by
 * timing except for generous liveness bounds.
 */
#include "cwt.h"

#include "../src/exec/exec_tune.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- test functions ------------------------------------------------------- */

static int64_t
scalar_i64(const cachew_element *e)
{
	const cachew_tensor *t = cachew_element_component(e, 0);
	return *(const int64_t *)cachew_tensor_data(t);
}

/* A new element holding the scalar v. */
static cachew_err
scalar_element(int64_t v, cachew_element **out)
{
	cachew_tensor *t;
	cachew_element *e;

	if (cachew_element_create(&e, 1) != CACHEW_OK)
		return CACHEW_ENOMEM;
	if (cachew_tensor_create_scalar(&t, CACHEW_I64, &v) != CACHEW_OK) {
		cachew_element_release(e);
		return CACHEW_ENOMEM;
	}
	cachew_element_set(e, 0, t);
	cachew_tensor_release(t);
	*out = e;
	return CACHEW_OK;
}

/* Passes elements through, failing on the value 1234. */
static cachew_err
fail_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t v = scalar_i64(in);
	if (v == 1234) {
		cachew_element_release(in);
		return cachew_op_ctx_fail(ctx, "bad value %lld", (long long)v);
	}
	*out = in;
	return CACHEW_OK;
}

/* x -> a fixed permutation with repeats, for uneven sequence lengths. */
static cachew_err
perm_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	static const int64_t table[8] = {3, 1, 4, 0, 2, 5, 1, 3};
	int64_t v = table[scalar_i64(in) & 7];
	(void)ctx;
	cachew_element_release(in);
	return scalar_element(v, out);
}

/* Flat map: x -> x*100, x*100+1, ..., x*100+x-1. With fail_at >= 0 the
 * sequence fails instead of yielding the value fail_at. */
typedef struct count_seq {
	int64_t x, i;
	int64_t fail_at;
} count_seq;

static cachew_err
count_open_common(const cachew_element *in, void **seq, int64_t fail_at)
{
	count_seq *s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->x = scalar_i64(in);
	s->i = 0;
	s->fail_at = fail_at;
	*seq = s;
	return CACHEW_OK;
}

static cachew_err
count_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	(void)ctx;
	return count_open_common(in, seq, -1);
}

static cachew_err
count_fail_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	(void)ctx;
	return count_open_common(in, seq, 401);
}

static cachew_err
count_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	count_seq *s = seq;
	int64_t v;

	if (s->i >= s->x)
		return CACHEW_EOF;
	v = s->x * 100 + s->i++;
	if (v == s->fail_at)
		return cachew_op_ctx_fail(ctx, "bad element %lld", (long long)v);
	return scalar_element(v, out);
}

static void
count_close(void *seq)
{
	free(seq);
}

/* Flat map: two elements per input, each a draw of the sequence's random
 * stream (>> 1: a non-negative i64). */
static cachew_err
rand_seq_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	int *left = malloc(sizeof(*left));

	(void)ctx;
	(void)in;
	if (left == NULL)
		return CACHEW_ENOMEM;
	*left = 2;
	*seq = left;
	return CACHEW_OK;
}

static cachew_err
rand_seq_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	int *left = seq;

	if (*left == 0)
		return CACHEW_EOF;
	(*left)--;
	return scalar_element((int64_t)(cachew_op_ctx_random(ctx) >> 1), out);
}

/* Filter: keeps an element when its draw is odd. */
static cachew_err
rand_keep(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	(void)in;
	*keep = (int)(cachew_op_ctx_random(ctx) & 1);
	return CACHEW_OK;
}

/* Map: passes elements through, but the element GATE_AT waits until the
 * test opens the gate. It gives up after GATE_GIVE_UP_S (recording that
 * it did) so that a prefetch holding elements fails the test rather than
 * hanging it. */
#define GATE_AT 3
#define GATE_GIVE_UP_S 10

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cv;
	bool open, gave_up;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};

static cachew_err
gate_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	struct timespec deadline;

	(void)ctx;
	if (scalar_i64(in) == GATE_AT) {
		clock_gettime(CLOCK_REALTIME, &deadline);
		deadline.tv_sec += GATE_GIVE_UP_S;
		pthread_mutex_lock(&gate.lock);
		while (!gate.open && !gate.gave_up)
			gate.gave_up = pthread_cond_timedwait(&gate.cv,
					   &gate.lock, &deadline) != 0 &&
			    !gate.open;
		pthread_mutex_unlock(&gate.lock);
	}
	*out = in;
	return CACHEW_OK;
}

static void
gate_set(bool open)
{
	pthread_mutex_lock(&gate.lock);
	gate.open = open;
	gate.gave_up = false;
	pthread_cond_broadcast(&gate.cv);
	pthread_mutex_unlock(&gate.lock);
}

static bool
gate_gave_up(void)
{
	pthread_mutex_lock(&gate.lock);
	bool r = gate.gave_up;
	pthread_mutex_unlock(&gate.lock);
	return r;
}

/* Opens the gate after 50 ms: the consumer is then waiting on an empty
 * queue, past its timed wait. */
static void *
gate_open_later(void *arg)
{
	struct timespec ts = {0, 50 * 1000 * 1000};

	(void)arg;
	nanosleep(&ts, NULL);
	pthread_mutex_lock(&gate.lock);
	gate.open = true;
	pthread_cond_broadcast(&gate.cv);
	pthread_mutex_unlock(&gate.lock);
	return NULL;
}

static const cachew_op_def test_fns[] = {
    {.version = CACHEW_OP_DEF_VERSION, .name = "exec_test_fail",
	.kind = CACHEW_OP_MAP, .map = fail_map},
    {.version = CACHEW_OP_DEF_VERSION, .name = "exec_test_gate",
	.kind = CACHEW_OP_MAP, .map = gate_map},
    {.version = CACHEW_OP_DEF_VERSION, .name = "exec_test_perm",
	.kind = CACHEW_OP_MAP, .map = perm_map},
    {.version = CACHEW_OP_DEF_VERSION, .name = "exec_test_count",
	.kind = CACHEW_OP_FLAT_MAP,
	.flat_open = count_open, .flat_next = count_next,
	.flat_close = count_close},
    {.version = CACHEW_OP_DEF_VERSION, .name = "exec_test_count_fail",
	.kind = CACHEW_OP_FLAT_MAP,
	.flat_open = count_fail_open, .flat_next = count_next,
	.flat_close = count_close},
    {.version = CACHEW_OP_DEF_VERSION, .name = "exec_test_rand_seq",
	.kind = CACHEW_OP_FLAT_MAP, .flags = CACHEW_OP_RANDOM,
	.flat_open = rand_seq_open, .flat_next = rand_seq_next,
	.flat_close = count_close},
    {.version = CACHEW_OP_DEF_VERSION, .name = "exec_test_rand_keep",
	.kind = CACHEW_OP_FILTER, .flags = CACHEW_OP_RANDOM,
	.filter = rand_keep},
};

static void
register_fns(void)
{
	for (size_t i = 0; i < sizeof(test_fns) / sizeof(test_fns[0]); i++) {
		cachew_err rv = cachew_op_register(&test_fns[i]);
		ck_assert(rv == CACHEW_OK || rv == CACHEW_EEXIST);
	}
}

/* ---- pipeline builders ------------------------------------------------------- */

/* Applies op to in (consumed) with p (consumed). */
static cachew_dataset *
stage(cachew_dataset *in, const char *op, cachew_params *p)
{
	cachew_dataset *out = NULL;
	cachew_err rv = cachew_dataset_apply(&out, op, &in, 1, p);
	ck_assert_msg(rv == CACHEW_OK, "%s: %s", op, cachew_errmsg());
	cachew_dataset_release(in);
	cachew_params_destroy(p);
	return out;
}

static cachew_dataset *
range_ds(int64_t n)
{
	cachew_dataset *ds;
	ck_assert_int_eq(cachew_dataset_range(&ds, 0, n, 1), CACHEW_OK);
	return ds;
}

static cachew_params *
params(void)
{
	cachew_params *p;
	ck_assert_int_eq(cachew_params_create(&p), CACHEW_OK);
	return p;
}

/* map(fn, parallel, deterministic [, key=value]) */
static cachew_dataset *
map_ds(cachew_dataset *in, const char *fn, int64_t parallel, int det,
    const char *key, int64_t value)
{
	cachew_params *p = params();
	cachew_params_set_str(p, "fn", fn);
	cachew_params_set_int(p, "parallel", parallel);
	cachew_params_set_bool(p, "deterministic", det);
	if (key != NULL)
		cachew_params_set_int(p, key, value);
	return stage(in, "map", p);
}

static cachew_dataset *
prefetch_ds(cachew_dataset *in, int64_t n)
{
	cachew_params *p = params();
	cachew_params_set_int(p, "n", n);
	return stage(in, "prefetch", p);
}

static cachew_dataset *
interleave_ds(cachew_dataset *in, const char *fn, int64_t cycle,
    int64_t block, int64_t parallel, int det)
{
	cachew_params *p = params();
	cachew_params_set_str(p, "fn", fn);
	cachew_params_set_int(p, "cycle", cycle);
	cachew_params_set_int(p, "block", block);
	cachew_params_set_int(p, "parallel", parallel);
	cachew_params_set_bool(p, "deterministic", det);
	return stage(in, "interleave", p);
}

/* range(8) | map(exec_test_perm): sequence lengths 3,1,4,0,2,5,1,3. */
static cachew_dataset *
uneven_ds(void)
{
	register_fns();
	return map_ds(range_ds(8), "exec_test_perm", 1, 1, NULL, 0);
}

/* Component 0 of every element as i64 (i64 scalars checked once: Check
 * assertions cost a write() each, too many for 10^5 elements). */
static int64_t *
values_of(cachew_element **v, size_t n)
{
	int64_t *x = malloc((n + 1) * sizeof(*x));
	size_t bad = 0;

	ck_assert_ptr_nonnull(x);
	for (size_t i = 0; i < n; i++) {
		const cachew_tensor *t = cachew_element_component(v[i], 0);
		bad += cachew_tensor_dtype(t) != CACHEW_I64 ||
		    cachew_tensor_rank(t) != 0;
		x[i] = *(const int64_t *)cachew_tensor_data(t);
	}
	ck_assert_uint_eq(bad, 0);
	return x;
}

/* Runs ds (consumed) and returns component 0 of each element. */
static int64_t *
run_values(cachew_dataset *ds, const cachew_options *opts, size_t *n)
{
	cachew_element **v;
	char err[512];
	cachew_err rv = cwt_run_ds(ds, opts, &v, n, err, sizeof(err));
	int64_t *x;

	ck_assert_msg(rv == CACHEW_OK, "run failed: %s", err);
	x = values_of(v, *n);
	cwt_free(v, *n);
	cachew_dataset_release(ds);
	return x;
}

/* 0 if x[i] == i + add for i < n, else the first index that differs + 1. */
static size_t
check_iota(const int64_t *x, size_t n, int64_t add)
{
	for (size_t i = 0; i < n; i++)
		if (x[i] != (int64_t)i + add)
			return i + 1;
	return 0;
}

/* Runs ds (consumed) and returns the joined component 0. */
static char *
run_join(cachew_dataset *ds, const cachew_options *opts)
{
	cachew_element **v;
	size_t n;
	char err[512];
	cachew_err rv = cwt_run_ds(ds, opts, &v, &n, err, sizeof(err));
	char *s;

	ck_assert_msg(rv == CACHEW_OK, "run failed: %s", err);
	s = cwt_join_i64(v, n, 0);
	cwt_free(v, n);
	cachew_dataset_release(ds);
	return s;
}

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

/* Component 0 of every element, sorted. */
static int64_t *
run_sorted(cachew_dataset *ds, const cachew_options *opts, size_t *n)
{
	int64_t *x = run_values(ds, opts, n);

	qsort(x, *n, sizeof(*x), cmp_i64);
	return x;
}

static uint64_t
now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* The stats row of the first node named `name`. */
static cachew_op_stats
stats_of(cachew_iterator *it, const char *name)
{
	cachew_op_stats rows[32];
	size_t n = 0;
	ck_assert_int_eq(cachew_iterator_stats(it, rows, 32, &n), CACHEW_OK);
	for (size_t i = 0; i < n && i < 32; i++)
		if (strcmp(rows[i].name, name) == 0)
			return rows[i];
	ck_abort_msg("no stats row for %s", name);
	return rows[0];
}

/* ---- parallel map ------------------------------------------------------------- */

START_TEST(test_map_parallel_same_order_as_inline)
{
	static const int64_t par[] = {2, 4, CACHEW_AUTO};
	cachew_options *o = cwt_opts(1, 0);
	size_t n, m;
	int64_t *want, *got;

	/* The inline result: each value plus one, in order. */
	want = run_values(
	    map_ds(range_ds(100000), "add", 1, 1, NULL, 0), o, &n);
	ck_assert_uint_eq(n, 100000);
	ck_assert_uint_eq(check_iota(want, n, 1), 0);
	for (size_t k = 0; k < sizeof(par) / sizeof(par[0]); k++) {
		got = run_values(
		    map_ds(range_ds(100000), "add", par[k], 1, NULL, 0), o, &m);
		ck_assert_uint_eq(m, n);
		ck_assert_msg(memcmp(got, want, n * sizeof(*got)) == 0,
		    "parallel=%lld differs", (long long)par[k]);
		free(got);
	}
	free(want);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_map_nondeterministic_same_multiset)
{
	cachew_options *o = cwt_opts(1, 0);
	cachew_options *nd = cwt_opts(1, 0);
	size_t n1, n2;
	int64_t *a, *b;

	/* By the node parameter ... */
	a = run_sorted(map_ds(range_ds(50000), "add", 4, 0, NULL, 0), o, &n1);
	ck_assert_uint_eq(n1, 50000);
	ck_assert_uint_eq(check_iota(a, n1, 1), 0);
	/* ... and by the pipeline option. */
	ck_assert_int_eq(cachew_options_set_bool(nd, "deterministic", 0),
	    CACHEW_OK);
	b = run_sorted(
	    map_ds(range_ds(50000), "add", CACHEW_AUTO, 1, NULL, 0), nd, &n2);
	ck_assert_uint_eq(n2, n1);
	ck_assert(memcmp(a, b, n1 * sizeof(*a)) == 0);
	free(a);
	free(b);
	cachew_options_destroy(o);
	cachew_options_destroy(nd);
}
END_TEST

/* Component 1 (uniform's draw) of every element at a given parallelism. */
static double *
uniform_draws(int64_t parallel, int64_t seed, size_t *n)
{
	cachew_options *o = cwt_opts(seed, 0);
	cachew_params *p = params();
	cachew_dataset *ds;
	cachew_element **v;
	char err[256];
	double *x;

	cachew_params_set_str(p, "fn", "uniform");
	cachew_params_set_int(p, "parallel", parallel);
	ds = stage(range_ds(20000), "map", p);
	ck_assert_int_eq(cwt_run_ds(ds, o, &v, n, err, sizeof(err)), CACHEW_OK);
	x = malloc(*n * sizeof(*x));
	int64_t *idx = values_of(v, *n);
	ck_assert_uint_eq(check_iota(idx, *n, 0), 0);
	free(idx);
	for (size_t i = 0; i < *n; i++)
		x[i] = *(const double *)cachew_tensor_data(
		    cachew_element_component(v[i], 1));
	cwt_free(v, *n);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	return x;
}

START_TEST(test_map_random_same_at_any_parallelism)
{
	size_t n1, n2, n4, m;
	double *a = uniform_draws(1, 7, &n1);
	double *b = uniform_draws(2, 7, &n2);
	double *c = uniform_draws(4, 7, &n4);
	double *d = uniform_draws(2, 8, &m);
	size_t same = 0;

	ck_assert_uint_eq(n1, 20000);
	ck_assert_uint_eq(n2, n1);
	ck_assert_uint_eq(n4, n1);
	ck_assert(memcmp(a, b, n1 * sizeof(*a)) == 0);
	ck_assert(memcmp(a, c, n1 * sizeof(*a)) == 0);
	for (size_t i = 0; i < n1; i++)
		same += a[i] == d[i];
	ck_assert_uint_lt(same, 10);
	free(a);
	free(b);
	free(c);
	free(d);
}
END_TEST

/* Random functions draw from the epoch, as a reshuffling shuffle orders
 * (issue 20, item 2): a new epoch draws anew, the same seed and epoch draw
 * the same, and repetition r of a repeat draws what epoch r draws; a
 * parallel map or interleave draws what the inline one draws. */
START_TEST(test_random_functions_draw_anew_each_epoch)
{
	static const char *const pipelines[] = {
	    "range(500) | map(uniform)",
	    "range(500) | map(uniform, parallel=3)",
	    "range(100) | interleave(exec_test_rand_seq, cycle=3)",
	    "range(100) | interleave(exec_test_rand_seq, cycle=3, parallel=2)",
	    "range(100) | flat_map(exec_test_rand_seq)",
	    "range(300) | filter(exec_test_rand_keep)",
	};
	enum { NP = sizeof(pipelines) / sizeof(pipelines[0]) };
	cachew_options *o0 = cwt_opts_at(7, 0, "local");
	cachew_options *o1 = cwt_opts_at(7, 1, "local");
	char *e1[NP];

	register_fns();
	for (size_t i = 0; i < NP; i++) {
		const char *p = pipelines[i];
		char rep[200];
		char *e0 = cwt_hash_seq(p, o0, 0);
		char *again = cwt_hash_seq(p, o1, 0);
		char *twice, *both;

		e1[i] = cwt_hash_seq(p, o1, 0);
		snprintf(rep, sizeof(rep), "%s | repeat(2)", p);
		twice = cwt_hash_seq(rep, o0, 0);
		both = malloc(strlen(e0) + strlen(e1[i]) + 2);
		sprintf(both, "%s,%s", e0, e1[i]);
		ck_assert_msg(strcmp(e0, e1[i]) != 0,
		    "%s: epochs 0 and 1 drew the same", p);
		ck_assert_msg(strcmp(e1[i], again) == 0,
		    "%s: epoch 1 drew differently twice", p);
		ck_assert_msg(strcmp(twice, both) == 0,
		    "%s: repeat(2) is not epoch 0 then epoch 1", p);
		free(e0);
		free(again);
		free(twice);
		free(both);
	}
	ck_assert_str_eq(e1[0], e1[1]);
	ck_assert_str_eq(e1[2], e1[3]);
	for (size_t i = 0; i < NP; i++)
		free(e1[i]);
	cachew_options_destroy(o0);
	cachew_options_destroy(o1);
}
END_TEST

/* Runs range(5000) | map(exec_test_fail, parallel) [| prefetch] and checks
 * elements 0..1233 in order, then the error and its message. */
static void
check_fails_at_1234(int64_t parallel, bool prefetch)
{
	cachew_options *o = cwt_opts(1, 0);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	cachew_err rv;
	int64_t i = 0;

	register_fns();
	ds = map_ds(range_ds(5000), "exec_test_fail", parallel, 1, NULL, 0);
	if (prefetch)
		ds = prefetch_ds(ds, 3);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	size_t wrong = 0;
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		wrong += *(const int64_t *)cachew_tensor_data(
			     cachew_element_component(e, 0)) != i;
		cachew_element_release(e);
		i++;
	}
	ck_assert_uint_eq(wrong, 0);
	ck_assert_int_eq(i, 1234);
	ck_assert_int_eq(rv, CACHEW_EOP);
	ck_assert_str_eq(cachew_iterator_errmsg(it),
	    "map(exec_test_fail): bad value 1234 (element 1234)");
	/* Sticky. */
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EOP);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}

START_TEST(test_map_error_delivers_prefix_then_error)
{
	check_fails_at_1234(1, false);
	check_fails_at_1234(2, false);
	check_fails_at_1234(4, false);
	check_fails_at_1234(CACHEW_AUTO, false);
}
END_TEST

START_TEST(test_map_parallel_empty_input)
{
	cachew_options *o = cwt_opts(1, 0);
	char *s = run_join(map_ds(range_ds(0), "add", 2, 1, NULL, 0), o);
	ck_assert_str_eq(s, "");
	free(s);
	s = run_join(map_ds(range_ds(1), "add", 4, 0, NULL, 0), o);
	ck_assert_str_eq(s, "1");
	free(s);
	cachew_options_destroy(o);
}
END_TEST

/* ---- prefetch ------------------------------------------------------------------ */

START_TEST(test_prefetch_preserves_order)
{
	static const int64_t sizes[] = {CACHEW_AUTO, 1, 7, 100000};
	cachew_options *o = cwt_opts(1, 0);
	size_t n;
	int64_t *got;

	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		/* Small buffers hand over per element: fewer of them. */
		int64_t len = sizes[k] > 0 && sizes[k] < 100 ? 10000 : 100000;
		got = run_values(prefetch_ds(range_ds(len), sizes[k]), o, &n);
		ck_assert_uint_eq(n, (size_t)len);
		ck_assert_msg(check_iota(got, n, 0) == 0,
		    "prefetch(%lld) differs", (long long)sizes[k]);
		free(got);
	}
	/* Stacked around a parallel map. */
	got = run_values(
	    prefetch_ds(map_ds(prefetch_ds(range_ds(100000), CACHEW_AUTO),
			    "add", 2, 1, "value", 0),
		CACHEW_AUTO),
	    o, &n);
	ck_assert_uint_eq(n, 100000);
	ck_assert_uint_eq(check_iota(got, n, 0), 0);
	free(got);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_prefetch_delivers_elements_before_input_error)
{
	check_fails_at_1234(1, true);
	check_fails_at_1234(2, true);
}
END_TEST

/* Runs `concatenate(FIRST, range(3, 10) | map(exec_test_gate)) |
 * prefetch(100)`, where FIRST yields n_first elements of value i % 3.
 * The input stalls in the gate on 3: the consumer must get every element
 * of FIRST while it stalls, not only once the input yields again; then,
 * waiting on an empty queue, it must be woken by the producer's next
 * append once the gate opens. */
static void
check_delivered_while_stalled(const char *first, int64_t n_first)
{
	char pipeline[256];
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	pthread_t opener;

	snprintf(pipeline, sizeof(pipeline),
	    "concatenate(%s, range(%d, 10) | map(exec_test_gate)) | "
	    "prefetch(100)",
	    first, GATE_AT);
	gate_set(false);
	ck_assert_msg(cachew_dataset_parse(&ds, pipeline) == CACHEW_OK, "%s: %s",
	    pipeline, cachew_errmsg());
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	for (int64_t k = 0; k < n_first; k++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		ck_assert_int_eq(cwt_i64(e, 0), k % 3);
		cachew_element_release(e);
		ck_assert_msg(!gate_gave_up(),
		    "%s: element %lld came only after the input yielded again",
		    pipeline, (long long)k);
	}
	ck_assert_int_eq(
	    pthread_create(&opener, NULL, gate_open_later, NULL), 0);
	for (int64_t k = GATE_AT; k < 10; k++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		ck_assert_int_eq(cwt_i64(e, 0), k);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EOF);
	ck_assert_int_eq(pthread_join(opener, NULL), 0);
	ck_assert_msg(!gate_gave_up(), "%s: the gate gave up: nobody opened it",
	    pipeline);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
}

START_TEST(test_prefetch_delivers_pulled_elements_while_input_stalls)
{
	register_fns();
	/* An input that fills a chunk per call (the consumer waits for the
	 * producer's signal): the second chunk gets 1 and 2, then the input
	 * stalls. */
	check_delivered_while_stalled("range(3)", 3);
	/* One that returns at most 3 elements per call (the consumer first
	 * waits with a timeout, as appends are not signalled). */
	check_delivered_while_stalled("range(3) | repeat(40)", 120);
}
END_TEST

START_TEST(test_destroy_mid_stream_returns_promptly)
{
	cachew_options *o = cwt_opts(1, 0);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	uint64_t t0;

	ds = prefetch_ds(map_ds(range_ds(1000000000000LL), "sleep_us", 2, 1,
			     "us", 100),
	    CACHEW_AUTO);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	for (int64_t i = 0; i < 200; i++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		ck_assert_int_eq(cwt_i64(e, 0), i);
		cachew_element_release(e);
	}
	t0 = now_ms();
	cachew_iterator_destroy(it);
	ck_assert_uint_lt(now_ms() - t0, 5000);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_destroy_before_first_next_and_when_blocked)
{
	cachew_options *o = cwt_opts(1, 0);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;

	register_fns();
	/* Never started. */
	ds = prefetch_ds(map_ds(range_ds(1000), "add", 2, 1, NULL, 0), 4);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	/* Workers blocked on full buffers at every stage. */
	ds = interleave_ds(
	    prefetch_ds(map_ds(range_ds(1000000), "add", 3, 1, NULL, 0), 2),
	    "exec_test_count", 4, 2, 2, 1);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
	cachew_element_release(e);
	struct timespec ts = {0, 50 * 1000 * 1000};
	nanosleep(&ts, NULL);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_destroy_at_many_points)
{
	/* Every threaded operator, each buffering, some in a repeat that
	 * re-creates them per epoch; destroyed after 0..~300 elements. */
	static const char *const pipelines[] = {
	    "range(100000) | map(add, parallel=2) | prefetch(2) | repeat(3) "
	    "| map(spin_us, us=2, parallel=auto) | prefetch(auto)",
	    "range(100000) | map(exec_test_perm, parallel=3, "
	    "deterministic=false) | interleave(exec_test_count, cycle=3, "
	    "block=2, parallel=2) | prefetch(1)",
	    "range(100) | map(exec_test_perm) | interleave(exec_test_count, "
	    "cycle=4, parallel=auto, deterministic=false) | repeat(-1) | "
	    "map(add, parallel=auto)",
	};
	cachew_options *o = cwt_opts(1, 2);

	register_fns();
	for (size_t k = 0; k < sizeof(pipelines) / sizeof(pipelines[0]); k++) {
		cachew_dataset *ds;
		ck_assert_msg(cachew_dataset_parse(&ds, pipelines[k]) ==
			CACHEW_OK,
		    "%s", cachew_errmsg());
		for (int round = 0; round < 12; round++) {
			cachew_iterator *it;
			cachew_element *e;
			int take = round * round * 2;
			ck_assert_int_eq(
			    cachew_iterator_create(&it, ds, o), CACHEW_OK);
			for (int i = 0; i < take; i++) {
				if (cachew_iterator_next(it, &e) != CACHEW_OK)
					break;
				cachew_element_release(e);
			}
			cachew_iterator_destroy(it);
		}
		cachew_dataset_release(ds);
	}
	cachew_options_destroy(o);
}
END_TEST

/* ---- interleave ---------------------------------------------------------------- */

static const struct {
	int64_t cycle, block;
	const char *want;
} ilv_cases[] = {
    {2, 1, "300,100,301,302,400,401,402,200,403,201,500,100,501,502,300,503,"
	   "301,504,302"},
    {3, 2, "300,301,100,400,401,302,402,403,200,201,500,501,502,503,100,300,"
	   "301,504,302"},
    {1, 5, "300,301,302,100,400,401,402,403,200,201,500,501,502,503,504,100,"
	   "300,301,302"},
    {4, 1, "300,100,400,301,401,200,302,500,402,201,501,403,100,502,300,503,"
	   "301,504,302"},
};

START_TEST(test_interleave_sequential_order)
{
	cachew_options *o = cwt_opts(1, 0);
	for (size_t k = 0; k < sizeof(ilv_cases) / sizeof(ilv_cases[0]); k++) {
		char *got = run_join(interleave_ds(uneven_ds(), "exec_test_count",
					 ilv_cases[k].cycle, ilv_cases[k].block, 1, 1),
		    o);
		ck_assert_str_eq(got, ilv_cases[k].want);
		free(got);
	}
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_interleave_parallel_deterministic_same_order)
{
	static const int64_t par[] = {2, 3, CACHEW_AUTO};
	cachew_options *o = cwt_opts(1, 0);
	cachew_options *t1 = cwt_opts(1, 1);
	for (size_t k = 0; k < sizeof(ilv_cases) / sizeof(ilv_cases[0]); k++) {
		for (size_t j = 0; j < sizeof(par) / sizeof(par[0]); j++) {
			char *got = run_join(
			    interleave_ds(uneven_ds(), "exec_test_count",
				ilv_cases[k].cycle, ilv_cases[k].block, par[j],
				1),
			    j == 2 ? t1 : o);
			ck_assert_msg(strcmp(got, ilv_cases[k].want) == 0,
			    "cycle=%lld block=%lld parallel=%lld: %s",
			    (long long)ilv_cases[k].cycle,
			    (long long)ilv_cases[k].block, (long long)par[j],
			    got);
			free(got);
		}
	}
	cachew_options_destroy(o);
	cachew_options_destroy(t1);
}
END_TEST

START_TEST(test_interleave_nondeterministic_same_multiset)
{
	cachew_options *o = cwt_opts(1, 0);
	size_t n1, n2;
	int64_t *a, *b;

	a = run_sorted(interleave_ds(uneven_ds(), "exec_test_count", 3, 2, 1, 1),
	    o, &n1);
	b = run_sorted(interleave_ds(uneven_ds(), "exec_test_count", 3, 2, 2, 0),
	    o, &n2);
	ck_assert_uint_eq(n1, 19);
	ck_assert_uint_eq(n2, n1);
	ck_assert(memcmp(a, b, n1 * sizeof(*a)) == 0);
	free(a);
	free(b);
	/* A larger run: range(300) -> sequences of 0..5 elements. */
	register_fns();
	a = run_sorted(interleave_ds(map_ds(range_ds(300), "exec_test_perm", 1,
					 1, NULL, 0),
			   "exec_test_count", 5, 3, 1, 1),
	    o, &n1);
	b = run_sorted(interleave_ds(map_ds(range_ds(300), "exec_test_perm", 1,
					 1, NULL, 0),
			   "exec_test_count", 5, 3, 4, 0),
	    o, &n2);
	ck_assert_uint_eq(n2, n1);
	ck_assert(memcmp(a, b, n1 * sizeof(*a)) == 0);
	free(a);
	free(b);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_interleave_error_after_earlier_elements)
{
	static const int64_t par[] = {1, 2};
	cachew_options *o = cwt_opts(1, 0);

	for (size_t k = 0; k < 2; k++) {
		cachew_dataset *ds = interleave_ds(uneven_ds(),
		    "exec_test_count_fail", 2, 1, par[k], 1);
		cachew_element **v;
		size_t n;
		char err[256];
		cachew_err rv = cwt_run_ds(ds, o, &v, &n, err, sizeof(err));
		ck_assert_int_eq(rv, CACHEW_EOP);
		ck_assert_str_eq(err, "interleave(exec_test_count_fail): bad "
				      "element 401 (element 2)");
		cachew_dataset_release(ds);
	}
	/* The elements before it, in order. */
	cachew_iterator *it;
	cachew_element *e;
	cachew_dataset *ds = interleave_ds(
	    uneven_ds(), "exec_test_count_fail", 2, 1, 2, 1);
	static const int64_t want[] = {300, 100, 301, 302, 400};
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	for (size_t i = 0; i < 5; i++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		ck_assert_int_eq(cwt_i64(e, 0), want[i]);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EOP);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_interleave_empty_input)
{
	cachew_options *o = cwt_opts(1, 0);
	register_fns();
	char *s = run_join(
	    interleave_ds(range_ds(0), "exec_test_count", 3, 1, 2, 1), o);
	ck_assert_str_eq(s, "");
	free(s);
	s = run_join(interleave_ds(range_ds(1), "exec_test_count", 3, 1, 1, 1),
	    o);
	ck_assert_str_eq(s, "");
	free(s);
	cachew_options_destroy(o);
}
END_TEST

/* ---- pipeline strings ---------------------------------------------------------------- */

START_TEST(test_pipeline_strings_run_threaded_ops)
{
	cachew_options *o = cwt_opts(1, 0);
	char *s;

	register_fns();
	s = cwt_seq("range(10) | map(add, parallel=2) | prefetch(auto)", o);
	ck_assert_str_eq(s, "1,2,3,4,5,6,7,8,9,10");
	free(s);
	s = cwt_seq("range(20) | prefetch(1) | map(mul, value=2, parallel=3) "
		    "| prefetch(2)",
	    o);
	ck_assert_str_eq(s, "0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32,"
			    "34,36,38");
	free(s);
	s = cwt_seq("range(8) | map(exec_test_perm) | interleave("
		    "exec_test_count, cycle=3, block=2, parallel=2)",
	    o);
	ck_assert_str_eq(s, ilv_cases[1].want);
	free(s);
	s = cwt_seq("range(8) | map(exec_test_perm, parallel=auto) | "
		    "interleave(exec_test_count, cycle=2, parallel=auto) | "
		    "prefetch(auto)",
	    o);
	ck_assert_str_eq(s, ilv_cases[0].want);
	free(s);
	cachew_options_destroy(o);
}
END_TEST

/* The lines of every element (BYTES scalars), comma-joined. */
static char *
join_lines(cachew_dataset *ds, const cachew_options *o)
{
	cachew_element **v;
	size_t n, len = 0;
	char err[512], *out = malloc(4096);
	cachew_err rv = cwt_run_ds(ds, o, &v, &n, err, sizeof(err));

	ck_assert_msg(rv == CACHEW_OK, "run failed: %s", err);
	out[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		const void *d;
		size_t l;
		ck_assert_int_eq(cachew_tensor_bytes_at(
				     cachew_element_component(v[i], 0), 0, &d, &l),
		    CACHEW_OK);
		ck_assert_uint_lt(len + l + 2, 4096);
		if (i > 0)
			out[len++] = ',';
		memcpy(out + len, d, l);
		len += l;
		out[len] = '\0';
	}
	cwt_free(v, n);
	return out;
}

START_TEST(test_interleave_text_lines_parallel_same_order)
{
	static const char *const want[2] = {
	    "a0,b0,a1,a2,c0,c1,d0,c2,d1,c3,c4",
	    "a0,a1,b0,c0,c1,a2,d0,d1,c2,c3,c4",
	};
	static const int64_t par[] = {1, 2, CACHEW_AUTO};
	cachew_options *o = cwt_opts(1, 0);
	char *dir = cwt_tmpdir(), path[4][512], pipeline[4096];

	cwt_write_file((snprintf(path[0], 512, "%s/a.txt", dir), path[0]),
	    "a0\na1\na2\n", 9);
	cwt_write_file((snprintf(path[1], 512, "%s/b.txt", dir), path[1]),
	    "b0", 2);
	cwt_write_file((snprintf(path[2], 512, "%s/c.txt", dir), path[2]),
	    "c0\r\nc1\nc2\nc3\nc4\n", 16);
	cwt_write_file((snprintf(path[3], 512, "%s/d.txt", dir), path[3]),
	    "d0\nd1\n", 6);
	for (int k = 0; k < 2; k++) {
		for (size_t j = 0; j < 3; j++) {
			cachew_dataset *ds;
			char *got;
			snprintf(pipeline, sizeof(pipeline),
			    "from_list([\"%s\", \"%s\", \"%s\", \"%s\"]) | "
			    "interleave(text_lines, cycle=%d, block=%d, "
			    "parallel=%lld)",
			    path[0], path[1], path[2], path[3], k == 0 ? 2 : 3,
			    k == 0 ? 1 : 2, (long long)par[j]);
			ck_assert_msg(cachew_dataset_parse(&ds, pipeline) ==
				CACHEW_OK,
			    "%s", cachew_errmsg());
			got = join_lines(ds, o);
			ck_assert_msg(strcmp(got, want[k]) == 0, "%s: %s",
			    pipeline, got);
			free(got);
			cachew_dataset_release(ds);
		}
	}
	cwt_rmtree(dir);
	free(dir);
	cachew_options_destroy(o);
}
END_TEST

/* ---- stats and budgets ------------------------------------------------------------ */

START_TEST(test_stats_map_parallel_3_reports_3)
{
	cachew_options *o = cwt_opts(1, 0);
	/* The plain executor: its rows exist from create on (an embedded
	 * iterator's worker rows appear with its first lease). */
	ck_assert_int_eq(cachew_options_set_str(o, "service", "local"),
	    CACHEW_OK);
	/* A function worth its threads (a cheap one runs inline: 1). */
	cachew_dataset *ds = map_ds(range_ds(6000), "spin_us", 3, 1, "us", 20);
	cachew_iterator *it;
	cachew_element *e;
	cachew_op_stats s;
	int64_t n = 0;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	ck_assert_int_eq(stats_of(it, "map").parallelism, 3);
	while (cachew_iterator_next(it, &e) == CACHEW_OK) {
		cachew_element_release(e);
		if (++n == 3000)
			ck_assert_int_eq(stats_of(it, "map").parallelism, 3);
	}
	s = stats_of(it, "map");
	ck_assert_int_eq(s.parallelism, 3);
	ck_assert_uint_eq(s.elements, 6000);
	ck_assert_int_eq(s.buffered, 0);
	ck_assert_int_gt(s.buffer_limit, 0);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}
END_TEST

/* Large elements are taken one per chunk: 16 batches of 2 MiB through
 * a function hinted at 5 ns per element, which chunks sized by time alone
 * took 16 at a time (32 MiB held by one worker before any came out; W2's
 * normalize took 5 batches of 38.5 MB of output per chunk). */
START_TEST(test_map_parallel_takes_large_elements_one_per_chunk)
{
	cachew_options *o = cwt_opts(1, 0);
	cachew_dataset *ds = NULL;
	cachew_iterator *it;
	cachew_element *e;
	int64_t n = 0;

	ck_assert_int_eq(cachew_options_set_str(o, "service", "local"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "range(4194304) | batch(262144) | "
			     "map(add, value=1, parallel=2)"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while (cachew_iterator_next(it, &e) == CACHEW_OK) {
		const cachew_tensor *t = cachew_element_component(e, 0);
		const int64_t *v = cachew_tensor_data(t);

		ck_assert_int_eq(cachew_tensor_numel(t), 262144);
		ck_assert_int_eq(v[0], n * 262144 + 1);
		ck_assert_int_eq(v[262143], n * 262144 + 262144);
		cachew_element_release(e);
		n++;
	}
	ck_assert_int_eq(n, 16);
	/* 2 workers: 2 x 2 + 2 chunks of one element each. */
	ck_assert_int_eq(stats_of(it, "map").buffer_limit, 6);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_stats_auto_within_thread_budget)
{
	cachew_options *o = cwt_opts(1, 2);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;
	int64_t n = 0;

	register_fns();
	ds = prefetch_ds(
	    interleave_ds(map_ds(map_ds(range_ds(60000), "spin_us",
				     CACHEW_AUTO, 1, "us", 5),
			      "exec_test_perm", CACHEW_AUTO, 1, NULL, 0),
		"exec_test_count", 4, 2, CACHEW_AUTO, 1),
	    CACHEW_AUTO);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while (cachew_iterator_next(it, &e) == CACHEW_OK) {
		cachew_element_release(e);
		if (++n % 997 != 0)
			continue;
		cachew_op_stats r1[16], r2[16];
		size_t k = 0;
		int total = 0;
		cachew_iterator_stats(it, r1, 16, &k);
		cachew_iterator_stats(it, r2, 16, &k);
		for (size_t i = 0; i < k; i++) {
			if (strcmp(r1[i].name, "prefetch") != 0)
				total += r1[i].parallelism;
			ck_assert_int_ge(r1[i].parallelism, 1);
			ck_assert_int_ge(r1[i].buffered, 0);
			/* Limits never shrink: a later read bounds an earlier
			 * occupancy. */
			ck_assert_int_le(r1[i].buffered, r2[i].buffer_limit);
		}
		/* range is 1; each auto op has 1..2 threads and together at
		 * most the budget (an op without one works inline). */
		ck_assert_int_le(total, 1 + 2 + 1 + 1);
		ck_assert_int_le(stats_of(it, "interleave").parallelism, 2);
	}
	ck_assert_int_gt(n, 0);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_threads_1_with_parallel_auto)
{
	cachew_options *o = cwt_opts(1, 1);
	cachew_options *off = cwt_opts(1, 1);
	size_t n;
	int64_t *got;

	/* Two auto maps share one thread: the second works inline. */
	got = run_values(
	    prefetch_ds(map_ds(map_ds(range_ds(20000), "add", CACHEW_AUTO, 1,
				   NULL, 0),
			    "add", CACHEW_AUTO, 1, NULL, 0),
		CACHEW_AUTO),
	    o, &n);
	ck_assert_uint_eq(n, 20000);
	ck_assert_uint_eq(check_iota(got, n, 2), 0);
	free(got);
	ck_assert_int_eq(cachew_options_set_bool(off, "autotune", 0), CACHEW_OK);
	got = run_values(
	    prefetch_ds(map_ds(map_ds(range_ds(20000), "add", CACHEW_AUTO, 1,
				   NULL, 0),
			    "add", CACHEW_AUTO, 1, NULL, 0),
		CACHEW_AUTO),
	    off, &n);
	ck_assert_uint_eq(n, 20000);
	ck_assert_uint_eq(check_iota(got, n, 2), 0);
	free(got);
	cachew_options_destroy(o);
	cachew_options_destroy(off);
}
END_TEST

START_TEST(test_tiny_ram_budget_still_progresses)
{
	/* Over budget from the first chunk: every buffer may still hold one
	 * chunk, so the pipeline slows down but completes, in order. */
	cachew_options *o = cwt_opts(1, 2);
	size_t n;
	int64_t *got;
	char *s;

	ck_assert_int_eq(cachew_options_set_int(o, "ram_budget", 1), CACHEW_OK);
	got = run_values(
	    prefetch_ds(map_ds(prefetch_ds(range_ds(20000), CACHEW_AUTO),
			    "spin_us", 2, 1, "us", 1),
		CACHEW_AUTO),
	    o, &n);
	ck_assert_uint_eq(n, 20000);
	ck_assert_uint_eq(check_iota(got, n, 0), 0);
	free(got);
	s = run_join(interleave_ds(uneven_ds(), "exec_test_count", 3, 2, 2, 1),
	    o);
	ck_assert_str_eq(s, ilv_cases[1].want);
	free(s);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(test_autotune_rules)
{
	cwi_tune_sample s = {.interval_ns = 30000000, .workers = 1};
	cwi_tune_buffer_sample b = {.interval_ns = 30000000};

	/* Consumer waits, workers busy: add. */
	s.wait_ns = 10000000;
	s.busy_ns = 29000000;
	ck_assert_int_eq(cwi_tune_workers_rule(&s), 1);
	/* Consumer waits on a slow input (workers idle): keep. */
	s.busy_ns = 3000000;
	ck_assert_int_eq(cwi_tune_workers_rule(&s), 0);
	/* Nobody waits, workers idle on a full buffer: shrink, not below 1. */
	s.wait_ns = 0;
	s.workers = 2;
	ck_assert_int_eq(cwi_tune_workers_rule(&s), -1);
	s.workers = 1;
	ck_assert_int_eq(cwi_tune_workers_rule(&s), 0);
	/* No thread at all: ask for one. */
	s.workers = 0;
	ck_assert_int_eq(cwi_tune_workers_rule(&s), 1);
	/* Prefetch grows on full-then-empty only. */
	b.wait_ns = 3000000;
	ck_assert(!cwi_tune_buffer_rule(&b));
	b.was_full = true;
	ck_assert(cwi_tune_buffer_rule(&b));
	b.wait_ns = 0;
	ck_assert(!cwi_tune_buffer_rule(&b));
}
END_TEST

/* A forked child (a DataLoader worker) that destroys an iterator it
 * inherited: its threads stayed in the parent. Before the fix the default
 * (embedded) iterator's child hung in the fetch thread's condition
 * variable and a threaded local one crashed. The child must exit 0 at
 * once; the parent's iterator still delivers the rest. */
START_TEST(test_destroy_in_forked_child_leaves_parent_intact)
{
	static const char *const services[] = {"", "local"};

	for (size_t k = 0; k < 2; k++) {
		cachew_dataset *ds;
		cachew_options *o;
		cachew_iterator *it;
		cachew_element *e;
		int64_t n = 0;
		int st;
		pid_t pid;

		ck_assert_int_eq(cachew_dataset_parse(&ds, "range(1000) | "
		    "map(add, value=1, parallel=2) | batch(10) | prefetch(2)"),
		    CACHEW_OK);
		ck_assert_int_eq(cachew_options_create(&o), CACHEW_OK);
		if (services[k][0] != '\0')
			ck_assert_int_eq(cachew_options_set_str(o, "service",
			    services[k]), CACHEW_OK);
		ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		cachew_element_release(e);
		n++;
		pid = fork();
		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			alarm(10); /* a hang becomes SIGALRM */
			cachew_iterator_destroy(it);
			/* The child's copy stays, unused: under valgrind
			 * an exit would report it (and what the parent's
			 * threads held) as lost; an exec reports nothing. */
			execl("/bin/true", "true", (char *)NULL);
			_exit(0);
		}
		ck_assert_int_eq(waitpid(pid, &st, 0), pid);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		    "service '%s': child status %d", services[k], st);
		while (cachew_iterator_next(it, &e) == CACHEW_OK) {
			cachew_element_release(e);
			n++;
		}
		ck_assert_int_eq(n, 100);
		cachew_iterator_destroy(it);
		cachew_options_destroy(o);
		cachew_dataset_release(ds);
	}
}
END_TEST

Suite *
cwt_exec_suite(void)
{
	Suite *s = suite_create("exec");
	TCase *tc = tcase_create("exec");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_map_parallel_same_order_as_inline);
	tcase_add_test(tc, test_map_nondeterministic_same_multiset);
	tcase_add_test(tc, test_map_random_same_at_any_parallelism);
	tcase_add_test(tc, test_random_functions_draw_anew_each_epoch);
	tcase_add_test(tc, test_map_error_delivers_prefix_then_error);
	tcase_add_test(tc, test_map_parallel_empty_input);
	tcase_add_test(tc, test_prefetch_preserves_order);
	tcase_add_test(tc, test_prefetch_delivers_elements_before_input_error);
	tcase_add_test(
	    tc, test_prefetch_delivers_pulled_elements_while_input_stalls);
	tcase_add_test(tc, test_destroy_mid_stream_returns_promptly);
	tcase_add_test(tc, test_destroy_before_first_next_and_when_blocked);
	tcase_add_test(tc, test_destroy_at_many_points);
	tcase_add_test(tc, test_interleave_sequential_order);
	tcase_add_test(tc, test_interleave_parallel_deterministic_same_order);
	tcase_add_test(tc, test_interleave_nondeterministic_same_multiset);
	tcase_add_test(tc, test_interleave_error_after_earlier_elements);
	tcase_add_test(tc, test_interleave_empty_input);
	tcase_add_test(tc, test_pipeline_strings_run_threaded_ops);
	tcase_add_test(tc, test_interleave_text_lines_parallel_same_order);
	tcase_add_test(tc, test_stats_map_parallel_3_reports_3);
	tcase_add_test(tc, test_stats_auto_within_thread_budget);
	tcase_add_test(tc, test_map_parallel_takes_large_elements_one_per_chunk);
	tcase_add_test(tc, test_threads_1_with_parallel_auto);
	tcase_add_test(tc, test_tiny_ram_budget_still_progresses);
	tcase_add_test(tc, test_autotune_rules);
	tcase_add_test(tc, test_destroy_in_forked_child_leaves_parent_intact);
	suite_add_tcase(s, tc);
	return s;
}
