/*
 * check_split.c - splittable sources and the split plan (exec_split.c):
 * for every source, leases covering all split units yield the plain run's
 * multiset and one lease of everything yields the plain run itself; leases
 * replay identically with random operators; the plan's cut between the
 * worker part and the client part; the client part over the stream of the
 * worker part's leases.
 */
#include "cwt.h"

#include "../src/exec/exec_split.h"
#include "../src/tools/gen.h"
#include "../src/sources/sources.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- test functions ---------------------------------------------------------- */

static int64_t
scalar_i64(const cachew_element *e)
{
	const cachew_tensor *t = cachew_element_component(e, 0);
	const int64_t *p = cachew_tensor_data(t);
	return p[0];
}

/* split_test_not3: keeps x unless x % 3 == 0. */
static cachew_err
not3_filter(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	(void)ctx;
	*keep = scalar_i64(in) % 3 != 0;
	return CACHEW_OK;
}

/* split_test_twice: x -> x, x + 1000. */
typedef struct twice_seq {
	int64_t x;
	int k;
} twice_seq;

static cachew_err
twice_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	twice_seq *s = malloc(sizeof(*s));
	(void)ctx;
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->x = scalar_i64(in);
	s->k = 0;
	*seq = s;
	return CACHEW_OK;
}

static cachew_err
twice_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	twice_seq *s = seq;
	cachew_element *e;
	void *d;
	int64_t v;

	(void)ctx;
	if (s->k == 2)
		return CACHEW_EOF;
	v = s->x + (s->k++ == 0 ? 0 : 1000);
	ck_assert_int_eq(cachew_element_create(&e, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_element_alloc(e, 0, CACHEW_I64, 0, NULL, &d),
	    CACHEW_OK);
	memcpy(d, &v, sizeof(v));
	*out = e;
	return CACHEW_OK;
}

static void
twice_close(void *seq)
{
	free(seq);
}

static void
register_fns(void)
{
	static const cachew_op_def defs[] = {
	    {.version = CACHEW_OP_DEF_VERSION, .name = "split_test_not3",
		.kind = CACHEW_OP_FILTER,
		.filter = not3_filter},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "split_test_twice",
		.kind = CACHEW_OP_FLAT_MAP,
		.flat_open = twice_open, .flat_next = twice_next,
		.flat_close = twice_close},
	};
	for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++)
		ck_assert_msg(cachew_op_register(&defs[i]) == CACHEW_OK,
		    "registering %s: %s", defs[i].name, cachew_errmsg());
}

static pthread_once_t register_once = PTHREAD_ONCE_INIT;

static void
setup(void)
{
	pthread_once(&register_once, register_fns);
}

/* ---- element lists ------------------------------------------------------------- */

typedef struct elems {
	cachew_element **v;
	size_t n, cap;
} elems;

static void
elems_push(elems *l, cachew_element *e)
{
	if (l->n == l->cap) {
		l->cap = l->cap != 0 ? l->cap * 2 : 64;
		l->v = realloc(l->v, l->cap * sizeof(*l->v));
		ck_assert_ptr_nonnull(l->v);
	}
	l->v[l->n++] = e;
}

static void
elems_free(elems *l)
{
	cwt_free(l->v, l->n);
	memset(l, 0, sizeof(*l));
}

/* Pulls every element of it into l; fails the test on an error. */
static void
drain(cachew_iterator *it, elems *l)
{
	cachew_element *e;
	cachew_err rv;

	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK)
		elems_push(l, e);
	ck_assert_msg(rv == CACHEW_EOF, "iteration failed: %s: %s",
	    cachew_strerror(rv), cachew_iterator_errmsg(it));
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

/* The element hashes, sorted: the multiset. Free with free(). */
static uint64_t *
sorted_hashes(const elems *l)
{
	uint64_t *h = malloc((l->n + 1) * sizeof(*h));

	ck_assert_ptr_nonnull(h);
	for (size_t i = 0; i < l->n; i++)
		h[i] = cachew_element_hash(l->v[i]);
	qsort(h, l->n, sizeof(*h), cmp_u64);
	return h;
}

static void
assert_same_multiset(const elems *a, const elems *b, const char *what)
{
	uint64_t *ha, *hb;

	ck_assert_msg(a->n == b->n, "%s: %zu elements, expected %zu", what,
	    a->n, b->n);
	ha = sorted_hashes(a);
	hb = sorted_hashes(b);
	ck_assert_msg(memcmp(ha, hb, a->n * sizeof(*ha)) == 0,
	    "%s: a different multiset of elements", what);
	free(ha);
	free(hb);
}

static void
assert_same_sequence(const elems *a, const elems *b, const char *what)
{
	ck_assert_msg(a->n == b->n, "%s: %zu elements, expected %zu", what,
	    a->n, b->n);
	for (size_t i = 0; i < a->n; i++)
		ck_assert_msg(cachew_element_hash(a->v[i]) ==
			cachew_element_hash(b->v[i]),
		    "%s: element %zu differs", what, i);
}

/* Whether two runs hold the same elements in the same order. */
static bool
same_sequence(const elems *a, const elems *b)
{
	if (a->n != b->n)
		return false;
	for (size_t i = 0; i < a->n; i++)
		if (cachew_element_hash(a->v[i]) != cachew_element_hash(b->v[i]))
			return false;
	return true;
}

/* ---- running plans and leases --------------------------------------------------- */

#define SEED 7

/* The plain run at an epoch (the "epoch" option). */
static void
run_plain_at(const char *pipeline, int threads, uint64_t epoch, elems *out)
{
	cachew_options *o = cwt_opts_at(SEED, (int64_t)epoch, NULL);
	cachew_element **v = NULL;
	size_t n = 0;
	char err[1024] = "";
	cachew_err rv;

	ck_assert_int_eq(cachew_options_set_int(o, "threads", threads),
	    CACHEW_OK);
	rv = cwt_run(pipeline, o, &v, &n, err, sizeof(err));
	ck_assert_msg(rv == CACHEW_OK, "'%s' failed: %s: %s", pipeline,
	    cachew_strerror(rv), err);
	for (size_t i = 0; i < n; i++)
		elems_push(out, v[i]);
	free(v);
	cachew_options_destroy(o);
}

static void
run_plain(const char *pipeline, int threads, elems *out)
{
	run_plain_at(pipeline, threads, 0, out);
}

/* The plan of a pipeline, with cwi_split_plan_create_for's flags. */
static cwi_split_plan *
plan_of_for(const char *pipeline, unsigned flags)
{
	cachew_dataset *ds = NULL;
	cwi_split_plan *p = NULL;
	cachew_err rv;

	rv = cachew_dataset_parse(&ds, pipeline);
	ck_assert_msg(rv == CACHEW_OK, "parse '%s': %s", pipeline,
	    cachew_errmsg());
	rv = cwi_split_plan_create_for(&p, ds, flags);
	ck_assert_msg(rv == CACHEW_OK, "plan '%s': %s: %s", pipeline,
	    cachew_strerror(rv), cachew_errmsg());
	cachew_dataset_release(ds); /* the plan holds its own reference */
	return p;
}

static cwi_split_plan *
plan_of(const char *pipeline)
{
	return plan_of_for(pipeline, 0);
}

/* One lease of the job seeded SEED at an epoch (the worker runs it with
 * the job's epoch as its "epoch" option). */
static void
run_lease_at(const cwi_split_plan *p, const cwi_unit_range *r, size_t n,
    int threads, uint64_t epoch, elems *out)
{
	cachew_options *o = cwt_opts_at(SEED, (int64_t)epoch, NULL);
	cachew_iterator *it = NULL;
	cachew_err rv;

	ck_assert_int_eq(cachew_options_set_int(o, "threads", threads),
	    CACHEW_OK);

	rv = cwi_iterator_create_lease(&it, p->worker, o, p->source, r, n,
	    SEED);
	ck_assert_msg(rv == CACHEW_OK, "lease: %s: %s", cachew_strerror(rv),
	    cachew_errmsg());
	drain(it, out);
	cachew_iterator_destroy(it);
	cachew_options_destroy(o);
}

static void
run_lease(const cwi_split_plan *p, const cwi_unit_range *r, size_t n,
    int threads, elems *out)
{
	run_lease_at(p, r, n, threads, 0, out);
}

/* A lease: unit ranges in the order they are read. */
typedef struct lease {
	cwi_unit_range *r;
	size_t n;
} lease;

static uint64_t
next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Cuts [0, units) into splits of 1 to 3 units, shuffles them and deals
 * them into 1 to 4 leases (some may stay empty). Returns the lease count;
 * free each lease's r and the array. */
static size_t
random_leases(uint64_t units, uint64_t seed, lease **out)
{
	uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
	size_t nsplits = 0, nleases = 1 + next_rand(&s) % 4;
	cwi_unit_range *splits = malloc((units + 1) * sizeof(*splits));
	lease *l = calloc(nleases, sizeof(*l));

	ck_assert_ptr_nonnull(splits);
	ck_assert_ptr_nonnull(l);
	for (uint64_t at = 0; at < units;) {
		uint64_t size = 1 + next_rand(&s) % 3;
		if (at + size > units)
			size = units - at;
		splits[nsplits].begin = at;
		splits[nsplits].end = at + size;
		nsplits++;
		at += size;
	}
	for (size_t i = nsplits; i > 1; i--) {
		size_t j = next_rand(&s) % i;
		cwi_unit_range t = splits[i - 1];
		splits[i - 1] = splits[j];
		splits[j] = t;
	}
	for (size_t i = 0; i < nleases; i++) {
		l[i].r = malloc((nsplits + 1) * sizeof(*l[i].r));
		ck_assert_ptr_nonnull(l[i].r);
	}
	for (size_t i = 0; i < nsplits; i++) {
		lease *to = &l[next_rand(&s) % nleases];
		to->r[to->n++] = splits[i];
	}
	free(splits);
	*out = l;
	return nleases;
}

static void
leases_free(lease *l, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(l[i].r);
	free(l);
}

/* The whole check of a source: the pipeline runs entirely on workers;
 * one lease of every unit is the plain run, element for element; three
 * random groupings of the units into leases yield the plain multiset. */
static void
check_splits(const char *pipeline, uint64_t want_units)
{
	cwi_split_plan *p = plan_of(pipeline);
	cwi_unit_range all = {0, p->units};
	elems plain = {0}, one = {0};
	char what[1200];

	ck_assert_msg(p->units == want_units, "'%s': %llu units, expected %llu",
	    pipeline, (unsigned long long)p->units,
	    (unsigned long long)want_units);
	ck_assert_ptr_null(p->boundary);
	run_plain(pipeline, 2, &plain);
	run_lease(p, &all, 1, 2, &one);
	snprintf(what, sizeof(what), "'%s' in one lease", pipeline);
	assert_same_sequence(&one, &plain, what);
	for (uint64_t g = 1; g <= 3; g++) {
		elems got = {0};
		lease *l;
		size_t nl = random_leases(p->units, g, &l);
		for (size_t i = 0; i < nl; i++)
			run_lease(p, l[i].r, l[i].n, 2, &got);
		snprintf(what, sizeof(what), "'%s' in grouping %llu", pipeline,
		    (unsigned long long)g);
		assert_same_multiset(&got, &plain, what);
		elems_free(&got);
		leases_free(l, nl);
	}
	elems_free(&plain);
	elems_free(&one);
	cwi_split_plan_destroy(p);
}

/* ---- test data ------------------------------------------------------------------- */

/* dir/t<i>.txt with 1 + 2i lines "f<i>l<j>", i < 5. */
static void
write_text_files(const char *dir)
{
	for (int i = 0; i < 5; i++) {
		char path[512], body[512];
		size_t len = 0;
		for (int j = 0; j < 1 + 2 * i; j++)
			len += (size_t)snprintf(body + len, sizeof(body) - len,
			    "f%dl%d\n", i, j);
		snprintf(path, sizeof(path), "%s/t%d.txt", dir, i);
		cwt_write_file(path, body, len);
	}
}

/* dir/b<i>.bin with i + 1 records of 4 bytes, i < 4. */
static void
write_bin_files(const char *dir)
{
	for (int i = 0; i < 4; i++) {
		char path[512];
		uint8_t body[64];
		for (int j = 0; j < 4 * (i + 1); j++)
			body[j] = (uint8_t)(16 * i + j);
		snprintf(path, sizeof(path), "%s/b%d.bin", dir, i);
		cwt_write_file(path, body, (size_t)(4 * (i + 1)));
	}
}

/* dir/r<i>.tfrecord with i + 2 records "r<i>-<j>", i < 4. */
static void
write_tfrecord_files(const char *dir)
{
	for (int i = 0; i < 4; i++) {
		uint8_t body[1024];
		size_t len = 0;
		char path[512];
		for (int j = 0; j < i + 2; j++) {
			char rec[32];
			int n = snprintf(rec, sizeof(rec), "r%d-%d", i, j);
			cwi_tfrecord_header(body + len, (uint64_t)n);
			len += CWI_TFRECORD_HEADER;
			memcpy(body + len, rec, (size_t)n);
			len += (size_t)n;
			cwi_tfrecord_footer(body + len, rec, (size_t)n);
			len += CWI_TFRECORD_FOOTER;
		}
		snprintf(path, sizeof(path), "%s/r%d.tfrecord", dir, i);
		cwt_write_file(path, body, len);
	}
}

/* ---- sources ---------------------------------------------------------------------- */

START_TEST(range_splits_by_element)
{
	check_splits("range(23)", 23);
	check_splits("range(5, 40, 3)", 12);
	check_splits("range(20, -7, -3)", 9);
	check_splits("range(-5)", 0);
}
END_TEST

START_TEST(range_units_count_without_overflow)
{
	cwi_split_plan *p =
	    plan_of("range(-9223372036854775807, 9223372036854775807, "
		    "4611686018427387904)");
	cwi_unit_range last = {3, 4};
	elems got = {0};

	/* -2^63+1 + k * 2^62 for k = 0..3 lie below 2^63 - 1. */
	ck_assert_uint_eq(p->units, 4);
	run_lease(p, &last, 1, 1, &got);
	ck_assert_uint_eq(got.n, 1);
	ck_assert_int_eq(cwt_i64(got.v[0], 0), 4611686018427387905LL);
	elems_free(&got);
	cwi_split_plan_destroy(p);
}
END_TEST

/* Leases at both ends of the int64 domain: unit u is start + u * step
 * without overflow, for 2^64 - 1 units and for steps near the limits. */
static void
check_range_lease(const char *pipeline, uint64_t units, uint64_t begin,
    uint64_t end, const char *want)
{
	cwi_split_plan *p = plan_of(pipeline);
	cwi_unit_range r = {begin, end};
	elems got = {0};
	char *s;

	ck_assert_msg(p->units == units, "%s: %llu units", pipeline,
	    (unsigned long long)p->units);
	run_lease(p, &r, 1, 1, &got);
	s = cwt_join_i64(got.v, got.n, 0);
	ck_assert_msg(strcmp(s, want) == 0, "%s [%llu, %llu): %s", pipeline,
	    (unsigned long long)begin, (unsigned long long)end, s);
	free(s);
	elems_free(&got);
	cwi_split_plan_destroy(p);
}

START_TEST(range_leases_span_the_int64_domain)
{
	const char *all = "range(-9223372036854775808, "
			  "9223372036854775807)";
	const char *down = "range(10, -9223372036854775808, -1)";

	check_range_lease(all, UINT64_MAX, 0, 2,
	    "-9223372036854775808,-9223372036854775807");
	check_range_lease(all, UINT64_MAX, UINT64_MAX - 2, UINT64_MAX,
	    "9223372036854775805,9223372036854775806");
	check_range_lease(all, UINT64_MAX, (uint64_t)1 << 63,
	    ((uint64_t)1 << 63) + 1, "0");
	/* 2^63 + 10 units, past INT64_MAX (the service said "negative"). */
	check_range_lease(down, ((uint64_t)1 << 63) + 10, 0, 2, "10,9");
	check_range_lease(down, ((uint64_t)1 << 63) + 10,
	    ((uint64_t)1 << 63) + 8, ((uint64_t)1 << 63) + 10,
	    "-9223372036854775806,-9223372036854775807");
	check_range_lease("range(-9223372036854775808, "
			  "9223372036854775807, 9223372036854775807)",
	    3, 1, 3, "-1,9223372036854775806");
	check_range_lease("range(9223372036854775807, "
			  "-9223372036854775808, -9223372036854775808)",
	    2, 0, 2, "9223372036854775807,-1");
}
END_TEST

START_TEST(from_list_and_from_tensors_split_by_item)
{
	check_splits("from_list([(1, \"a\"), (2, \"b\"), (3, \"c\"), (4, \"d\"), "
		     "(5, \"e\")])",
	    5);
	check_splits("from_tensors([[1, 2], [3, 4]])", 1);
	check_splits("from_list([7, 8, 9]) | map(add, value=1)", 3);
}
END_TEST

START_TEST(list_files_splits_by_file)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	write_text_files(dir);
	/* shuffle=true (the default): one lease of everything reshuffles
	 * exactly as the plain run; leases read their units of the epoch's
	 * one file order. */
	snprintf(pipeline, sizeof(pipeline), "list_files(\"%s/t*.txt\")", dir);
	check_splits(pipeline, 5);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/t*.txt\", shuffle=false) | read_file", dir);
	check_splits(pipeline, 5);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* list_files(shuffle=true) in leases (issue 20, item 2): split unit i is
 * the i-th file of the epoch's order, drawn from the job's seed (not the
 * lease's), so the leases of an epoch read in unit order are the plain
 * run's order at that epoch, whatever their grouping, and another epoch
 * reads another order; with an explicit seed as with the pipeline's. */
static void
check_file_order_by_epoch(const char *pipeline)
{
	cwi_split_plan *p = plan_of(pipeline);
	elems plain[2] = {{0}, {0}};

	for (uint64_t e = 0; e < 2; e++) {
		elems ones = {0}, pairs = {0};
		cwi_unit_range r[2];
		run_plain_at(pipeline, 1, e, &plain[e]);
		for (uint64_t u = 0; u < p->units; u++) {
			r[0] = (cwi_unit_range){u, u + 1};
			run_lease_at(p, r, 1, 1, e, &ones);
		}
		/* [2, 4) with [0, 2) after it, then the rest. */
		r[0] = (cwi_unit_range){2, 4};
		r[1] = (cwi_unit_range){0, 2};
		run_lease_at(p, r, 2, 1, e, &pairs);
		r[0] = (cwi_unit_range){4, p->units};
		run_lease_at(p, r, 1, 1, e, &pairs);
		assert_same_sequence(&ones, &plain[e], pipeline);
		ck_assert_uint_eq(pairs.n, plain[e].n);
		for (size_t i = 0; i < pairs.n; i++) {
			size_t at = i < 2 ? i + 2 : i < 4 ? i - 2 : i;
			ck_assert(cachew_element_hash(pairs.v[i]) ==
			    cachew_element_hash(plain[e].v[at]));
		}
		elems_free(&ones);
		elems_free(&pairs);
	}
	ck_assert_msg(!same_sequence(&plain[0], &plain[1]),
	    "%s: epochs 0 and 1 list the files in one order", pipeline);
	elems_free(&plain[0]);
	elems_free(&plain[1]);
	cwi_split_plan_destroy(p);
}

START_TEST(list_files_leases_walk_the_epochs_file_order)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	write_text_files(dir);
	snprintf(pipeline, sizeof(pipeline), "list_files(\"%s/t*.txt\")", dir);
	check_file_order_by_epoch(pipeline);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/t*.txt\", seed=3) | read_file", dir);
	check_file_order_by_epoch(pipeline);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(text_lines_splits_by_file)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	write_text_files(dir);
	snprintf(pipeline, sizeof(pipeline), "text_lines(\"%s/t*.txt\")", dir);
	check_splits(pipeline, 5);
	/* Several patterns: units follow the expansion, pattern by pattern. */
	snprintf(pipeline, sizeof(pipeline),
	    "text_lines([\"%s/t4.txt\", \"%s/t[0-2].txt\"])", dir, dir);
	check_splits(pipeline, 4);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(fixed_length_records_split_by_file)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	write_bin_files(dir);
	snprintf(pipeline, sizeof(pipeline),
	    "fixed_length_records(\"%s/*.bin\", record_bytes=4)", dir);
	check_splits(pipeline, 4);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(tfrecord_splits_by_file)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	write_tfrecord_files(dir);
	snprintf(pipeline, sizeof(pipeline), "tfrecord(\"%s/*.tfrecord\")",
	    dir);
	check_splits(pipeline, 4);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(interleave_over_list_files_splits_by_file)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	write_tfrecord_files(dir);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/*.tfrecord\") | interleave(tfrecord, cycle=2)",
	    dir);
	check_splits(pipeline, 4);
	write_text_files(dir);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/t*.txt\", shuffle=false) | "
	    "interleave(text_lines, cycle=3, parallel=2)",
	    dir);
	check_splits(pipeline, 5);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(interleave_reads_only_the_leased_files)
{
	char *dir = cwt_tmpdir(), pipeline[1024];
	cwi_unit_range r[2] = {{3, 4}, {1, 2}};
	cwi_split_plan *p;
	elems got = {0};
	char *s;

	write_text_files(dir);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/t*.txt\", shuffle=false) | "
	    "interleave(text_lines, cycle=1)",
	    dir);
	p = plan_of(pipeline);
	ck_assert_str_eq(p->source->op->name, "list_files");
	run_lease(p, r, 2, 2, &got);
	ck_assert_uint_eq(got.n, 7 + 3);
	s = malloc(256);
	s[0] = '\0';
	for (size_t i = 0; i < got.n; i++) {
		const void *d;
		size_t len;
		ck_assert_int_eq(cachew_tensor_bytes_at(
				     cachew_element_component(got.v[i], 0), 0,
				     &d, &len),
		    CACHEW_OK);
		strncat(s, d, len);
		strcat(s, " ");
	}
	ck_assert_str_eq(s, "f3l0 f3l1 f3l2 f3l3 f3l4 f3l5 f3l6 f1l0 f1l1 f1l2 ");
	free(s);
	elems_free(&got);
	cwi_split_plan_destroy(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* ---- leases ---------------------------------------------------------------------- */

START_TEST(lease_reads_its_ranges_in_the_order_given)
{
	cwi_split_plan *p = plan_of("range(100, 110)");
	cwi_unit_range r[3] = {{6, 8}, {0, 2}, {9, 10}};
	elems got = {0};
	char *s;

	run_lease(p, r, 3, 1, &got);
	s = cwt_join_i64(got.v, got.n, 0);
	ck_assert_str_eq(s, "106,107,100,101,109");
	free(s);
	elems_free(&got);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(lease_without_ranges_yields_nothing)
{
	cwi_split_plan *p = plan_of("range(10) | batch(3)");
	elems got = {0};

	run_lease(p, NULL, 0, 1, &got);
	ck_assert_uint_eq(got.n, 0);
	elems_free(&got);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(lease_batches_end_at_the_lease_end)
{
	cwi_split_plan *p = plan_of("range(10) | batch(4)");
	cwi_unit_range r[2] = {{0, 5}, {7, 9}};
	elems got = {0};
	char *s;

	run_lease(p, r, 2, 1, &got);
	s = cwt_join_i64(got.v, got.n, 0);
	ck_assert_str_eq(s, "[0 1 2 3],[4 7 8]");
	free(s);
	elems_free(&got);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(lease_beyond_the_units_is_erange)
{
	cwi_split_plan *p = plan_of("range(10) | map(add)");
	cwi_unit_range r = {5, 12};
	cachew_iterator *it = NULL;
	cachew_err rv;

	rv = cwi_iterator_create_lease(&it, p->worker, NULL, p->source, &r, 1,
	    SEED);
	ck_assert_int_eq(rv, CACHEW_ERANGE);
	ck_assert_ptr_null(it);
	ck_assert_str_eq(cachew_errmsg(),
	    "range: split units [5, 12) are outside the source's 10 units "
	    "(did the input change since the plan?)");
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(lease_of_a_file_source_beyond_its_files_is_erange)
{
	char *dir = cwt_tmpdir(), pipeline[1024];
	cwi_unit_range r = {2, 6};
	cachew_iterator *it = NULL;
	cwi_split_plan *p;

	write_text_files(dir);
	snprintf(pipeline, sizeof(pipeline), "text_lines(\"%s/t*.txt\")", dir);
	p = plan_of(pipeline);
	ck_assert_int_eq(cwi_iterator_create_lease(&it, p->worker, NULL,
			     p->source, &r, 1, SEED),
	    CACHEW_ERANGE);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "text_lines: split units [2, 6) are outside the source's 5 units"));
	cwi_split_plan_destroy(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(lease_bad_arguments_are_einval)
{
	cwi_split_plan *p = plan_of("range(10) | map(add)");
	cwi_split_plan *q = plan_of("range(10)");
	cwi_unit_range back = {5, 2}, ok = {0, 2};
	cachew_iterator *it = NULL;

	ck_assert_int_eq(cwi_iterator_create_lease(&it, p->worker, NULL,
			     p->source, &back, 1, SEED),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(),
	    "lease: range 0 is [5, 2), which ends before it begins");
	/* The source of another graph. */
	ck_assert_int_eq(cwi_iterator_create_lease(&it, p->worker, NULL,
			     q->source, &ok, 1, SEED),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(),
	    "lease: the split source range is not a node of the pipeline");
	/* Not a source. */
	ck_assert_int_eq(cwi_iterator_create_lease(&it, p->worker, NULL,
			     p->worker, &ok, 1, SEED),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(), "lease: map is not splittable");
	ck_assert_ptr_null(it);
	cwi_split_plan_destroy(p);
	cwi_split_plan_destroy(q);
}
END_TEST

START_TEST(lease_seed_is_the_job_seed_from_unit_zero)
{
	cwi_unit_range a = {0, 5}, b = {5, 9}, c = {6, 9};

	ck_assert_uint_eq(cwi_split_lease_seed(42, NULL, 0), 42);
	ck_assert_uint_eq(cwi_split_lease_seed(42, &a, 1), 42);
	ck_assert_uint_ne(cwi_split_lease_seed(42, &b, 1), 42);
	ck_assert_uint_eq(cwi_split_lease_seed(42, &b, 1),
	    cwi_split_lease_seed(42, &b, 1));
	ck_assert_uint_ne(cwi_split_lease_seed(42, &b, 1),
	    cwi_split_lease_seed(42, &c, 1));
	ck_assert_uint_ne(cwi_split_lease_seed(42, &b, 1),
	    cwi_split_lease_seed(43, &b, 1));
}
END_TEST

/* Runs a lease twice at an epoch (1 and 4 threads) and checks the same
 * elements come in the same order; also that one lease of everything is
 * the plain run at that epoch. The lease's elements stay in *out when it
 * is not NULL. */
static void
check_replay_at(const char *pipeline, const cwi_unit_range *r, size_t n,
    uint64_t epoch, elems *out)
{
	cwi_split_plan *p = plan_of(pipeline);
	cwi_unit_range all = {0, p->units};
	elems a = {0}, b = {0}, plain = {0}, one = {0};

	run_lease_at(p, r, n, 1, epoch, &a);
	run_lease_at(p, r, n, 4, epoch, &b);
	ck_assert_uint_gt(a.n, 0);
	assert_same_sequence(&b, &a, pipeline);
	run_plain_at(pipeline, 3, epoch, &plain);
	run_lease_at(p, &all, 1, 3, epoch, &one);
	assert_same_sequence(&one, &plain, pipeline);
	if (out != NULL)
		*out = a;
	else
		elems_free(&a);
	elems_free(&b);
	elems_free(&plain);
	elems_free(&one);
	cwi_split_plan_destroy(p);
}

static void
check_replay(const char *pipeline, const cwi_unit_range *r, size_t n)
{
	check_replay_at(pipeline, r, n, 0, NULL);
}

START_TEST(lease_replays_identically_with_random_ops)
{
	cwi_unit_range r[2] = {{10, 25}, {30, 33}};

	check_replay("range(40) | map(uniform, parallel=3) | shuffle(8) | "
		     "map(uniform) | batch(4)",
	    r, 2);
}
END_TEST

/* A lease draws from the job's epoch (issue 20, item 2): replayed at one
 * epoch it yields the same elements (what exactly-once replays rely on),
 * at another epoch other draws and another order; one lease of everything
 * is the plain run at the same epoch. */
START_TEST(lease_replays_identically_at_its_epoch)
{
	static const char *const pipeline =
	    "range(40) | map(uniform, parallel=3) | shuffle(8) | "
	    "map(uniform) | batch(4)";
	cwi_unit_range r[2] = {{10, 25}, {30, 33}};
	elems e1 = {0}, e2 = {0};

	check_replay_at(pipeline, r, 2, 1, &e1);
	check_replay_at(pipeline, r, 2, 2, &e2);
	ck_assert_msg(!same_sequence(&e1, &e2),
	    "epochs 1 and 2 of a lease yield the same");
	elems_free(&e1);
	elems_free(&e2);
}
END_TEST

START_TEST(lease_replays_random_resized_crop_of_images)
{
	char *dir = cwt_tmpdir(), pipeline[1024], err[256];
	cwi_gen_imagenet_config cfg = {.out_dir = dir, .images = 6,
	    .shards = 3, .seed = 5, .width = 64, .height = 48,
	    .quality = 90};
	cwi_unit_range r = {1, 3};

	ck_assert_int_eq(cwi_gen_imagenet(&cfg, NULL, err, sizeof(err)),
	    CACHEW_OK);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/train-*.tfrecord\") | "
	    "interleave(tfrecord, cycle=2) | "
	    "parse_example(image=\"image/encoded:bytes\", "
	    "label=\"image/class/label:i64\") | "
	    "random_resized_crop(size=16, parallel=2) | shuffle(3)",
	    dir);
	check_replay(pipeline, &r, 1);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(leases_draw_different_random_streams)
{
	/* range(8) | map(uniform): element index restarts in each lease,
	 * the lease seed keeps two leases' draws apart. */
	cwi_split_plan *p = plan_of("range(8) | map(uniform)");
	cwi_unit_range a = {0, 4}, b = {4, 8};
	elems x = {0}, y = {0};

	run_lease(p, &a, 1, 1, &x);
	run_lease(p, &b, 1, 1, &y);
	ck_assert_uint_eq(x.n, 4);
	ck_assert_uint_eq(y.n, 4);
	for (size_t i = 0; i < 4; i++)
		ck_assert(cwt_f64(x.v[i], 1) != cwt_f64(y.v[i], 1));
	elems_free(&x);
	elems_free(&y);
	cwi_split_plan_destroy(p);
}
END_TEST

/* ---- plans ---------------------------------------------------------------------- */

START_TEST(plan_range_map_batch_runs_on_workers)
{
	cwi_split_plan *p = plan_of("range(10) | map(add) | batch(3)");
	cachew_fingerprint fp;

	ck_assert_str_eq(p->source->op->name, "range");
	ck_assert_uint_eq(p->units, 10);
	ck_assert_str_eq(p->unit_kind, "elements");
	ck_assert_ptr_eq(p->worker, p->root);
	ck_assert_ptr_null(p->boundary);
	ck_assert_uint_eq(p->nworker, 3);
	ck_assert_uint_eq(p->nclient, 0);
	ck_assert_int_eq(cachew_dataset_fingerprint(p->root, &fp), CACHEW_OK);
	ck_assert(fp.hi == p->worker_fp.hi && fp.lo == p->worker_fp.lo);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(plan_list_files_interleave_tfrecord_map_batch)
{
	char *dir = cwt_tmpdir(), pipeline[1024];
	cwi_split_plan *p;

	write_tfrecord_files(dir);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/*.tfrecord\") | interleave(tfrecord, cycle=2) | "
	    "map(identity) | shuffle(16) | batch(4) | prefetch(auto)",
	    dir);
	p = plan_of(pipeline);
	ck_assert_str_eq(p->source->op->name, "list_files");
	ck_assert_uint_eq(p->units, 4);
	ck_assert_str_eq(p->unit_kind, "files");
	ck_assert_ptr_eq(p->worker, p->root);
	ck_assert_uint_eq(p->nworker, 6);
	ck_assert_uint_eq(p->nclient, 0);
	cwi_split_plan_destroy(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(plan_take_runs_on_the_client)
{
	cwi_split_plan *p = plan_of("range(10) | map(add) | take(5)");
	cachew_fingerprint fp;
	cwi_node *client = NULL;
	char *s = NULL, want[256], hex[33];

	ck_assert_str_eq(p->source->op->name, "range");
	ck_assert_str_eq(p->worker->op->name, "map");
	ck_assert_str_eq(p->boundary->op->name, "take");
	ck_assert_str_eq(p->why, "selects by position in the whole stream");
	ck_assert_uint_eq(p->nworker, 2);
	ck_assert_uint_eq(p->nclient, 1);
	ck_assert_int_eq(cachew_dataset_fingerprint(p->worker, &fp), CACHEW_OK);
	ck_assert(fp.hi == p->worker_fp.hi && fp.lo == p->worker_fp.lo);
	/* The client part: the placeholder and take, with take's
	 * fingerprint unchanged. */
	ck_assert_int_eq(cwi_split_client_graph(p, NULL, &client), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(client, &s), CACHEW_OK);
	cachew_fingerprint_hex(&p->worker_fp, hex);
	/* The hex prints bare when it reads as an identifier. */
	snprintf(want, sizeof(want), "service_stream(fingerprint=%s%s%s) | "
	    "take(n=5)", hex[0] > '9' ? "" : "\"", hex,
	    hex[0] > '9' ? "" : "\"");
	ck_assert_str_eq(s, want);
	ck_assert(cwi_node_fp(client)->hi == cwi_node_fp(p->root)->hi &&
	    cwi_node_fp(client)->lo == cwi_node_fp(p->root)->lo);
	ck_assert(client->seed_fp.hi == p->root->seed_fp.hi &&
	    client->seed_fp.lo == p->root->seed_fp.lo);
	cachew_free(s);
	cachew_dataset_release(client);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(plan_everything_after_a_client_op_runs_on_the_client)
{
	cwi_split_plan *p =
	    plan_of("range(10) | skip(2) | map(add) | batch(2) | repeat(2)");
	cwi_node *client = NULL;
	char *s = NULL;

	ck_assert_ptr_eq(p->worker, p->source);
	ck_assert_str_eq(p->boundary->op->name, "skip");
	ck_assert_uint_eq(p->nworker, 1);
	ck_assert_uint_eq(p->nclient, 4);
	ck_assert_int_eq(cwi_split_client_graph(p, NULL, &client), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(client, &s), CACHEW_OK);
	/* The fingerprint prints quoted or not (it may start with a digit). */
	ck_assert_ptr_nonnull(strstr(s, ") | skip(n=2) | map(add, "));
	ck_assert_ptr_nonnull(strstr(s, ") | batch(n=2, drop_remainder=false) "
					 "| repeat(count=2)"));
	ck_assert(cwi_node_fp(client)->hi == cwi_node_fp(p->root)->hi &&
	    cwi_node_fp(client)->lo == cwi_node_fp(p->root)->lo);
	cachew_free(s);
	cachew_dataset_release(client);
	cwi_split_plan_destroy(p);
}
END_TEST

/* A pipeline whose top chain ends at a join has no split source: the join
 * and what is below it are one unit, the worker part runs whole. */
START_TEST(plan_zip_of_two_sources_runs_whole)
{
	cwi_split_plan *p =
	    plan_of("zip(range(3), range(4) | map(add)) | batch(2)");

	ck_assert_ptr_null(p->source);
	ck_assert_uint_eq(p->units, 1);
	ck_assert_str_eq(p->unit_kind, "pipeline");
	ck_assert_ptr_eq(p->worker, p->root); /* batch runs per lease */
	ck_assert_ptr_null(p->boundary);
	ck_assert_uint_eq(p->nworker, 2);
	ck_assert_str_eq(p->whole,
	    "the pipeline has 2 sources (range, range) joined by zip");
	cwi_split_plan_destroy(p);
	p = plan_of("range(3) | concatenate(from_list([1])) | map(add) | "
		    "take(2) | batch(2)");
	ck_assert_ptr_null(p->source);
	ck_assert_str_eq(p->worker->op->name, "map");
	ck_assert_str_eq(p->boundary->op->name, "take");
	ck_assert_uint_eq(p->nworker, 2);
	ck_assert_uint_eq(p->nclient, 2);
	ck_assert_str_eq(p->whole,
	    "the pipeline has 2 sources (range, from_list) joined by "
	    "concatenate");
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(plan_source_read_twice_runs_whole)
{
	cachew_dataset *r = NULL, *z = NULL, *in[2];
	cwi_split_plan *p = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&r, "range(3)"), CACHEW_OK);
	in[0] = in[1] = r;
	ck_assert_int_eq(cachew_dataset_apply(&z, "zip", in, 2, NULL),
	    CACHEW_OK);
	ck_assert_int_eq(cwi_split_plan_create(&p, z), CACHEW_OK);
	ck_assert_ptr_null(p->source);
	ck_assert_str_eq(p->whole,
	    "zip reads the source range through several inputs");
	cwi_split_plan_destroy(p);
	cachew_dataset_release(z);
	cachew_dataset_release(r);
}
END_TEST

START_TEST(plan_of_a_source_that_cannot_be_split_runs_whole)
{
	cwi_split_plan *p = plan_of("range(10) | take(5)");
	cwi_split_plan *q = NULL;
	cwi_node *client = NULL;

	ck_assert_int_eq(cwi_split_client_graph(p, NULL, &client), CACHEW_OK);
	ck_assert_int_eq(cwi_split_plan_create(&q, client), CACHEW_OK);
	ck_assert_ptr_null(q->source);
	ck_assert_str_eq(q->worker->op->name, "service_stream");
	ck_assert_str_eq(q->boundary->op->name, "take");
	ck_assert_str_eq(q->whole,
	    "the source service_stream is not splittable");
	cwi_split_plan_destroy(q);
	cachew_dataset_release(client);
	cwi_split_plan_destroy(p);
}
END_TEST

/* Its worker part plans to itself, so a worker that plans the graph it
 * gets agrees with the client. */
START_TEST(plan_of_a_whole_worker_part_is_itself)
{
	cwi_split_plan *p = plan_of("zip(range(5), range(5)) | map(add) | "
				    "take(3)");
	cwi_split_plan *q = NULL;

	ck_assert_int_eq(cwi_split_plan_create(&q, p->worker), CACHEW_OK);
	ck_assert_ptr_null(q->source);
	ck_assert_ptr_eq(q->worker, p->worker);
	ck_assert_ptr_null(q->boundary);
	ck_assert_uint_eq(q->units, 1);
	cwi_split_plan_destroy(q);
	cwi_split_plan_destroy(p);
}
END_TEST

/* A lease of unit 0 runs a plan without a split source whole: the
 * in-process run, with the job's seed; no unit yields nothing; anything
 * past unit 0 is ERANGE. */
START_TEST(lease_without_a_split_source_is_the_whole_pipeline)
{
	static const char *const pipelines[] = {
	    "zip(range(10), range(10) | map(uniform)) | shuffle(4)",
	    "range(5) | concatenate(range(3) | map(add)) | batch(3)",
	};
	cwi_unit_range unit = {0, 1}, two[2] = {{0, 1}, {0, 1}}, past = {0, 2};
	cachew_iterator *it = NULL;

	for (size_t i = 0; i < 2; i++) {
		cwi_split_plan *p = plan_of(pipelines[i]);
		elems got = {0}, plain = {0}, none = {0};
		run_lease(p, &unit, 1, 2, &got);
		run_plain(pipelines[i], 2, &plain);
		assert_same_sequence(&got, &plain, pipelines[i]);
		run_lease(p, NULL, 0, 1, &none);
		ck_assert_uint_eq(none.n, 0);
		ck_assert_int_eq(cwi_iterator_create_lease(&it, p->worker,
				     NULL, NULL, &past, 1, SEED),
		    CACHEW_ERANGE);
		ck_assert_str_eq(cachew_errmsg(),
		    "lease: range 0 is [0, 2), but a pipeline without a split "
		    "source is one unit, [0, 1)");
		ck_assert_int_eq(cwi_iterator_create_lease(&it, p->worker,
				     NULL, NULL, two, 2, SEED),
		    CACHEW_ERANGE);
		ck_assert_str_eq(cachew_errmsg(),
		    "lease: the ranges name unit 0 2 times, but a pipeline "
		    "without a split source runs once per lease");
		ck_assert_ptr_null(it);
		elems_free(&got);
		elems_free(&plain);
		cwi_split_plan_destroy(p);
	}
}
END_TEST

START_TEST(plan_of_the_worker_part_is_itself)
{
	cwi_split_plan *p = plan_of("range(20) | map(add) | shard(2, 0) | batch(2)");
	cwi_split_plan *q = NULL;

	ck_assert_int_eq(cwi_split_plan_create(&q, p->worker), CACHEW_OK);
	ck_assert_ptr_eq(q->worker, p->worker);
	ck_assert_ptr_eq(q->source, p->source);
	ck_assert_ptr_null(q->boundary);
	ck_assert_uint_eq(q->units, p->units);
	cwi_split_plan_destroy(q);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(plan_writers_and_position_ops_run_on_the_client)
{
	char *dir = cwt_tmpdir(), pipeline[1024];
	cwi_split_plan *p;

	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/*\") | read_file | "
	    "tfrecord_write(\"%s/out.tfrecord\")",
	    dir, dir);
	write_text_files(dir);
	p = plan_of(pipeline);
	ck_assert_str_eq(p->worker->op->name, "map");
	ck_assert_str_eq(p->boundary->op->name, "tfrecord_write");
	ck_assert_str_eq(p->why, "writes one file of the whole input");
	cwi_split_plan_destroy(p);
	p = plan_of("range(4) | enumerate | map(add)");
	ck_assert_str_eq(p->boundary->op->name, "enumerate");
	ck_assert_str_eq(p->why, "numbers the elements of the whole stream");
	ck_assert_uint_eq(p->nclient, 2);
	cwi_split_plan_destroy(p);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(plan_describe_names_both_parts)
{
	cwi_split_plan *p = plan_of("range(10) | map(add) | take(5)");
	cwi_strbuf sb;
	char hex[33], want[1024];

	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_split_plan_describe(p, &sb), CACHEW_OK);
	cachew_fingerprint_hex(&p->worker_fp, hex);
	snprintf(want, sizeof(want),
	    "split source: range (10 elements)\n"
	    "worker part:  range(start=0, stop=10, step=1) | map(add, "
	    "parallel=1, deterministic=true)  fp=%s\n"
	    "client part:  service_stream(fingerprint=%s%s%s) | take(n=5)\n"
	    "boundary:     take selects by position in the whole stream\n",
	    hex, hex[0] > '9' ? "" : "\"", hex, hex[0] > '9' ? "" : "\"");
	ck_assert_str_eq(sb.data, want);
	cwi_strbuf_free(&sb);
	cwi_split_plan_destroy(p);
}
END_TEST

/* ---- the client tail ---------------------------------------------------- */

static cwi_split_plan *
tail_plan_of(const char *pipeline)
{
	return plan_of_for(pipeline, CWI_SPLIT_CLIENT_TAIL);
}

#define TAIL_NORMALIZE "normalize(mean=[0.5], std=[0.25])"

/* W2's shape: the workers stop at the u8 batch (stitched across leases),
 * the client widens; every node keeps its fingerprint. */
START_TEST(plan_client_tail_moves_a_widening_top)
{
	const char *pipeline = "range(40, output_type=\"u8\") | batch(4) | "
	    TAIL_NORMALIZE " | prefetch(2) | take(9)";
	cwi_split_plan *p = tail_plan_of(pipeline), *q = plan_of(pipeline);
	cwi_node *client = NULL;
	cachew_fingerprint fp;

	ck_assert_uint_eq(p->ncandidate, 2);
	ck_assert_uint_eq(p->ntail, 2);
	ck_assert_str_eq(p->worker->op->name, "batch");
	ck_assert_uint_eq(p->nworker, 2);
	ck_assert_uint_eq(p->nclient, 3);
	ck_assert_str_eq(p->boundary->op->name, "take");
	ck_assert_str_eq(p->tail_why, "map(normalize): u8 -> f32 (component 0)");
	ck_assert_uint_eq(p->ngroups, 1);
	ck_assert_ptr_eq(p->groups[0], p->worker);
	ck_assert_int_eq(cachew_dataset_fingerprint(p->worker, &fp), CACHEW_OK);
	ck_assert(fp.hi == p->worker_fp.hi && fp.lo == p->worker_fp.lo);
	ck_assert_int_eq(cwi_split_client_graph(p, NULL, &client), CACHEW_OK);
	ck_assert_str_eq(client->op->name, "take");
	ck_assert_str_eq(client->inputs[0]->inputs[0]->detail, "normalize");
	ck_assert(memcmp(cwi_node_fp(client), cwi_node_fp(p->root),
		      sizeof(cachew_fingerprint)) == 0);
	ck_assert(memcmp(&client->seed_fp, &p->root->seed_fp,
		      sizeof(cachew_fingerprint)) == 0);
	cachew_dataset_release(client);
	/* Not asked for (the embedded service, a worker's own plan): the
	 * candidate is known, nothing moves. */
	ck_assert_uint_eq(q->ncandidate, 2);
	ck_assert_uint_eq(q->ntail, 0);
	ck_assert_str_eq(q->worker->op->name, "prefetch");
	ck_assert_uint_eq(q->nclient, 1);
	cwi_split_plan_destroy(p);
	cwi_split_plan_destroy(q);
	/* A cast to a wider dtype moves too, with the normalize above it. */
	p = tail_plan_of("range(8, output_type=\"u8\") | batch(4) | "
			 "map(cast, dtype=\"f64\")");
	ck_assert_uint_eq(p->ntail, 1);
	ck_assert_str_eq(p->tail_why, "map(cast): u8 -> f64 (component 0)");
	cwi_split_plan_destroy(p);
}
END_TEST

/* What must stay on the workers: a run not at the top (a per-lease
 * operator above it would have to move and would then see the whole
 * stream instead of a lease), what does not widen, what is random or not
 * built in, and the widening that is the workers' real work. */
START_TEST(plan_client_tail_stays_where_it_must)
{
	static const char *const stays[] = {
	    "range(40, output_type=\"u8\") | batch(4) | " TAIL_NORMALIZE
	    " | shuffle(3, seed=1)",
	    "range(40, output_type=\"u8\") | batch(2) | " TAIL_NORMALIZE
	    " | batch(4)",
	    "range(40, output_type=\"u8\") | batch(2) | " TAIL_NORMALIZE
	    " | map(add, value=1)",
	    "range(40, output_type=\"f32\") | batch(4) | " TAIL_NORMALIZE,
	    "range(40) | map(cast, dtype=\"u8\")",
	    "range(40, output_type=\"u8\") | map(cast, dtype=\"bool\")",
	    "range(40) | map(uniform)",
	    "range(40, output_type=\"u8\") | prefetch(2)",
	    "range(40, output_type=\"u8\") | batch(4) | map(add)",
	};

	for (size_t i = 0; i < sizeof(stays) / sizeof(stays[0]); i++) {
		cwi_split_plan *p = tail_plan_of(stays[i]);
		ck_assert_msg(p->ncandidate == 0 && p->ntail == 0 &&
			p->worker == p->root && p->tail_why[0] == '\0',
		    "%s: %zu operators moved (%s)", stays[i], p->ntail,
		    p->tail_why);
		cwi_split_plan_destroy(p);
	}
}
END_TEST

START_TEST(split_explain_shows_the_client_tail)
{
	cachew_dataset *ds = NULL;
	cwi_strbuf sb;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "range(40, output_type=\"u8\") | batch(4) | "
			     TAIL_NORMALIZE),
	    CACHEW_OK);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_split_explain(ds, &sb), CACHEW_OK);
	ck_assert_msg(strstr(sb.data, "worker part:  range(start=0, stop=40, "
				      "step=1, output_type=u8) | batch(n=4, "
				      "drop_remainder=false)  fp=") != NULL &&
		strstr(sb.data, ") | map(normalize, parallel=1, "
				"deterministic=true, mean=[0.5], "
				"std=[0.25])\n") != NULL &&
		strstr(sb.data, "\nclient tail:  map(normalize): u8 -> f32 "
				"(component 0) runs on the client over a "
				"remote service (client_tail=auto)") != NULL &&
		strstr(sb.data, "boundary:") == NULL,
	    "got '%s'", sb.data);
	cwi_strbuf_free(&sb);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(split_explain_says_why_a_pipeline_is_not_split)
{
	cachew_dataset *ds = NULL;
	const char *want;
	cwi_strbuf sb;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "text_lines(\"/nonexistent-cachew/*.txt\")"),
	    CACHEW_OK);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_split_explain(ds, &sb), CACHEW_OK);
	ck_assert_str_eq(sb.data,
	    "split: text_lines: no files match '/nonexistent-cachew/*.txt'\n");
	cwi_strbuf_free(&sb);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_parse(&ds, "zip(range(3), range(4))"),
	    CACHEW_OK);
	cwi_strbuf_init(&sb);
	ck_assert_int_eq(cwi_split_explain(ds, &sb), CACHEW_OK);
	want = "split source: none, the worker part runs whole as one unit "
	       "(the pipeline has 2 sources (range, range) joined by zip)\n"
	       "worker part:  range(start=0, stop=3, step=1) | "
	       "zip(range(start=0, stop=4, step=1))  fp=";
	ck_assert_msg(strncmp(sb.data, want, strlen(want)) == 0, "got '%s'",
	    sb.data);
	ck_assert_ptr_nonnull(strstr(sb.data, "\nclient part:  none\n"));
	cwi_strbuf_free(&sb);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(split_group_cuts_contiguous_even_splits)
{
	cwi_unit_range *r = NULL;
	size_t n = 0;

	ck_assert_int_eq(cwi_split_group(10, 3, &r, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(r[0].begin, 0);
	ck_assert_uint_eq(r[0].end, 4);
	ck_assert_uint_eq(r[1].begin, 4);
	ck_assert_uint_eq(r[1].end, 7);
	ck_assert_uint_eq(r[2].begin, 7);
	ck_assert_uint_eq(r[2].end, 10);
	free(r);
	ck_assert_int_eq(cwi_split_group(2, 5, &r, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(r[1].begin, 1);
	ck_assert_uint_eq(r[1].end, 2);
	free(r);
	ck_assert_int_eq(cwi_split_group(0, 5, &r, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 0);
	ck_assert_ptr_null(r);
	ck_assert_int_eq(cwi_split_group(5, 0, &r, &n), CACHEW_EINVAL);
}
END_TEST

/* ---- the client part over the stream ---------------------------------------------- */

/* A stream that replays the concatenated output of the leases (new
 * references), recording the epochs it was opened at. */
typedef struct test_stream_ctx {
	elems *data;
	uint64_t epochs[8];
	size_t nopen;
	cachew_err fail_with; /* after the first element, if set */
} test_stream_ctx;

typedef struct test_stream {
	test_stream_ctx *ctx;
	size_t pos;
} test_stream;

static cachew_err
ts_open(void *ctx, uint64_t epoch, void **stream, char *err, size_t errlen)
{
	test_stream_ctx *c = ctx;
	test_stream *s;

	if (c->nopen == 8) {
		snprintf(err, errlen, "opened too often");
		return CACHEW_EINVAL;
	}
	c->epochs[c->nopen++] = epoch;
	s = calloc(1, sizeof(*s));
	ck_assert_ptr_nonnull(s);
	s->ctx = c;
	*stream = s;
	return CACHEW_OK;
}

static cachew_err
ts_next(void *stream, cwi_chunk *out, size_t max, char *err, size_t errlen)
{
	test_stream *s = stream;
	size_t got = 0;

	if (s->ctx->fail_with != CACHEW_OK && s->pos == 1) {
		snprintf(err, errlen, "worker 127.0.0.1:7071 went away");
		return s->ctx->fail_with;
	}
	while (got < max && s->pos < s->ctx->data->n) {
		cwi_chunk_push(out,
		    cachew_element_retain(s->ctx->data->v[s->pos++]));
		got++;
		if (s->ctx->fail_with != CACHEW_OK)
			break;
	}
	return got > 0 ? CACHEW_OK : CACHEW_EOF;
}

static void
ts_close(void *stream)
{
	free(stream);
}

static const cwi_stream_ops test_stream_ops = {
    .open = ts_open,
    .next = ts_next,
    .close = ts_close,
};

/* Runs the worker part per lease (leases in unit order, random sizes),
 * concatenates their output and runs the client part over it. */
static void
run_split(const char *pipeline, uint64_t grouping, elems *out,
    test_stream_ctx *ctx)
{
	cwi_split_plan *p = plan_of(pipeline);
	cwi_stream_source src = {&test_stream_ops, ctx};
	uint64_t s = grouping * 0x9e3779b97f4a7c15ULL + 1;
	cachew_options *o = cwt_opts(SEED, 2);
	cachew_iterator *it = NULL;
	cwi_node *client = NULL;
	elems *stream = calloc(1, sizeof(*stream));

	ck_assert_ptr_nonnull(stream);
	for (uint64_t at = 0; at < p->units;) {
		uint64_t size = 1 + next_rand(&s) % 7;
		cwi_unit_range r = {at, at + size < p->units ? at + size
							     : p->units};
		run_lease(p, &r, 1, 2, stream);
		at = r.end;
	}
	ctx->data = stream;
	ck_assert_int_eq(cwi_split_client_graph(p, &src, &client), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, client, o), CACHEW_OK);
	drain(it, out);
	cachew_iterator_destroy(it);
	cachew_dataset_release(client);
	cachew_options_destroy(o);
	elems_free(stream);
	free(stream);
	cwi_split_plan_destroy(p);
}

static void
check_client(const char *pipeline)
{
	elems plain = {0};

	run_plain(pipeline, 2, &plain);
	for (uint64_t g = 1; g <= 3; g++) {
		test_stream_ctx ctx = {0};
		elems got = {0};
		run_split(pipeline, g, &got, &ctx);
		assert_same_multiset(&got, &plain, pipeline);
		ck_assert_uint_eq(ctx.nopen, 1);
		elems_free(&got);
	}
	elems_free(&plain);
}

START_TEST(client_take_and_skip_match_the_in_process_run)
{
	check_client("range(50) | map(add, value=1) | take(17)");
	check_client("range(50) | filter(split_test_not3) | skip(5) | take(10)");
	check_client("range(30) | flat_map(split_test_twice) | skip(7)");
	check_client("range(40) | map(add) | shard(3, 1) | take(6)");
	check_client("range(12) | take(9) | batch(4)");
}
END_TEST

START_TEST(client_take_over_text_lines_matches_the_in_process_run)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	write_text_files(dir);
	snprintf(pipeline, sizeof(pipeline),
	    "text_lines(\"%s/t*.txt\") | skip(3) | take(12)", dir);
	check_client(pipeline);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(client_repeat_opens_the_stream_per_epoch)
{
	const char *pipeline = "range(6) | map(add) | repeat(3) | take(14)";
	test_stream_ctx ctx = {0};
	elems got = {0}, plain = {0};

	run_plain(pipeline, 2, &plain);
	run_split(pipeline, 1, &got, &ctx);
	assert_same_multiset(&got, &plain, pipeline);
	ck_assert_uint_eq(ctx.nopen, 3);
	ck_assert_uint_eq(ctx.epochs[0], 0);
	ck_assert_uint_eq(ctx.epochs[1], 1);
	ck_assert_uint_eq(ctx.epochs[2], 2);
	elems_free(&got);
	elems_free(&plain);
}
END_TEST

/* One lease of every unit through the worker part, then the client part
 * over its stream: what the embedded default does with one worker. It must
 * be the plain run, element for element, random operators included (the
 * client part keeps the seeds it has in the whole pipeline). */
static void
check_one_lease_is_the_plain_run(const char *pipeline)
{
	cwi_split_plan *p = plan_of(pipeline);
	cwi_unit_range all = {0, p->units};
	test_stream_ctx ctx = {0};
	cwi_stream_source src = {&test_stream_ops, &ctx};
	cachew_options *o = cwt_opts(SEED, 2);
	elems stream = {0}, got = {0}, plain = {0};
	cachew_iterator *it = NULL;
	cwi_node *client = NULL;

	run_lease(p, &all, 1, 2, &stream);
	ctx.data = &stream;
	ck_assert_int_eq(cwi_split_client_graph(p, &src, &client), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, client, o), CACHEW_OK);
	drain(it, &got);
	run_plain(pipeline, 2, &plain);
	assert_same_sequence(&got, &plain, pipeline);
	cachew_iterator_destroy(it);
	cachew_dataset_release(client);
	cachew_options_destroy(o);
	elems_free(&stream);
	elems_free(&got);
	elems_free(&plain);
	cwi_split_plan_destroy(p);
}

START_TEST(client_after_one_lease_is_the_plain_run)
{
	char *dir = cwt_tmpdir(), pipeline[1024];

	check_one_lease_is_the_plain_run(
	    "range(30) | map(add) | take(20) | shuffle(5)");
	check_one_lease_is_the_plain_run("range(40) | map(uniform) | "
					 "shuffle(8) | skip(3) | map(uniform) | "
					 "batch(4)");
	write_text_files(dir);
	snprintf(pipeline, sizeof(pipeline),
	    "list_files(\"%s/t*.txt\") | interleave(text_lines, cycle=2) | "
	    "shuffle(4) | enumerate | shuffle(6) | take(15)",
	    dir);
	check_one_lease_is_the_plain_run(pipeline);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* The client part over the stream of the whole worker part (take, skip,
 * repeat on the client) is the in-process run. */
START_TEST(client_over_a_whole_worker_part_is_the_plain_run)
{
	check_one_lease_is_the_plain_run(
	    "zip(range(20), range(20) | map(uniform)) | shuffle(5) | take(12) "
	    "| map(uniform)");
	check_one_lease_is_the_plain_run(
	    "range(7) | concatenate(range(9) | map(add)) | skip(2) | batch(4)");
	check_client("zip(range(30), range(30)) | map(add) | take(17)");
}
END_TEST

START_TEST(client_stream_error_ends_the_iterator_with_its_reason)
{
	cwi_split_plan *p = plan_of("range(10) | take(5)");
	test_stream_ctx ctx = {0};
	cwi_stream_source src = {&test_stream_ops, &ctx};
	elems stream = {0};
	cachew_iterator *it = NULL;
	cachew_element *e = NULL;
	cwi_node *client = NULL;
	cwi_unit_range all = {0, 10};

	run_lease(p, &all, 1, 1, &stream);
	ctx.data = &stream;
	ctx.fail_with = CACHEW_EIO;
	ck_assert_int_eq(cwi_split_client_graph(p, &src, &client), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, client, NULL), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
	ck_assert_int_eq(cwt_i64(e, 0), 0);
	cachew_element_release(e);
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EIO);
	ck_assert_str_eq(cachew_iterator_errmsg(it),
	    "worker 127.0.0.1:7071 went away");
	cachew_iterator_destroy(it);
	cachew_dataset_release(client);
	elems_free(&stream);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(client_graph_without_a_stream_cannot_run)
{
	cwi_split_plan *p = plan_of("range(10) | take(5)");
	cachew_iterator *it = NULL;
	cwi_node *client = NULL;

	ck_assert_int_eq(cwi_split_client_graph(p, NULL, &client), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, client, NULL),
	    CACHEW_EINVAL);
	ck_assert_str_eq(cachew_errmsg(),
	    "service_stream: no stream is attached (the client part was "
	    "built for printing only)");
	cachew_dataset_release(client);
	cwi_split_plan_destroy(p);
}
END_TEST

START_TEST(service_stream_is_not_a_registered_operator)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "service_stream(fingerprint=\"00\")"),
	    CACHEW_ENOENT);
	ck_assert_ptr_null(ds);
}
END_TEST

Suite *
cwt_split_suite(void)
{
	Suite *s = suite_create("split");
	TCase *src = tcase_create("sources");
	TCase *leases = tcase_create("leases");
	TCase *plan = tcase_create("plan");
	TCase *client = tcase_create("client");

	tcase_add_checked_fixture(src, setup, NULL);
	tcase_add_test(src, range_splits_by_element);
	tcase_add_test(src, range_units_count_without_overflow);
	tcase_add_test(src, range_leases_span_the_int64_domain);
	tcase_add_test(src, from_list_and_from_tensors_split_by_item);
	tcase_add_test(src, list_files_splits_by_file);
	tcase_add_test(src, list_files_leases_walk_the_epochs_file_order);
	tcase_add_test(src, text_lines_splits_by_file);
	tcase_add_test(src, fixed_length_records_split_by_file);
	tcase_add_test(src, tfrecord_splits_by_file);
	tcase_add_test(src, interleave_over_list_files_splits_by_file);
	tcase_add_test(src, interleave_reads_only_the_leased_files);
	tcase_set_timeout(src, 60);
	suite_add_tcase(s, src);

	tcase_add_checked_fixture(leases, setup, NULL);
	tcase_add_test(leases, lease_reads_its_ranges_in_the_order_given);
	tcase_add_test(leases, lease_without_ranges_yields_nothing);
	tcase_add_test(leases, lease_batches_end_at_the_lease_end);
	tcase_add_test(leases, lease_beyond_the_units_is_erange);
	tcase_add_test(leases, lease_of_a_file_source_beyond_its_files_is_erange);
	tcase_add_test(leases, lease_bad_arguments_are_einval);
	tcase_add_test(leases, lease_without_a_split_source_is_the_whole_pipeline);
	tcase_add_test(leases, lease_seed_is_the_job_seed_from_unit_zero);
	tcase_add_test(leases, lease_replays_identically_with_random_ops);
	tcase_add_test(leases, lease_replays_identically_at_its_epoch);
	tcase_add_test(leases, lease_replays_random_resized_crop_of_images);
	tcase_add_test(leases, leases_draw_different_random_streams);
	tcase_set_timeout(leases, 60);
	suite_add_tcase(s, leases);

	tcase_add_checked_fixture(plan, setup, NULL);
	tcase_add_test(plan, plan_range_map_batch_runs_on_workers);
	tcase_add_test(plan, plan_list_files_interleave_tfrecord_map_batch);
	tcase_add_test(plan, plan_take_runs_on_the_client);
	tcase_add_test(plan, plan_everything_after_a_client_op_runs_on_the_client);
	tcase_add_test(plan, plan_zip_of_two_sources_runs_whole);
	tcase_add_test(plan, plan_source_read_twice_runs_whole);
	tcase_add_test(plan, plan_of_a_source_that_cannot_be_split_runs_whole);
	tcase_add_test(plan, plan_of_the_worker_part_is_itself);
	tcase_add_test(plan, plan_of_a_whole_worker_part_is_itself);
	tcase_add_test(plan, plan_writers_and_position_ops_run_on_the_client);
	tcase_add_test(plan, plan_describe_names_both_parts);
	tcase_add_test(plan, plan_client_tail_moves_a_widening_top);
	tcase_add_test(plan, plan_client_tail_stays_where_it_must);
	tcase_add_test(plan, split_explain_shows_the_client_tail);
	tcase_add_test(plan, split_explain_says_why_a_pipeline_is_not_split);
	tcase_add_test(plan, split_group_cuts_contiguous_even_splits);
	suite_add_tcase(s, plan);

	tcase_add_checked_fixture(client, setup, NULL);
	tcase_add_test(client, client_take_and_skip_match_the_in_process_run);
	tcase_add_test(client, client_take_over_text_lines_matches_the_in_process_run);
	tcase_add_test(client, client_repeat_opens_the_stream_per_epoch);
	tcase_add_test(client, client_after_one_lease_is_the_plain_run);
	tcase_add_test(client, client_over_a_whole_worker_part_is_the_plain_run);
	tcase_add_test(client, client_stream_error_ends_the_iterator_with_its_reason);
	tcase_add_test(client, client_graph_without_a_stream_cannot_run);
	tcase_add_test(client, service_stream_is_not_a_registered_operator);
	tcase_set_timeout(client, 60);
	suite_add_tcase(s, client);
	return s;
}
