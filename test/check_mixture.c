/*
 * check_mixture.c - data mixtures: sample_from_datasets and
 * choose_from_datasets, modelled on the examples of tf.data's docstrings,
 * in-process, through service=embedded and through real cachewd
 * processes, with their specs, cardinalities, refusals and saved
 * positions.
 */
#include "cwt.h"

#include <stdlib.h>
#include <string.h>

/* The i64 values of a run (component 0), *n of them; free with free(). */
static int64_t *
i64_run(const char *pipeline, const cachew_options *opts, size_t *n)
{
	cachew_element **v = NULL;
	char errmsg[512] = "";
	cachew_err rv = cwt_run(pipeline, opts, &v, n, errmsg, sizeof(errmsg));
	int64_t *out;

	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, errmsg);
	out = malloc((*n + 1) * sizeof(*out));
	ck_assert_ptr_nonnull(out);
	for (size_t i = 0; i < *n; i++)
		out[i] = cwt_i64(v[i], 0);
	cwt_free(v, *n);
	return out;
}

/* Each input's elements keep their order in the mixture: the values below
 * `split` ascend from lo_start, the others from hi_start, one by one. Returns
 * how many came from the low input. */
static size_t
assert_interleaving(const int64_t *v, size_t n, int64_t split,
    int64_t lo_start, int64_t hi_start)
{
	int64_t lo = lo_start, hi = hi_start;
	size_t nlo = 0;

	for (size_t i = 0; i < n; i++) {
		if (v[i] < split) {
			ck_assert_msg(v[i] == lo, "element %zu is %lld, want %lld",
			    i, (long long)v[i], (long long)lo);
			lo++;
			nlo++;
		} else {
			ck_assert_msg(v[i] == hi, "element %zu is %lld, want %lld",
			    i, (long long)v[i], (long long)hi);
			hi++;
		}
	}
	return nlo;
}

static void
same_fingerprint(const cachew_dataset *a, const cachew_dataset *b)
{
	cachew_fingerprint fa, fb;

	ck_assert_int_eq(cachew_dataset_fingerprint(a, &fa), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_fingerprint(b, &fb), CACHEW_OK);
	ck_assert_mem_eq(&fa, &fb, sizeof(fa));
}

static const char *const services[] = {NULL, "embedded", "embedded:2"};

/* ---- sample_from_datasets -------------------------------------------------- */

/* tf.data's docstring: dataset1 = range(0, 3), dataset2 = range(100, 103),
 * weights [0.5, 0.5]: "one possible outcome is [100, 0, 1, 101, 2, 102]"
 * (each input in order, all six elements); weights [1.0, 0.0]: [0, 1, 2]. */
START_TEST(sample_as_in_tf_data_docs)
{
	const char *p = "sample_from_datasets(range(0, 3), range(100, 103), "
			"weights=[0.5, 0.5])";

	for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
		for (int64_t seed = 1; seed <= 20; seed++) {
			cachew_options *o = cwt_opts_at(seed, 0, services[s]);
			size_t n;
			int64_t *v = i64_run(p, o, &n);
			ck_assert_uint_eq(n, 6);
			ck_assert_uint_eq(assert_interleaving(v, n, 100, 0, 100),
			    3);
			free(v);
			cachew_options_destroy(o);
		}
		cachew_options *o = cwt_opts_at(3, 0, services[s]);
		cwt_seq_is("sample_from_datasets(range(0, 3), range(100, 103), "
			   "weights=[1.0, 0.0])", o, "0,1,2");
		/* Positional weights, ints, one input. */
		cwt_seq_is("sample_from_datasets(range(0, 3), range(100, 103), "
			   "[0, 2])", o, "100,101,102");
		/* One input: the draws are its elements, in its order (two
		 * workers would interleave range's splits: not in order). */
		if (s < 2)
			cwt_seq_is("range(4) | sample_from_datasets", o,
			    "0,1,2,3");
		cachew_options_destroy(o);
	}
}
END_TEST

/* Seeded: the same seed and epoch give the same draws in-process and on
 * the service; another epoch draws anew (rerandomize_each_iteration, as
 * shuffle), unless it is false; an explicit seed= ignores the pipeline's. */
START_TEST(sample_is_seeded_and_draws_anew_each_epoch)
{
	const char *p = "sample_from_datasets(range(0, 100), range(100, 200))";
	const char *fixed = "sample_from_datasets(range(0, 100), range(100, "
			    "200), rerandomize_each_iteration=false)";
	const char *own = "sample_from_datasets(range(0, 100), range(100, "
			  "200), seed=42)";
	cachew_options *e0 = cwt_opts_at(5, 0, NULL);
	cachew_options *e1 = cwt_opts_at(5, 1, NULL);
	cachew_options *other = cwt_opts_at(6, 0, NULL);
	char *a = cwt_seq(p, e0), *b = cwt_seq(p, e1), *c = cwt_seq(p, other);

	ck_assert_str_ne(a, b);
	ck_assert_str_ne(a, c);
	for (size_t s = 1; s < sizeof(services) / sizeof(services[0]); s++) {
		cachew_options *o = cwt_opts_at(5, 0, services[s]);
		char *got = cwt_seq(p, o);
		ck_assert_msg(strcmp(got, a) == 0, "%s on %s differs from "
		    "in-process", p, services[s]);
		free(got);
		cachew_options_destroy(o);
	}
	free(a);
	free(b);
	free(c);
	a = cwt_seq(fixed, e0);
	b = cwt_seq(fixed, e1);
	ck_assert_str_eq(a, b);
	free(a);
	free(b);
	a = cwt_seq(own, e0);
	c = cwt_seq(own, other);
	ck_assert_str_eq(a, c);
	free(a);
	free(c);
	/* Under repeat each repetition is an epoch: two different passes. */
	a = cwt_seq("sample_from_datasets(range(0, 50), range(100, 150)) | "
		    "repeat(2)", e0);
	ck_assert_uint_eq(strlen(a) > 0, 1);
	size_t n;
	int64_t *v = i64_run("sample_from_datasets(range(0, 50), range(100, "
			     "150)) | repeat(2)", e0, &n);
	ck_assert_uint_eq(n, 200);
	ck_assert_int_ne(memcmp(v, v + 100, 100 * sizeof(*v)), 0);
	free(v);
	free(a);
	cachew_options_destroy(e0);
	cachew_options_destroy(e1);
	cachew_options_destroy(other);
}
END_TEST

/* The mixture's proportions are the normalised weights: 3:1 over 40,000
 * draws takes 30,000 from the first input, within 6 standard deviations
 * of the binomial (sd = sqrt(40000 * 0.75 * 0.25) = 87). The seed is
 * fixed, so the run is deterministic; the bound is what any seed meets. */
START_TEST(sample_proportions_follow_the_weights)
{
	const char *p = "sample_from_datasets(range(0, 1000000), "
			"range(1000000, 2000000), weights=[3, 1]) | take(40000)";
	const char *three = "sample_from_datasets(range(0, 1000000), "
			    "range(1000000, 2000000), range(2000000, 3000000), "
			    "weights=[0.2, 0.3, 0.5]) | take(30000)";

	for (size_t s = 0; s < 2; s++) {
		cachew_options *o = cwt_opts_at(11, 0, services[s]);
		size_t n, k[3] = {0, 0, 0};
		int64_t *v = i64_run(p, o, &n);
		ck_assert_uint_eq(n, 40000);
		size_t nlo = assert_interleaving(v, n, 1000000, 0, 1000000);
		ck_assert_msg(nlo > 30000 - 522 && nlo < 30000 + 522,
		    "%zu of 40000 from the weight-3 input", nlo);
		free(v);
		/* 0.2 : 0.3 : 0.5 over 30,000: sd <= 87 each. */
		v = i64_run(three, o, &n);
		ck_assert_uint_eq(n, 30000);
		for (size_t i = 0; i < n; i++)
			k[v[i] / 1000000]++;
		ck_assert_msg(k[0] > 6000 - 522 && k[0] < 6000 + 522 &&
			k[1] > 9000 - 522 && k[1] < 9000 + 522 &&
			k[2] > 15000 - 522 && k[2] < 15000 + 522,
		    "%zu, %zu, %zu of 30000", k[0], k[1], k[2]);
		free(v);
		cachew_options_destroy(o);
	}
}
END_TEST

/* stop_on_empty_dataset: the first input drawn when empty ends the
 * mixture (one input whole, a prefix of the other); without it every
 * element of both comes out. */
START_TEST(sample_stop_on_empty_dataset)
{
	const char *p = "sample_from_datasets(range(0, 3), range(100, 110), "
			"stop_on_empty_dataset=true)";

	for (int64_t seed = 1; seed <= 30; seed++) {
		cachew_options *o = cwt_opts_at(seed, 0, NULL);
		size_t n;
		int64_t *v = i64_run(p, o, &n);
		size_t nlo = assert_interleaving(v, n, 100, 0, 100);
		ck_assert_msg(nlo == 3 || n - nlo == 10, "seed %lld: %zu "
		    "elements, %zu of range(0, 3)", (long long)seed, n, nlo);
		ck_assert_uint_lt(n, 13);
		free(v);
		cachew_options_destroy(o);
	}
	cwt_seq_is("sample_from_datasets(range(0, 0), range(5), "
		   "stop_on_empty_dataset=true, weights=[1, 0])", NULL, "");
	cwt_seq_is("sample_from_datasets(range(0, 0), range(5))", NULL,
	    "0,1,2,3,4");
}
END_TEST

START_TEST(sample_spec_cardinality_and_builder)
{
	cachew_dataset *in[2], *ds = NULL, *parsed;
	const double w[2] = {0.25, 0.75};

	cwt_spec_is("sample_from_datasets(range(3), range(5))", "i64[]");
	ck_assert_int_eq(cwt_card("sample_from_datasets(range(3), range(5))"),
	    8);
	ck_assert_int_eq(cwt_card("sample_from_datasets(range(3), range(5), "
				  "weights=[1, 0])"),
	    3);
	ck_assert_int_eq(cwt_card("sample_from_datasets(range(3), range(5), "
				  "stop_on_empty_dataset=true)"),
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cwt_card("sample_from_datasets(range(3), counter())"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("sample_from_datasets(counter(), counter(), "
				  "stop_on_empty_dataset=true)"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("sample_from_datasets(range(3), range(5) | "
				  "unique)"),
	    CACHEW_CARDINALITY_UNKNOWN);
	/* Dimensions that differ become -1, as for concatenate. */
	cwt_spec_is("sample_from_datasets(range(4) | batch(2), range(3) | "
		    "batch(3))",
	    "i64[-1]");
	cwt_spec_is("sample_from_datasets(from_tensors({a=1, b=\"x\"}), "
		    "from_tensors({a=2, b=\"y\"}))",
	    "{a: i64[], b: bytes[]}");
	in[0] = cwt_parse("range(3)");
	in[1] = cwt_parse("range(100, 103)");
	ck_assert_int_eq(cachew_dataset_sample_from_datasets(&ds, in, 2, w, 9,
	    0), CACHEW_OK);
	parsed = cwt_parse("sample_from_datasets(range(3), range(100, 103), "
			   "weights=[0.25, 0.75], seed=9)");
	same_fingerprint(ds, parsed);
	cachew_dataset_release(parsed);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_sample_from_datasets(&ds, in, 2, NULL,
	    -1, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_cardinality(ds),
	    CACHEW_CARDINALITY_UNKNOWN);
	cachew_dataset_release(ds);
	/* The weights array has one value per input: a negative one is
	 * refused. */
	const double neg[2] = {1, -0.5};
	ck_assert_int_eq(cachew_dataset_sample_from_datasets(&ds, in, 2, neg,
	    -1, 0), CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "weights[1] must be"));
	ck_assert_int_eq(cachew_dataset_sample_from_datasets(&ds, NULL, 2,
	    NULL, -1, 0), CACHEW_EINVAL);
	cachew_dataset_release(in[0]);
	cachew_dataset_release(in[1]);
}
END_TEST

START_TEST(sample_refuses_what_it_cannot_take)
{
	cwt_build_refused("sample_from_datasets(range(3), from_list([1.5]))",
	    CACHEW_ETYPE, "dataset 1's elements differ from dataset 0's");
	cwt_build_refused("range(3) | sample_from_datasets(range(3), "
			  "from_tensors((1, 2)))",
	    CACHEW_ETYPE, "dataset 2's elements differ");
	cwt_build_refused("sample_from_datasets(range(3), range(3), "
			  "weights=[1])",
	    CACHEW_EINVAL, "weights has 1 values for 2 datasets");
	cwt_build_refused("sample_from_datasets(range(3), range(3), "
			  "weights=[1, -1])",
	    CACHEW_EINVAL, "weights[1] must be a finite number >= 0");
	cwt_build_refused("sample_from_datasets(range(3), range(3), "
			  "weights=[0, 0])",
	    CACHEW_EINVAL, "at least one must be above 0");
	cwt_build_refused("sample_from_datasets(range(3), range(3), "
			  "weights=[1, \"a\"])",
	    CACHEW_EINVAL, "weights[1]");
	cwt_build_refused("sample_from_datasets(weights=[1])", CACHEW_EINVAL,
	    "needs 1 to 64 input pipelines, got 0");
}
END_TEST

/* Saves after every count of elements and checks that the restored
 * iterator yields the rest of the run at that seed. */
static void
resumes_at_every_cut(const char *pipeline, int64_t seed)
{
	cachew_options *o = cwt_opts(seed, 1);
	char *want = cwt_seq(pipeline, o);
	int total = 1;

	for (const char *c = want; *c != '\0'; c++)
		total += *c == ',';
	cwt_resumes_at_every_cut(pipeline, o, want, total);
	free(want);
	cachew_options_destroy(o);
}

START_TEST(mixtures_resume)
{
	resumes_at_every_cut("sample_from_datasets(range(0, 10), range(100, "
			     "105), range(200, 208), weights=[1, 2, 3])",
	    4);
	resumes_at_every_cut("sample_from_datasets(range(0, 10), range(100, "
			     "120), stop_on_empty_dataset=true)",
	    8);
	resumes_at_every_cut("choose_from_datasets(range(0, 5), range(100, "
			     "110), from_list([1, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1]), "
			     "stop_on_empty_dataset=false)",
	    1);
}
END_TEST

/* ---- choose_from_datasets -------------------------------------------------- */

/* tf.data's docstring: datasets "foo", "bar", "baz" repeated, choice
 * dataset range(3).repeat(3): foo, bar, baz, foo, bar, baz, foo, bar, baz. */
START_TEST(choose_as_in_tf_data_docs)
{
	const char *p = "choose_from_datasets(from_tensors(\"foo\") | repeat, "
			"from_tensors(\"bar\") | repeat, from_tensors(\"baz\") | "
			"repeat, range(3) | repeat(3))";

	for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
		cachew_options *o = cwt_opts_at(1, 0, services[s]);
		char *got = cwt_str_seq(p, o);
		ck_assert_msg(strcmp(got, "foo,bar,baz,foo,bar,baz,foo,bar,baz")
			== 0, "%s on %s: %s", p,
		    services[s] != NULL ? services[s] : "default", got);
		free(got);
		/* Each input in its own order, as the choices say. */
		cwt_seq_is("choose_from_datasets(range(0, 5), range(100, 105), "
			   "from_list([1, 1, 0, 1, 0]))",
		    o, "100,101,0,102,1");
		/* tf.data's default stop_on_empty_dataset=true: choosing an
		 * input that has ended ends the dataset; false skips it. */
		cwt_seq_is("choose_from_datasets(range(2), range(10, 12), "
			   "from_list([0, 0, 0, 1]))",
		    o, "0,1");
		cwt_seq_is("choose_from_datasets(range(2), range(10, 12), "
			   "from_list([0, 0, 0, 1]), stop_on_empty_dataset=false)",
		    o, "0,1,10");
		/* Once every input has ended, the mixture has too. */
		cwt_seq_is("choose_from_datasets(range(1), range(10, 11), "
			   "from_list([0, 1]) | repeat, "
			   "stop_on_empty_dataset=false)",
		    o, "0,10");
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(choose_spec_cardinality_and_builder)
{
	cachew_dataset *in[2], *choice, *ds = NULL, *parsed;

	cwt_spec_is("choose_from_datasets(range(3), range(5), range(2))",
	    "i64[]");
	ck_assert_int_eq(cwt_card("choose_from_datasets(counter(), counter(), "
				  "range(7))"),
	    7);
	ck_assert_int_eq(cwt_card("choose_from_datasets(range(3), counter(), "
				  "range(7))"),
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cwt_card("choose_from_datasets(counter(), counter(), "
				  "from_list([0, 1]) | repeat)"),
	    CACHEW_CARDINALITY_INFINITE);
	in[0] = cwt_parse("range(3)");
	in[1] = cwt_parse("range(100, 103)");
	choice = cwt_parse("from_list([1, 0, 0])");
	ck_assert_int_eq(cachew_dataset_choose_from_datasets(&ds, in, 2, choice,
	    1), CACHEW_OK);
	parsed = cwt_parse("choose_from_datasets(range(3), range(100, 103), "
			   "from_list([1, 0, 0]))");
	same_fingerprint(ds, parsed);
	cachew_dataset_release(parsed);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_choose_from_datasets(&ds, in, 2, NULL,
	    1), CACHEW_EINVAL);
	cachew_dataset_release(in[0]);
	cachew_dataset_release(in[1]);
	cachew_dataset_release(choice);
}
END_TEST

START_TEST(choose_refuses_what_it_cannot_take)
{
	cwt_build_refused("choose_from_datasets(range(3), from_list([\"a\"]), "
			  "range(2))",
	    CACHEW_ETYPE, "dataset 1's elements differ from dataset 0's");
	cwt_build_refused("choose_from_datasets(range(3), range(3), "
			  "from_list([0.5]))",
	    CACHEW_ETYPE, "the choice dataset (the last input) yields f64[], "
			  "not scalar integers");
	cwt_build_refused("choose_from_datasets(range(3), range(3), "
			  "range(4) | batch(2))",
	    CACHEW_ETYPE, "yields i64[-1]");
	cwt_build_refused("choose_from_datasets(range(3))", CACHEW_EINVAL,
	    "needs the datasets and, last, the choice dataset");
	/* tf.data: a choice outside the datasets fails the iteration, after
	 * the elements chosen before it. */
	cwt_run_fails("choose_from_datasets(range(3), range(3), "
		      "from_list([0, 1, 2]))",
	    NULL, CACHEW_EINVAL, "element 2 of the choice dataset is 2, "
				 "outside [0, 2)");
	cwt_run_fails("choose_from_datasets(range(3), range(3), "
		      "from_list([-1]))",
	    NULL, CACHEW_EINVAL, "is -1, outside [0, 2)");
}
END_TEST

/* ---- real cachewd processes ------------------------------------------------- */

static int
cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static char *
seq_on(const char *pipeline, const char *service, const char *mode,
    int64_t seed)
{
	cachew_options *o = cwt_opts(seed, 1);
	char *s;

	if (service != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "service", service),
		    CACHEW_OK);
	if (mode != NULL)
		ck_assert_int_eq(cachew_options_set_str(o, "processing_mode",
		    mode), CACHEW_OK);
	s = cwt_seq(pipeline, o);
	cachew_options_destroy(o);
	return s;
}

/* Through a dispatcher and two worker processes over tcp: in
 * distributed_epoch one worker runs the mixture whole (it cannot be
 * split), so the draws are the in-process ones at the same seed, the
 * proportions the weights', and choose_from_datasets' elements exactly
 * the choices'; in parallel_epochs each worker runs it whole. */
START_TEST(cluster_mixtures_run_on_workers)
{
	const char *mix = "sample_from_datasets(range(0, 1000000), "
			  "range(1000000, 2000000), weights=[1, 3]) | "
			  "take(20000)";
	const char *choose = "choose_from_datasets(range(0, 100), range(1000, "
			     "1100), from_list([0, 1]) | repeat(50))";
	cwt_cluster c;

	cwt_cluster_start(&c, 2);
	char *local = seq_on(mix, "local", NULL, 21);
	char *remote = seq_on(mix, c.dispatcher.url, "distributed_epoch", 21);
	ck_assert_msg(strcmp(local, remote) == 0, "the mixture through the "
	    "workers differs from in-process");
	size_t n;
	cachew_options *o = cwt_opts(21, 1);
	ck_assert_int_eq(cachew_options_set_str(o, "service", c.dispatcher.url),
	    CACHEW_OK);
	int64_t *v = i64_run(mix, o, &n);
	ck_assert_uint_eq(n, 20000);
	/* 1:3 over 20,000: 5,000 from the first, sd 61, bound 6 sd. */
	size_t nlo = assert_interleaving(v, n, 1000000, 0, 1000000);
	ck_assert_msg(nlo > 5000 - 367 && nlo < 5000 + 367, "%zu of 20000",
	    nlo);
	free(v);
	cachew_options_destroy(o);
	free(local);
	free(remote);

	local = seq_on(choose, "local", NULL, 1);
	remote = seq_on(choose, c.dispatcher.url, "distributed_epoch", 1);
	ck_assert_str_eq(remote, local);
	free(remote);
	/* Exactly 0..49 and 1000..1049, alternating. */
	ck_assert_uint_eq(strncmp(local, "0,1000,1,1001,2,1002,", 21), 0);
	ck_assert_ptr_nonnull(strstr(local, ",49,1049"));
	free(local);
	/* parallel_epochs: each of the two workers yields the mixture (the
	 * client interleaves the two streams: the multiset is exact). */
	cachew_options *par = cwt_opts(1, 1);
	ck_assert_int_eq(cachew_options_set_str(par, "service",
	    c.dispatcher.url), CACHEW_OK);
	ck_assert_int_eq(cachew_options_set_str(par, "processing_mode",
	    "parallel_epochs"), CACHEW_OK);
	v = i64_run("choose_from_datasets(range(0, 3), range(10, 13), "
		    "from_list([1, 0, 1]))", par, &n);
	ck_assert_uint_eq(n, 6);
	qsort(v, n, sizeof(*v), cmp_i64);
	char *two = cwt_fmt("%zu: %lld %lld %lld %lld %lld %lld", n,
	    (long long)v[0], (long long)v[1], (long long)v[2],
	    (long long)v[3], (long long)v[4], (long long)v[5]);
	ck_assert_str_eq(two, "6: 0 0 10 10 11 11");
	free(two);
	free(v);
	cachew_options_destroy(par);
	cwt_cluster_stop(&c);
}
END_TEST

Suite *
cwt_mixture_suite(void)
{
	Suite *s = suite_create("mixture");
	TCase *tc = tcase_create("sample");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, sample_as_in_tf_data_docs);
	tcase_add_test(tc, sample_is_seeded_and_draws_anew_each_epoch);
	tcase_add_test(tc, sample_proportions_follow_the_weights);
	tcase_add_test(tc, sample_stop_on_empty_dataset);
	tcase_add_test(tc, sample_spec_cardinality_and_builder);
	tcase_add_test(tc, sample_refuses_what_it_cannot_take);
	tcase_add_test(tc, mixtures_resume);
	suite_add_tcase(s, tc);

	tc = tcase_create("choose");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, choose_as_in_tf_data_docs);
	tcase_add_test(tc, choose_spec_cardinality_and_builder);
	tcase_add_test(tc, choose_refuses_what_it_cannot_take);
	suite_add_tcase(s, tc);

	tc = tcase_create("cluster");
	tcase_set_timeout(tc, 180);
	tcase_add_test(tc, cluster_mixtures_run_on_workers);
	suite_add_tcase(s, tc);
	return s;
}
