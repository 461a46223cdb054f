/*
 * check_usersrc.c - user sources (cachew_source_register, tf.data's
 * from_generator as C callbacks): registered from C and from a plugin,
 * run in-process, through service=embedded and through real worker
 * processes that load the plugin, with their specs, checks, refusals and
 * saved positions.
 */
#include "cwt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a source registered from C ------------------------------------------- */

/* tally(n=3, splits=2, bad=-1): split s yields s * 100 + k for k < n, an
 * i64 scalar; element `bad` of split 1 is an f64 (a broken promise), and
 * fail_split makes that split's open fail. */
typedef struct tally_state {
	int64_t n, splits, bad, fail_split;
} tally_state;

typedef struct tally_seq {
	int64_t split, k, n, bad;
} tally_seq;

static cachew_err
tally_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	tally_state *st = calloc(1, sizeof(*st));
	static const char *const keys[] = {"n", "splits", "bad", "fail_split"};
	int64_t *vals[4];

	if (st == NULL)
		return CACHEW_ENOMEM;
	st->n = 3;
	st->splits = 2;
	st->bad = -1;
	st->fail_split = -1;
	vals[0] = &st->n;
	vals[1] = &st->splits;
	vals[2] = &st->bad;
	vals[3] = &st->fail_split;
	for (size_t i = 0; i < cachew_params_count(params); i++) {
		const char *k = cachew_params_key(params, i);
		size_t j = 0;
		while (j < 4 && strcmp(k, keys[j]) != 0)
			j++;
		if (j == 4 || cachew_params_get_int(params, k, vals[j]) !=
		    CACHEW_OK) {
			snprintf(err, errlen, "bad parameter '%s'", k);
			free(st);
			return CACHEW_EINVAL;
		}
	}
	*state = st;
	return CACHEW_OK;
}

static void
tally_fini(void *state)
{
	free(state);
}

static cachew_err
tally_splits(void *state, uint64_t *n, char *err, size_t errlen)
{
	const tally_state *st = state;

	if (st->splits < 0) {
		snprintf(err, errlen, "splits is negative");
		return CACHEW_EINVAL;
	}
	*n = (uint64_t)st->splits;
	return CACHEW_OK;
}

static cachew_err
tally_open(cachew_op_ctx *ctx, uint64_t split, void **seq)
{
	const tally_state *st = cachew_op_ctx_state(ctx);
	tally_seq *q;

	if ((int64_t)split == st->fail_split)
		return cachew_op_ctx_fail(ctx, "split %llu is unreadable",
		    (unsigned long long)split);
	q = calloc(1, sizeof(*q));
	if (q == NULL)
		return CACHEW_ENOMEM;
	q->split = (int64_t)split;
	q->n = st->n;
	q->bad = split == 1 ? st->bad : -1;
	*seq = q;
	return CACHEW_OK;
}

static cachew_err
tally_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	tally_seq *q = seq;
	cachew_element *e;
	void *v;

	(void)ctx;
	if (q->k >= q->n)
		return CACHEW_EOF;
	ck_assert_int_eq(cachew_element_create(&e, 1), CACHEW_OK);
	if (q->k == q->bad) {
		ck_assert_int_eq(cachew_element_alloc(e, 0, CACHEW_F64, 0, NULL,
		    &v), CACHEW_OK);
		*(double *)v = 0.5;
	} else {
		ck_assert_int_eq(cachew_element_alloc(e, 0, CACHEW_I64, 0, NULL,
		    &v), CACHEW_OK);
		*(int64_t *)v = q->split * 100 + q->k;
	}
	q->k++;
	*out = e;
	return CACHEW_OK;
}

static void
tally_close(void *seq)
{
	free(seq);
}

static const cachew_source_def tally_def = {
    .version = CACHEW_SOURCE_DEF_VERSION,
    .name = "tally",
    .doc = "tally(n=3, splits=2): split s yields s*100 + k, k < n",
    .element_spec = "i64[]",
    .init = tally_init,
    .fini = tally_fini,
    .splits = tally_splits,
    .open = tally_open,
    .next = tally_next,
    .close = tally_close,
};

/* The same source without a splits callback (one split) and a spec. */
static const cachew_source_def whole_def = {
    .version = CACHEW_SOURCE_DEF_VERSION,
    .name = "tally_whole",
    .init = tally_init,
    .fini = tally_fini,
    .open = tally_open,
    .next = tally_next,
    .close = tally_close,
};

/* Registers the test sources once per process (Check forks each test). */
static void
register_tally(void)
{
	cachew_err rv = cachew_source_register(&tally_def);
	ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_EEXIST, "%s",
	    cachew_errmsg());
	rv = cachew_source_register(&whole_def);
	ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_EEXIST, "%s",
	    cachew_errmsg());
}

static const char *const services[] = {NULL, "embedded", "embedded:2"};

/* The run of pipeline through service reads `want` (cwt_join_i64): in
 * order through one worker; through two (embedded:2, distributed_epoch)
 * the workers' splits interleave in any order, so there the multiset is
 * what must agree. */
static void
run_is(const char *pipeline, const char *service, const char *want)
{
	cachew_options *o = cwt_opts_at(1, 0, service);

	if (service != NULL && strcmp(service, "embedded:2") == 0) {
		char *got = cwt_hash_seq(pipeline, o, 1);
		char *local = cwt_hash_seq(pipeline, NULL, 1);
		ck_assert_msg(strcmp(got, local) == 0, "%s on %s: another "
		    "multiset than in-process", pipeline, service);
		free(got);
		free(local);
		cwt_seq_is(pipeline, NULL, want);
	} else {
		cwt_seq_is(pipeline, o, want);
	}
	cachew_options_destroy(o);
}

START_TEST(c_source_runs_in_process_and_on_the_service)
{
	register_tally();
	for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
		const char *sv = services[s];
		run_is("tally(n=3, splits=2)", sv, "0,1,2,100,101,102");
		run_is("tally(n=2, splits=4) | map(add, value=1)", sv,
		    "1,2,101,102,201,202,301,302");
		run_is("tally(n=0, splits=3)", sv, "");
		run_is("tally(splits=0)", sv, "");
		run_is("tally_whole(n=4)", sv, "0,1,2,3");
		/* The canonical form builds the same. */
		run_is("user_source(tally, n=1, splits=3)", sv, "0,100,200");
	}
	/* distributed over two embedded workers: every split once. */
	cachew_options *o = cwt_opts_at(1, 0, "embedded:2");
	char *got = cwt_hash_seq("tally(n=50, splits=8)", o, 1);
	char *want = cwt_hash_seq("tally(n=50, splits=8)", NULL, 1);
	ck_assert_str_eq(got, want);
	free(got);
	free(want);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(c_source_spec_plan_and_explain)
{
	cachew_dataset *ds;
	char *s = NULL;

	register_tally();
	cwt_spec_is("tally(n=3)", "i64[]");
	cwt_spec_is("tally_whole(n=3)", "?");
	ck_assert_int_eq(cwt_card("tally(n=3)"), CACHEW_CARDINALITY_UNKNOWN);
	cwt_spec_is("tally(n=4) | batch(2)", "i64[-1]");
	/* Typed downstream: concatenate with text is refused at build. */
	cwt_build_refused("tally(n=3) | concatenate(from_list([\"a\"]))",
	    CACHEW_ETYPE, "concatenate");
	ds = cwt_parse("tally(n=3, splits=5) | batch(2)");
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "user_source(tally, n=3, splits=5) | "
			    "batch(n=2, drop_remainder=false)");
	cachew_free(s);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(c_source_errors_name_the_source)
{
	register_tally();
	/* A broken promise: element 1 of split 1 is an f64. */
	cwt_run_fails("tally(n=3, bad=1)", NULL, CACHEW_ETYPE,
	    "user_source(tally): split 1, element 1: component 0 is f64[], "
	    "not i64[], as the source declared");
	cwt_run_fails("tally(n=3, fail_split=1)", NULL, CACHEW_EOP,
	    "split 1 is unreadable");
	cwt_build_refused("tally(m=3)", CACHEW_EINVAL, "bad parameter 'm'");
	cwt_build_refused("tally(3)", CACHEW_EINVAL,
	    "a user source takes its parameters by name");
	cwt_build_refused("range(3) | tally(n=3)", CACHEW_EINVAL,
	    "is a source and takes no input");
	cwt_build_refused("user_source(add)", CACHEW_EINVAL,
	    "function 'add' is a map function, not a source function");
	cwt_build_refused("no_such_source(n=3)", CACHEW_ENOENT,
	    "unknown operator 'no_such_source'");
	/* Through the service a split count that fails is the plan's error. */
	cachew_options *o = cwt_opts_at(1, 0, "embedded");
	cwt_run_fails("tally(splits=-1)", o, CACHEW_EINVAL,
	    "splits is negative");
	cachew_options_destroy(o);
}
END_TEST

static cachew_err
nop_open(cachew_op_ctx *ctx, uint64_t split, void **seq)
{
	(void)ctx;
	(void)split;
	*seq = NULL;
	return CACHEW_OK;
}

static cachew_err
nop_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	(void)ctx;
	(void)seq;
	(void)out;
	return CACHEW_EOF;
}

START_TEST(registration_refuses_bad_definitions)
{
	cachew_source_def d = {.version = CACHEW_SOURCE_DEF_VERSION,
	    .name = "ok_source", .open = nop_open, .next = nop_next};

	register_tally();
	d.name = "range";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EEXIST);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "a built-in operator"));
	d.name = "add";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EEXIST);
	d.name = "tally";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EEXIST);
	d.name = "Bad-Name";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EINVAL);
	d.name = "ok_source";
	d.element_spec = "(i64[], f32[2,x])";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EINVAL);
	ck_assert_msg(strstr(cachew_errmsg(), "column 15") != NULL &&
		strstr(cachew_errmsg(), "expected a dimension") != NULL,
	    "%s", cachew_errmsg());
	d.element_spec = "{a: i64[], a: f32[]}";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "given twice"));
	d.element_spec = "quad[]";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "unknown dtype"));
	d.element_spec = NULL;
	d.next = NULL;
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "lacks its next"));
	d.next = nop_next;
	d.version = 0;
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_EINVAL);
	d.version = CACHEW_SOURCE_DEF_VERSION + 1;
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_ENOTSUP);
	ck_assert_int_eq(cachew_source_register(NULL), CACHEW_EINVAL);
	/* A good one, with every form of spec the printer writes. */
	d.version = CACHEW_SOURCE_DEF_VERSION;
	d.element_spec = " { image : u8[-1, ?, 3], label: i64[] , t: bytes[?]} ";
	ck_assert_int_eq(cachew_source_register(&d), CACHEW_OK);
	cwt_spec_is("ok_source()", "{image: u8[-1,-1,3], label: i64[], "
				   "t: bytes[?]}");
	cwt_seq_is("ok_source", NULL, "");
}
END_TEST

START_TEST(c_source_resumes_at_every_position)
{
	register_tally();
	cwt_resumes_at_every_cut("tally(n=3, splits=3)", NULL,
	    "0,1,2,100,101,102,200,201,202", 9);
	cwt_resumes_at_every_cut("tally(n=2, splits=3) | batch(4)", NULL,
	    "[0 1 100 101],[200 201]", 2);
}
END_TEST

/* ---- the plugin's source ---------------------------------------------------- */

static void
load_plugin(char *so, size_t len)
{
	cwt_build_file(so, len, "plugin_example.so");
	ck_assert_msg(cachew_plugin_load(so) == CACHEW_OK, "%s",
	    cachew_errmsg());
}

/* The sum of n and of square over a run, and its count. */
static void
squares_sums(const char *pipeline, const cachew_options *o, int64_t *count,
    int64_t *sum_n, int64_t *sum_sq)
{
	cachew_element **v;
	size_t n;
	char err[512] = "";

	ck_assert_msg(cwt_run(pipeline, o, &v, &n, err, sizeof(err)) ==
	    CACHEW_OK, "%s: %s", pipeline, err);
	*count = (int64_t)n;
	*sum_n = *sum_sq = 0;
	for (size_t i = 0; i < n; i++) {
		size_t c;
		ck_assert_int_eq(cachew_element_find(v[i], "square", &c),
		    CACHEW_OK);
		ck_assert_uint_eq(c, 1);
		ck_assert_str_eq(cachew_element_name(v[i], 0), "n");
		*sum_n += cwt_i64(v[i], 0);
		*sum_sq += cwt_i64(v[i], 1);
		ck_assert_int_eq(cwt_i64(v[i], 1), cwt_i64(v[i], 0) *
		    cwt_i64(v[i], 0));
	}
	cwt_free(v, n);
}

START_TEST(plugin_source_runs_in_process_and_embedded)
{
	char so[600];
	int64_t count, sn, ssq;

	load_plugin(so, sizeof(so));
	cwt_spec_is("squares(count=5)", "{n: i64[], square: i64[]}");
	for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
		cachew_options *o = cwt_opts_at(1, 0, services[s]);
		run_is("squares(count=7, splits=3)", services[s],
		    "0,1,2,3,4,5,6");
		squares_sums("squares(count=100, splits=7)", o, &count, &sn,
		    &ssq);
		ck_assert_int_eq(count, 100);
		ck_assert_int_eq(sn, 4950);
		ck_assert_int_eq(ssq, 328350);
		cachew_options_destroy(o);
	}
	cwt_build_refused("squares(count=-1)", CACHEW_ERANGE,
	    "count must be an integer from 0");
}
END_TEST

/* Waits (bounded) until worker i's log shows `event`; whether it did. */
static bool
worker_logged(const cwt_cluster *c, int i, const char *event, int ms)
{
	uint64_t end = cwt_now_ms() + (uint64_t)cwt_bound_ms(ms);
	bool seen = false;

	while (!seen) {
		char *log = cwt_slurp(c->workers[i].log);
		seen = log != NULL && strstr(log, event) != NULL;
		free(log);
		if (seen || cwt_now_ms() >= end)
			break;
		cwt_nap_ms(10);
	}
	return seen;
}

/* Real worker processes that load the plugin run its source: two workers
 * share its splits in distributed_epoch (each element once, the
 * in-process multiset, both workers run tasks), the elements named as the
 * source declared; a third worker, without the plugin, gets no task. */
START_TEST(cluster_workers_run_plugin_sources)
{
	const char *p = "squares(count=2000, splits=16) | map(add, value=1)";
	char so[600];
	cwt_cluster c;

	load_plugin(so, sizeof(so));
	cwt_cluster_start(&c, 0);
	for (int i = 0; i < 2; i++) {
		char name[32];
		snprintf(name, sizeof(name), "worker%d", i);
		cwt_daemon_start(&c.workers[i], c.dir, name, "--role=worker",
		    "--dispatcher", c.dispatcher.url, "--listen",
		    "tcp://127.0.0.1:0", "--heartbeat-ms", "50", "--threads",
		    "1", "--plugin", so, (char *)NULL);
	}
	cwt_cluster_worker_start(&c, 2); /* no plugin */
	c.nworkers = 3;
	for (int i = 0; i < 3; i++)
		ck_assert_msg(worker_logged(&c, i, "event=registered", 10000),
		    "worker %d never registered", i);
	cachew_options *o = cwt_opts_at(3, 0, c.dispatcher.url);
	ck_assert_int_eq(cachew_options_set_str(o, "processing_mode",
	    "distributed_epoch"), CACHEW_OK);
	char *remote = cwt_hash_seq(p, o, 1);
	char *local = cwt_hash_seq(p, NULL, 1);
	ck_assert_str_eq(remote, local);
	ck_assert_uint_eq(strlen(local), 2000 * 17 - 1);
	free(remote);
	free(local);
	int64_t count, sn, ssq;
	squares_sums("squares(count=300, splits=5)", o, &count, &sn, &ssq);
	ck_assert_int_eq(count, 300);
	ck_assert_int_eq(sn, 44850);
	ck_assert_int_eq(ssq, 8955050);
	cachew_options_destroy(o);
	ck_assert(worker_logged(&c, 0, "event=task_started", 100));
	ck_assert(worker_logged(&c, 1, "event=task_started", 100));
	ck_assert_msg(!worker_logged(&c, 2, "event=task_started", 0),
	    "the worker without the plugin ran a task");
	cwt_cluster_stop(&c);
}
END_TEST

Suite *
cwt_usersrc_suite(void)
{
	Suite *s = suite_create("user_source");
	TCase *tc = tcase_create("c_api");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, c_source_runs_in_process_and_on_the_service);
	tcase_add_test(tc, c_source_spec_plan_and_explain);
	tcase_add_test(tc, c_source_errors_name_the_source);
	tcase_add_test(tc, registration_refuses_bad_definitions);
	tcase_add_test(tc, c_source_resumes_at_every_position);
	suite_add_tcase(s, tc);

	tc = tcase_create("plugin");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, plugin_source_runs_in_process_and_embedded);
	suite_add_tcase(s, tc);

	tc = tcase_create("cluster");
	tcase_set_timeout(tc, 180);
	tcase_add_test(tc, cluster_workers_run_plugin_sources);
	suite_add_tcase(s, tc);
	return s;
}
