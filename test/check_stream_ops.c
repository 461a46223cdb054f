/*
 * check_stream_ops.c - operators whose output depends on the whole
 * stream rather than on one element: unique, scan, reduce and window. Modelled on the examples of
 * tf.data's docstrings, run in-process and through service=embedded,
 * with their specs, refusals and saved positions.
 */
#include "cwt.h"

#include <stdlib.h>
#include <string.h>

static const char *const services[] = {NULL, "embedded"};

/* The strings of component 0 of a run, comma-joined; free with free(). */
static char *
str_seq(const char *pipeline, const cachew_options *opts)
{
	cachew_element **v = NULL;
	size_t n = 0, len = 0;
	char errmsg[512] = "";
	char *s = calloc(1, 4096);
	cachew_err rv = cwt_run(pipeline, opts, &v, &n, errmsg, sizeof(errmsg));

	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, errmsg);
	ck_assert_ptr_nonnull(s);
	for (size_t i = 0; i < n; i++) {
		const void *data;
		size_t dlen;
		ck_assert_int_eq(cachew_tensor_bytes_at(
		    cachew_element_component(v[i], 0), 0, &data, &dlen),
		    CACHEW_OK);
		ck_assert_uint_lt(len + dlen + 2, 4096);
		if (i > 0)
			s[len++] = ',';
		memcpy(s + len, data, dlen);
		len += dlen;
	}
	cwt_free(v, n);
	return s;
}

static void
spec_card_is(const char *pipeline, const char *want, int64_t card)
{
	cwt_spec_is(pipeline, want);
	ck_assert_int_eq(cwt_card(pipeline), card);
}

/* Saves after every count of elements `cut` and checks that the restored
 * iterator yields the rest: the whole run is `want` (cwt_join_i64). */
static void
resumes_at_every_cut(const char *pipeline, const char *want, int total)
{
	cachew_dataset *ds = cwt_parse(pipeline);

	for (int cut = 0; cut <= total; cut++) {
		cachew_iterator *it, *back;
		cachew_element *v[64];
		void *state;
		size_t len, n = 0;
		char *s;

		ck_assert_int_le(total, 64);
		ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL),
		    CACHEW_OK);
		for (int i = 0; i < cut; i++)
			ck_assert_int_eq(cachew_iterator_next(it, &v[n++]),
			    CACHEW_OK);
		ck_assert_int_eq(cachew_iterator_save(it, &state, &len),
		    CACHEW_OK);
		cachew_iterator_destroy(it);
		ck_assert_int_eq(cachew_iterator_restore(&back, ds, NULL, state,
		    len), CACHEW_OK);
		cachew_free(state);
		while (n < 64 && cachew_iterator_next(back, &v[n]) == CACHEW_OK)
			n++;
		s = cwt_join_i64(v, n, 0);
		ck_assert_msg(strcmp(s, want) == 0, "%s cut at %d: %s, want %s",
		    pipeline, cut, s, want);
		free(s);
		for (size_t i = 0; i < n; i++)
			cachew_element_release(v[i]);
		cachew_iterator_destroy(back);
	}
	cachew_dataset_release(ds);
}

/* ---- unique ------------------------------------------------------------- */

/* tf.data: from_tensor_slices([1, 37, 2, 37, 2, 1]).unique() holds 1, 2
 * and 37; the first occurrences come in input order. */
START_TEST(unique_as_in_tf_data_docs)
{
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		char *s;

		cwt_seq_is("from_list([1, 37, 2, 37, 2, 1]) | unique", o,
		    "1,37,2");
		s = str_seq("from_list([\"a\", \"b\", \"a\", \"\", \"c\", "
			    "\"b\", \"\", \"ab\"]) | unique", o);
		ck_assert_str_eq(s, "a,b,,c,ab");
		free(s);
		cwt_seq_is("range(3) | repeat(4) | unique", o, "0,1,2");
		cwt_seq_is("from_list([5, 5, 5]) | unique()", o, "5");
		cwt_seq_is("range(0) | unique", o, "");
		/* After unique, batch sees only the distinct values. */
		cwt_seq_is("range(5) | repeat(2) | unique | batch(2)", o,
		    "[0 1],[2 3],[4]");
		cachew_options_destroy(o);
	}
}
END_TEST

/* Thousands of distinct values (the set grows many times), each kept
 * once, among repeats that never come out again. */
START_TEST(unique_keeps_each_value_once_at_scale)
{
	cachew_element **v = NULL;
	size_t n = 0;
	char errmsg[512] = "";

	ck_assert_int_eq(cwt_run("range(5000) | repeat(3) | unique", NULL, &v,
	    &n, errmsg, sizeof(errmsg)), CACHEW_OK);
	ck_assert_uint_eq(n, 5000);
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(cwt_i64(v[i], 0), (int64_t)i);
	cwt_free(v, n);
	ck_assert_int_eq(cwt_run("counter(start=-3) | take(4000) | "
	    "map(cast, dtype=i32) | unique | take(2)", NULL, &v, &n, errmsg,
	    sizeof(errmsg)), CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	cwt_free(v, n);
}
END_TEST

START_TEST(unique_spec_cardinality_and_builder)
{
	cachew_dataset *in, *ds;
	char *s = NULL;

	spec_card_is("range(10) | unique", "i64[]", CACHEW_CARDINALITY_UNKNOWN);
	spec_card_is("range(0) | unique", "i64[]", 0);
	spec_card_is("from_list([\"x\"]) | unique", "bytes[]",
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cachew_dataset_range(&in, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_unique(&ds, in), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=10, step=1) | unique()");
	cachew_free(s);
	cachew_dataset_release(ds);
	cachew_dataset_release(in);
}
END_TEST

/* tf.data's unique takes one scalar int32, int64 or string component. */
START_TEST(unique_refuses_other_elements)
{
	cachew_dataset *in, *ds = NULL;

	cwt_build_refused("range(4) | batch(2) | unique", CACHEW_ETYPE,
	    "unique: elements are i64[-1]; unique takes elements of one "
	    "scalar integer");
	cwt_build_refused("range(4) | enumerate | unique", CACHEW_ETYPE,
	    "unique: elements are (i64[], i64[])");
	cwt_build_refused("range(4) | map(uniform) | unique", CACHEW_ETYPE,
	    "unique: elements are (i64[], f64[])");
	cwt_build_refused("range(4) | unique(3)", CACHEW_EINVAL, "unique");
	ck_assert_int_eq(cachew_dataset_range(&in, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_batch(&ds, in, 2, 0), CACHEW_OK);
	cachew_dataset_release(in);
	in = ds;
	ds = NULL;
	ck_assert_int_eq(cachew_dataset_unique(&ds, in), CACHEW_ETYPE);
	ck_assert_ptr_null(ds);
	cachew_dataset_release(in);
}
END_TEST

START_TEST(unique_resumes)
{
	resumes_at_every_cut("from_list([4, 4, 1, 4, 2, 1, 3, 3]) | unique",
	    "4,1,2,3", 4);
	resumes_at_every_cut("range(6) | repeat(3) | unique | batch(4)",
	    "[0 1 2 3],[4 5]", 2);
}
END_TEST

/* A saved position holds strings, empty ones included. */
START_TEST(unique_resumes_strings)
{
	cachew_dataset *ds = cwt_parse("from_list([\"b\", \"\", \"b\", \"a\", "
	    "\"\", \"c\"]) | unique");
	cachew_iterator *it, *back;
	cachew_element *e;
	void *state;
	size_t len;
	const void *data;
	size_t dlen;
	const char *rest[] = {"a", "c"};

	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_save(it, &state, &len), CACHEW_OK);
	cachew_iterator_destroy(it);
	ck_assert_int_eq(cachew_iterator_restore(&back, ds, NULL, state, len),
	    CACHEW_OK);
	cachew_free(state);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(cachew_iterator_next(back, &e), CACHEW_OK);
		ck_assert_int_eq(cachew_tensor_bytes_at(
		    cachew_element_component(e, 0), 0, &data, &dlen),
		    CACHEW_OK);
		ck_assert_uint_eq(dlen, 1);
		ck_assert_int_eq(memcmp(data, rest[i], 1), 0);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_next(back, &e), CACHEW_EOF);
	cachew_iterator_destroy(back);
	cachew_dataset_release(ds);
}
END_TEST

/* ---- scan and reduce ------------------------------------------------------- */

/* tf.data: range(10).scan(0, lambda s, i: (s + i, s + i)) is 0, 1, 3, 6,
 * 10, 15, 21, 28, 36, 45. */
START_TEST(scan_as_in_tf_data_docs)
{
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		cwt_seq_is("range(10) | scan(sum)", o,
		    "0,1,3,6,10,15,21,28,36,45");
		cwt_seq_is("range(4) | scan(sum, initial=100)", o,
		    "100,101,103,106");
		cwt_seq_is("range(1, 6) | scan(prod)", o, "1,2,6,24,120");
		cwt_seq_is("from_list([\"a\", \"b\", \"c\"]) | scan(count)", o,
		    "1,2,3");
		cwt_seq_is("from_list([3, 1, 4, 1, 5]) | scan(max)", o,
		    "3,3,4,4,5");
		cwt_seq_is("from_list([3, 1, 4]) | scan(min, initial=2)", o,
		    "2,1,1");
		/* Tensors combine value by value. */
		cwt_seq_is("range(3) | batch(3) | repeat(3) | scan(sum)", o,
		    "[0 1 2],[0 2 4],[0 3 6]");
		/* Integers wrap, as tf.data's do. */
		cwt_seq_is("from_list([2147483647, 1]) | map(cast, dtype=i32) "
			   "| scan(sum) | map(cast, dtype=i64)", o,
		    "2147483647,-2147483648");
		cwt_seq_is("range(0) | scan(sum)", o, "");
		cachew_options_destroy(o);
	}
}
END_TEST

/* tf.data: range(5).reduce(0, lambda x, _: x + 1) is 5, and
 * range(5).reduce(0, lambda x, y: x + y) is 10; here a dataset of one
 * element. */
START_TEST(reduce_as_in_tf_data_docs)
{
	cachew_element **v = NULL;
	size_t n = 0;
	char errmsg[512] = "";

	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		cwt_seq_is("range(5) | reduce(count)", o, "5");
		cwt_seq_is("range(5) | reduce(sum)", o, "10");
		cwt_seq_is("range(1, 6) | reduce(prod)", o, "120");
		cwt_seq_is("from_list([3, 9, 4]) | reduce(max)", o, "9");
		/* An empty input yields the initial state. */
		cwt_seq_is("range(0) | reduce(sum)", o, "0");
		cwt_seq_is("range(0) | reduce(count, initial=7)", o, "7");
		cwt_seq_is("range(0) | reduce(min, initial=-4)", o, "-4");
		cwt_seq_is("range(3) | batch(3) | repeat(2) | reduce(sum)", o,
		    "[0 2 4]");
		cwt_seq_is("range(10) | reduce(sum) | repeat(2)", o, "45,45");
		cwt_run_fails("range(0) | reduce(min)", o, CACHEW_EINVAL,
		    "reduce(min): the input is empty and there is no initial "
		    "value to yield");
		cachew_options_destroy(o);
	}
	ck_assert_int_eq(cwt_run("range(4) | map(cast, dtype=f64) | "
	    "reduce(sum, initial=0.5)", NULL, &v, &n, errmsg, sizeof(errmsg)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_double_eq(cwt_f64(v[0], 0), 6.5);
	cwt_free(v, n);
}
END_TEST

START_TEST(scan_reduce_specs_cardinality_and_builders)
{
	cachew_dataset *in, *ds;
	char *s = NULL;

	spec_card_is("range(10) | scan(sum)", "i64[]", 10);
	spec_card_is("from_list([\"a\"]) | scan(count)", "i64[]", 1);
	spec_card_is("range(10) | batch(3) | scan(max)", "i64[-1]", 4);
	spec_card_is("range(10) | reduce(sum)", "i64[]", 1);
	spec_card_is("range(0) | reduce(count)", "i64[]", 1);
	spec_card_is("range(3) | repeat() | scan(sum)", "i64[]",
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cachew_dataset_range(&in, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_scan(&ds, in, "sum", NULL), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=10, step=1) | "
			    "scan(reducer=sum)");
	cachew_free(s);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_reduce(&ds, in, "min", "-2"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=10, step=1) | "
			    "reduce(reducer=min, initial=-2)");
	cachew_free(s);
	cachew_dataset_release(ds);
	ds = NULL;
	ck_assert_int_eq(cachew_dataset_scan(&ds, in, "mean", NULL),
	    CACHEW_EINVAL);
	ck_assert_ptr_null(ds);
	ck_assert_int_eq(cachew_dataset_reduce(&ds, in, "sum", "0.5"),
	    CACHEW_ETYPE);
	ck_assert_ptr_null(ds);
	cachew_dataset_release(in);
}
END_TEST

START_TEST(scan_reduce_refuse_what_they_cannot_take)
{
	cwt_build_refused("range(3) | scan(mean)", CACHEW_EINVAL,
	    "scan: unknown reducer 'mean': the reducers are sum, prod, min, "
	    "max and count");
	cwt_build_refused("from_list([\"a\"]) | scan(sum)", CACHEW_ETYPE,
	    "scan(sum): component 0 is bytes; the reducer takes u8, i32, "
	    "i64, f32 or f64");
	cwt_build_refused("range(3) | reduce(sum, initial=0.5)", CACHEW_ETYPE,
	    "and a fractional initial only for f32 and f64");
	cwt_build_refused("range(3) | scan(count, initial=1.5)",
	    CACHEW_EINVAL, "scan(count): initial must be an integer");
	cwt_build_refused("range(3) | reduce(sum, initial=\"x\")",
	    CACHEW_EINVAL, "reduce: initial must be a number");
	cwt_build_refused("counter() | reduce(count)", CACHEW_EINVAL,
	    "reduce: the input is infinite");
	/* Elements whose shape changes cannot fold into one state. */
	cwt_run_fails("range(3) | batch(2) | scan(sum)", NULL, CACHEW_ETYPE,
	    "scan(sum): component 0 of element 1 is i64[1] but the state's "
	    "is i64[2]");
}
END_TEST

START_TEST(scan_reduce_resume)
{
	resumes_at_every_cut("range(8) | scan(sum)", "0,1,3,6,10,15,21,28", 8);
	resumes_at_every_cut("from_list([5, 2, 7]) | scan(min)", "5,2,2", 3);
	resumes_at_every_cut("range(5) | reduce(sum) | repeat(3)",
	    "10,10,10", 3);
}
END_TEST

/* ---- window ------------------------------------------------------------------ */

/* tf.data's window docstring, each window batched (its
 * window(...).flat_map(lambda w: w.batch(3))). */
START_TEST(window_as_in_tf_data_docs)
{
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		cwt_seq_is("range(7) | window(3)", o, "[0 1 2],[3 4 5],[6]");
		cwt_seq_is("range(7) | window(3, drop_remainder=true)", o,
		    "[0 1 2],[3 4 5]");
		cwt_seq_is("range(7) | window(3, shift=2, "
			   "drop_remainder=true)", o,
		    "[0 1 2],[2 3 4],[4 5 6]");
		cwt_seq_is("range(7) | window(3, shift=1, "
			   "drop_remainder=true)", o,
		    "[0 1 2],[1 2 3],[2 3 4],[3 4 5],[4 5 6]");
		cwt_seq_is("range(7) | window(3, shift=1, stride=2, "
			   "drop_remainder=true)", o,
		    "[0 2 4],[1 3 5],[2 4 6]");
		/* Without drop_remainder a window starts at every shift. */
		cwt_seq_is("range(7) | window(3, shift=1)", o,
		    "[0 1 2],[1 2 3],[2 3 4],[3 4 5],[4 5 6],[5 6],[6]");
		/* A shift past the window skips elements. */
		cwt_seq_is("range(10) | window(2, shift=4)", o,
		    "[0 1],[4 5],[8 9]");
		cwt_seq_is("range(0) | window(3)", o, "");
		cwt_seq_is("range(2) | window(3, drop_remainder=true)", o, "");
		cwt_seq_is("range(3) | repeat() | window(2, shift=3) | take(3)",
		    o, "[0 1],[0 1],[0 1]");
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(window_specs_cardinality_and_builder)
{
	cachew_dataset *in, *ds = NULL;
	char *s = NULL;

	spec_card_is("range(7) | window(3)", "i64[-1]", 3);
	spec_card_is("range(7) | window(3, drop_remainder=true)", "i64[3]", 2);
	spec_card_is("range(7) | window(3, shift=1)", "i64[-1]", 7);
	spec_card_is("range(7) | window(3, shift=1, stride=2, "
		     "drop_remainder=true)", "i64[3]", 3);
	spec_card_is("range(2) | window(3, drop_remainder=true)", "i64[3]", 0);
	spec_card_is("range(7) | enumerate | window(2, shift=5)",
	    "(i64[-1], i64[-1])", 2);
	spec_card_is("counter() | window(2)", "i64[-1]",
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cachew_dataset_range(&in, 0, 7, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_window(&ds, in, 3, 1, 2, 1),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=7, step=1) | window(size=3, "
			    "shift=1, stride=2, drop_remainder=true)");
	cachew_free(s);
	cachew_dataset_release(ds);
	ds = NULL;
	ck_assert_int_eq(cachew_dataset_window(&ds, in, 0, 0, 1, 0),
	    CACHEW_ERANGE);
	ck_assert_ptr_null(ds);
	cachew_dataset_release(in);
}
END_TEST

START_TEST(window_refuses_bad_parameters)
{
	cwt_build_refused("range(7) | window(0)", CACHEW_ERANGE, "size");
	cwt_build_refused("range(7) | window(3, shift=0)", CACHEW_ERANGE,
	    "window: shift must be an integer from 1");
	cwt_build_refused("range(7) | window(3, stride=0)", CACHEW_ERANGE,
	    "stride");
	cwt_build_refused("range(7) | window()", CACHEW_EINVAL, "size");
	/* Elements of another shape cannot stack into one window. */
	cwt_run_fails("range(3) | batch(2) | window(2)", NULL, CACHEW_ETYPE,
	    "window: ");
}
END_TEST

START_TEST(window_resumes)
{
	resumes_at_every_cut("range(7) | window(3, shift=1)",
	    "[0 1 2],[1 2 3],[2 3 4],[3 4 5],[4 5 6],[5 6],[6]", 7);
	resumes_at_every_cut("range(12) | window(2, shift=5, stride=2)",
	    "[0 2],[5 7],[10]", 3);
}
END_TEST

Suite *
cwt_stream_ops_suite(void)
{
	Suite *s = suite_create("stream_ops");
	TCase *tc = tcase_create("unique");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, unique_as_in_tf_data_docs);
	tcase_add_test(tc, unique_keeps_each_value_once_at_scale);
	tcase_add_test(tc, unique_spec_cardinality_and_builder);
	tcase_add_test(tc, unique_refuses_other_elements);
	tcase_add_test(tc, unique_resumes);
	tcase_add_test(tc, unique_resumes_strings);
	suite_add_tcase(s, tc);

	tc = tcase_create("scan_reduce");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, scan_as_in_tf_data_docs);
	tcase_add_test(tc, reduce_as_in_tf_data_docs);
	tcase_add_test(tc, scan_reduce_specs_cardinality_and_builders);
	tcase_add_test(tc, scan_reduce_refuse_what_they_cannot_take);
	tcase_add_test(tc, scan_reduce_resume);
	suite_add_tcase(s, tc);

	tc = tcase_create("window");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, window_as_in_tf_data_docs);
	tcase_add_test(tc, window_specs_cardinality_and_builder);
	tcase_add_test(tc, window_refuses_bad_parameters);
	tcase_add_test(tc, window_resumes);
	suite_add_tcase(s, tc);
	return s;
}
