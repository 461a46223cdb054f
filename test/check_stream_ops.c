/*
 * check_stream_ops.c - operators whose output depends on the whole
 * stream rather than on one element: unique, scan, reduce, window,
 * group_by_window, bucket_by_sequence_length and ragged_batch. Modelled
 * on the examples of
 * tf.data's docstrings, run in-process and through service=embedded,
 * with their specs, refusals and saved positions.
 */
#include "cwt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const services[] = {NULL, "embedded"};

static void
spec_card_is(const char *pipeline, const char *want, int64_t card)
{
	cwt_spec_is(pipeline, want);
	ck_assert_int_eq(cwt_card(pipeline), card);
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
		s = cwt_str_seq("from_list([\"a\", \"b\", \"a\", \"\", \"c\", "
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

/* An element unique refuses at run time (its input's spec is not known
 * when the graph is built: from_list of mixed values) after a repeat in
 * the same pulled chunk: the distinct values before it come once each,
 * then the error; the repeat, released, never comes out (it did: the
 * chunk was cut at the refused element, not at the last kept one). */
START_TEST(unique_refusing_mid_chunk_gives_the_kept_ones_once)
{
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 1, services[k]);
		cachew_dataset *ds;
		cachew_iterator *it;
		cachew_element *e;
		int64_t got[8];
		size_t n = 0;
		cachew_err rv;

		ck_assert_int_eq(cachew_dataset_parse(&ds,
				     "from_list([1, 1, 2, 2, \"a\", 3]) | "
				     "unique"), CACHEW_OK);
		ck_assert_int_eq(cachew_iterator_create(&it, ds, o),
		    CACHEW_OK);
		while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
			ck_assert_uint_lt(n, 8);
			got[n++] = cwt_i64(e, 0);
			cachew_element_release(e);
		}
		ck_assert_msg(rv == CACHEW_ETYPE, "%s: %s",
		    cachew_strerror(rv), cachew_iterator_errmsg(it));
		ck_assert_msg(strstr(cachew_iterator_errmsg(it),
				  "element 4 is bytes[]") != NULL, "%s",
		    cachew_iterator_errmsg(it));
		ck_assert_uint_eq(n, 2);
		ck_assert_int_eq(got[0], 1);
		ck_assert_int_eq(got[1], 2);
		cachew_iterator_destroy(it);
		cachew_dataset_release(ds);
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(unique_resumes)
{
	cwt_resumes_at_every_cut("from_list([4, 4, 1, 4, 2, 1, 3, 3]) | "
	    "unique", NULL, "4,1,2,3", 4);
	cwt_resumes_at_every_cut("range(6) | repeat(3) | unique | batch(4)",
	    NULL, "[0 1 2 3],[4 5]", 2);
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
	cwt_resumes_at_every_cut("range(8) | scan(sum)", NULL,
	    "0,1,3,6,10,15,21,28", 8);
	cwt_resumes_at_every_cut("from_list([5, 2, 7]) | scan(min)", NULL,
	    "5,2,2", 3);
	cwt_resumes_at_every_cut("range(5) | reduce(sum) | repeat(3)", NULL,
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
	cwt_resumes_at_every_cut("range(7) | window(3, shift=1)", NULL,
	    "[0 1 2],[1 2 3],[2 3 4],[3 4 5],[4 5 6],[5 6],[6]", 7);
	cwt_resumes_at_every_cut("range(12) | window(2, shift=5, stride=2)",
	    NULL, "[0 2],[5 7],[10]", 3);
}
END_TEST

/* ---- group_by_window, bucket_by_sequence_length, ragged_batch --------------- */

/* Every element of a run as "shape{values}" per component, components
 * joined by '|', elements by ','; i64, i32 and bytes values. Free with
 * free(). */
static char *
elems_str(const char *pipeline, const cachew_options *opts)
{
	cachew_element **v = NULL;
	size_t n = 0, len = 0, cap = 8192;
	char errmsg[512] = "";
	char *s = calloc(1, cap);
	cachew_err rv = cwt_run(pipeline, opts, &v, &n, errmsg, sizeof(errmsg));

	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, errmsg);
	ck_assert_ptr_nonnull(s);
	for (size_t i = 0; i < n; i++) {
		for (size_t c = 0; c < cachew_element_size(v[i]); c++) {
			const cachew_tensor *t = cachew_element_component(v[i],
			    c);
			cachew_dtype dt = cachew_tensor_dtype(t);
			const int64_t *shape = cachew_tensor_shape(t);
			int64_t numel = cachew_tensor_numel(t);

			len += (size_t)snprintf(s + len, cap - len, "%s%s",
			    c > 0 ? "|" : i > 0 ? "," : "",
			    dt == CACHEW_I32 ? "i32:" : "");
			for (unsigned d = 0; d < cachew_tensor_rank(t); d++)
				len += (size_t)snprintf(s + len, cap - len,
				    d > 0 ? "x%lld" : "%lld",
				    (long long)shape[d]);
			len += (size_t)snprintf(s + len, cap - len, "{");
			for (int64_t j = 0; j < numel; j++) {
				const char *sep = j > 0 ? " " : "";
				if (dt == CACHEW_BYTES) {
					const void *data;
					size_t dlen;
					ck_assert_int_eq(cachew_tensor_bytes_at(t,
					    j, &data, &dlen), CACHEW_OK);
					len += (size_t)snprintf(s + len, cap - len,
					    "%s'%.*s'", sep, (int)dlen,
					    (const char *)data);
				} else if (dt == CACHEW_I32) {
					len += (size_t)snprintf(s + len, cap - len,
					    "%s%d", sep, ((const int32_t *)
					    cachew_tensor_data(t))[j]);
				} else {
					ck_assert_int_eq(dt, CACHEW_I64);
					len += (size_t)snprintf(s + len, cap - len,
					    "%s%lld", sep, (long long)((const int64_t *)
					    cachew_tensor_data(t))[j]);
				}
			}
			len += (size_t)snprintf(s + len, cap - len, "}");
			ck_assert_uint_lt(len, cap - 64);
		}
	}
	cwt_free(v, n);
	return s;
}

static void
elems_are(const char *pipeline, const cachew_options *opts, const char *want)
{
	char *s = elems_str(pipeline, opts);

	ck_assert_msg(strcmp(s, want) == 0, "%s: yields %s, want %s", pipeline,
	    s, want);
	free(s);
}

/* A key function registered from C, as a plugin's would be: the length
 * of dimension 0 of component 0 (0 for a scalar), as one i64 scalar. */
static cachew_err
length_key(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const cachew_tensor *t = cachew_element_component(in, 0);
	int64_t len = cachew_tensor_rank(t) > 0 ? cachew_tensor_shape(t)[0] : 0;
	cachew_tensor *k = NULL;
	cachew_element *e = NULL;
	cachew_err rv;

	rv = cachew_tensor_create_scalar(&k, CACHEW_I64, &len);
	if (rv == CACHEW_OK)
		rv = cachew_element_create(&e, 1);
	if (rv == CACHEW_OK)
		rv = cachew_element_set(e, 0, k);
	cachew_tensor_release(k);
	cachew_element_release(in);
	if (rv != CACHEW_OK) {
		cachew_element_release(e);
		return cachew_op_ctx_fail(ctx, "%s", cachew_errmsg());
	}
	*out = e;
	return CACHEW_OK;
}

/* A key function that yields no key: its element unchanged (an f64). */
static cachew_err
same_key(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	*out = in;
	return CACHEW_OK;
}

static void
register_key_fns(void)
{
	static const cachew_op_def len_def = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "gbw_test_length",
	    .kind = CACHEW_OP_MAP,
	    .map = length_key,
	};
	static const cachew_op_def same_def = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "gbw_test_same",
	    .kind = CACHEW_OP_MAP,
	    .map = same_key,
	};
	cachew_err rv = cachew_op_register(&len_def);

	ck_assert(rv == CACHEW_OK || rv == CACHEW_EEXIST);
	rv = cachew_op_register(&same_def);
	ck_assert(rv == CACHEW_OK || rv == CACHEW_EEXIST);
}

/* tf.data's group_by_window docstring (range(10), key x % 2, window 5)
 * and its kernel test (the groups left at the end come in key order). */
START_TEST(group_by_window_as_in_tf_data_docs)
{
	register_key_fns();
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		cwt_seq_is("range(10) | group_by_window(mod, 5, value=2)", o,
		    "[0 2 4 6 8],[1 3 5 7 9]");
		cwt_seq_is("from_list([0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]) | "
			   "group_by_window(fn=mod, window_size=4, value=2)", o,
		    "[0 0 0 0],[1 1 1 1],[0 0 0],[1]");
		cwt_seq_is("from_list([0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]) | "
			   "group_by_window(mod, 4, value=2, "
			   "drop_remainder=true)", o, "[0 0 0 0],[1 1 1 1]");
		/* No group fills: all come at the end, by ascending key,
		 * negative keys first. */
		cwt_seq_is("from_list([5, 3, 5, -1, 3]) | "
			   "group_by_window(identity, 3)", o,
		    "[-1],[3 3],[5 5]");
		cwt_seq_is("range(7) | group_by_window(mod, 1, value=3)", o,
		    "[0],[1],[2],[3],[4],[5],[6]");
		cwt_seq_is("range(0) | group_by_window(mod, 2, value=2)", o, "");
		/* An endless input: groups fill as it goes. */
		cwt_seq_is("counter() | group_by_window(mod, 2, value=3) | "
			   "take(4)", o, "[0 3],[1 4],[2 5],[6 9]");
		/* A key function registered from C: sequences by length. */
		elems_are("from_list([[1], [2, 3], [4], [5, 6], [7, 8, 9]]) | "
			  "group_by_window(gbw_test_length, 2)", o,
		    "2x1{1 4},2x2{2 3 5 6},1x3{7 8 9}");
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(group_by_window_specs_cardinality_and_builder)
{
	cachew_dataset *in, *ds = NULL;
	cachew_params *p = NULL;
	char *s = NULL;

	spec_card_is("range(10) | group_by_window(mod, 5, value=2)", "i64[-1]",
	    CACHEW_CARDINALITY_UNKNOWN);
	spec_card_is("range(10) | group_by_window(mod, 5, value=2, "
		     "drop_remainder=true)", "i64[5]",
	    CACHEW_CARDINALITY_UNKNOWN);
	spec_card_is("range(0) | group_by_window(mod, 5, value=2)", "i64[-1]",
	    0);
	ck_assert_int_eq(cachew_dataset_range(&in, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_params_create(&p), CACHEW_OK);
	ck_assert_int_eq(cachew_params_set_int(p, "value", 2), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_group_by_window(&ds, in, "mod", p, 5,
	    1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=10, step=1) | "
			    "group_by_window(mod, window_size=5, "
			    "drop_remainder=true, value=2)");
	cachew_free(s);
	cachew_dataset_release(ds);
	ds = NULL;
	ck_assert_int_eq(cachew_dataset_group_by_window(&ds, in, "mod", p, 0,
	    0), CACHEW_ERANGE);
	ck_assert_ptr_null(ds);
	ck_assert_int_eq(cachew_dataset_group_by_window(&ds, in, "nope", p, 2,
	    0), CACHEW_ENOENT);
	ck_assert_ptr_null(ds);
	cachew_params_destroy(p);
	cachew_dataset_release(in);
}
END_TEST

START_TEST(group_by_window_refuses_bad_keys)
{
	register_key_fns();
	/* The key function's known output must be one i64 scalar. */
	cwt_build_refused("range(4) | group_by_window(uniform, 2)",
	    CACHEW_ETYPE, "group_by_window: the key function uniform yields "
	    "(i64[], f64[]); a key is one i64 scalar");
	cwt_build_refused("range(4) | map(cast, dtype=f32) | "
			  "group_by_window(mod, 2, value=2)", CACHEW_ETYPE,
	    "mod: component 0 is f32[]");
	cwt_build_refused("range(4) | group_by_window(mod, 0, value=2)",
	    CACHEW_ERANGE, "window_size");
	cwt_build_refused("range(4) | group_by_window(mod, value=2)",
	    CACHEW_EINVAL, "window_size");
	cwt_build_refused("range(4) | group_by_window(mod, 2)", CACHEW_EINVAL,
	    "missing required parameter 'value'");
	cwt_build_refused("range(4) | group_by_window(nope, 2)",
	    CACHEW_ENOENT, "unknown function 'nope'");
	/* A function registered from C says nothing at build time: a wrong
	 * key fails the iterator, naming the element. */
	cwt_run_fails("range(4) | map(cast, dtype=f64) | "
		      "group_by_window(gbw_test_same, 2)", NULL, CACHEW_ETYPE,
	    "group_by_window(gbw_test_same): the key of element 0 is f64[]; "
	    "a key is one i64 scalar");
	/* Elements of one key must stack. */
	cwt_run_fails("from_list([[[1]], [[1, 2]]]) | "
		      "group_by_window(gbw_test_length, 2)", NULL, CACHEW_ETYPE,
	    "group_by_window: key 1: element 1 component 0 is i64[1,2]");
}
END_TEST

START_TEST(group_by_window_resumes)
{
	cwt_resumes_at_every_cut("from_list([0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]) "
			     "| group_by_window(mod, 4, value=2)", NULL,
	    "[0 0 0 0],[1 1 1 1],[0 0 0],[1]", 4);
	cwt_resumes_at_every_cut("from_list([5, 3, 5, -1, 3, 7, 7]) | "
			     "group_by_window(identity, 2)", NULL,
	    "[5 5],[3 3],[7 7],[-1]", 4);
}
END_TEST

static const char *const seqs =
    "from_list([[0], [1, 2, 3, 4], [5, 6, 7], [7, 8, 9, 10, 11], "
    "[13, 14, 15, 16, 19, 20], [21, 22]])";

/* tf.data's bucket_by_sequence_length docstring: its two examples, and
 * the options it documents. */
START_TEST(bucket_by_sequence_length_as_in_tf_data_docs)
{
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		char *p;

		p = cwt_fmt("%s | bucket_by_sequence_length(0, [3, 5], "
			    "[2, 2, 2])", seqs);
		elems_are(p, o, "2x4{1 2 3 4 5 6 7 0},"
				"2x6{7 8 9 10 11 0 13 14 15 16 19 20},"
				"2x2{0 0 21 22}");
		free(p);
		p = cwt_fmt("%s | bucket_by_sequence_length(bucket_boundaries="
			    "[4, 7], bucket_batch_sizes=[2, 2, 2], "
			    "pad_to_bucket_boundary=true, pad_value=-1)", seqs);
		elems_are(p, o, "2x3{0 -1 -1 5 6 7},"
				"2x6{1 2 3 4 -1 -1 7 8 9 10 11 -1},"
				"1x3{21 22 -1},1x6{13 14 15 16 19 20}");
		free(p);
		p = cwt_fmt("%s | bucket_by_sequence_length(0, [3, 5], "
			    "[2, 2, 3], drop_remainder=true)", seqs);
		elems_are(p, o, "2x4{1 2 3 4 5 6 7 0},2x2{0 0 21 22}");
		free(p);
		/* One bucket: padded_batch by arrival. */
		p = cwt_fmt("%s | bucket_by_sequence_length(0, [], [4])", seqs);
		elems_are(p, o, "4x5{0 0 0 0 0 1 2 3 4 0 5 6 7 0 0 7 8 9 10 11},"
				"2x6{13 14 15 16 19 20 21 22 0 0 0 0}");
		free(p);
		/* no_padding: a bucket per length, stacked as batch. */
		elems_are("from_list([[1, 2], [3], [4, 5], [6]]) | "
			  "bucket_by_sequence_length(0, [2], [2, 2], "
			  "no_padding=true)", o, "2x2{1 2 4 5},2x1{3 6}");
		/* By name (components come in name order), with bytes padded
		 * by empty strings. */
		elems_are("from_list([{t=[\"a\", \"b\"], id=1}, {t=[\"c\"], "
			  "id=2}, {t=[\"d\", \"e\", \"f\"], id=3}]) | "
			  "bucket_by_sequence_length(\"t\", [3], [2, 1])", o,
		    "2{1 2}|2x2{'a' 'b' 'c' ''},1{3}|1x3{'d' 'e' 'f'}");
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(bucket_by_sequence_length_specs_cardinality_and_builder)
{
	const int64_t bounds[] = {3, 5}, sizes[] = {2, 2, 2}, same[] = {4, 4, 4};
	cachew_dataset *in, *ds = NULL;
	char *s = NULL, *p;

	p = cwt_fmt("%s | bucket_by_sequence_length(0, [3, 5], [2, 2, 2])",
	    seqs);
	spec_card_is(p, "i64[-1,-1]", CACHEW_CARDINALITY_UNKNOWN);
	free(p);
	p = cwt_fmt("%s | bucket_by_sequence_length(0, [3, 5], [2, 2, 2], "
		    "drop_remainder=true)", seqs);
	spec_card_is(p, "i64[2,-1]", CACHEW_CARDINALITY_UNKNOWN);
	free(p);
	spec_card_is("from_tensors({a=[1, 2], b=3}) | "
		     "bucket_by_sequence_length(\"a\", [3], [2, 3])",
	    "{a: i64[-1,2], b: i64[-1]}", CACHEW_CARDINALITY_UNKNOWN);
	spec_card_is("from_list([[1]]) | take(0) | bucket_by_sequence_length("
		     "0, [3], [2, 3])", "i64[-1,1]", 0);
	ck_assert_int_eq(cachew_dataset_parse(&in, seqs), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_bucket_by_sequence_length(&ds, in,
	    NULL, bounds, 2, sizes, -1, 1, 0, 0), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_ptr_nonnull(strstr(s, "| bucket_by_sequence_length("
	    "element_length=0, bucket_boundaries=[3, 5], bucket_batch_sizes="
	    "[2, 2, 2], pad_value=-1.0, pad_to_bucket_boundary=true, "
	    "no_padding=false, drop_remainder=false)"));
	cachew_free(s);
	cachew_dataset_release(ds);
	ds = NULL;
	ck_assert_int_eq(cachew_dataset_bucket_by_sequence_length(&ds, in,
	    "0", bounds, 2, same, 0, 0, 0, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_cardinality(ds),
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cachew_dataset_spec_str(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "i64[4,-1]");
	cachew_free(s);
	cachew_dataset_release(ds);
	ds = NULL;
	ck_assert_int_eq(cachew_dataset_bucket_by_sequence_length(&ds, in,
	    "len", bounds, 2, sizes, 0, 0, 0, 0), CACHEW_ENOENT);
	ck_assert_int_eq(cachew_dataset_bucket_by_sequence_length(&ds, in,
	    NULL, same, 2, sizes, 0, 0, 0, 0), CACHEW_EINVAL);
	ck_assert_ptr_null(ds);
	cachew_dataset_release(in);
}
END_TEST

START_TEST(bucket_by_sequence_length_refuses_bad_buckets)
{
	cwt_build_refused("from_list([[1]]) | bucket_by_sequence_length(0, "
			  "[5, 3], [1, 1, 1])", CACHEW_EINVAL,
	    "bucket_boundaries must increase: 3 after 5");
	cwt_build_refused("from_list([[1]]) | bucket_by_sequence_length(0, "
			  "[3], [1, 1, 1])", CACHEW_EINVAL,
	    "bucket_batch_sizes has 3 values; it must have one per bucket, "
	    "len(bucket_boundaries) + 1 = 2");
	cwt_build_refused("from_list([[1]]) | bucket_by_sequence_length(0, "
			  "[3], [1, 0])", CACHEW_EINVAL,
	    "bucket_batch_sizes[1] must be an integer >= 1");
	cwt_build_refused("from_list([[1]]) | bucket_by_sequence_length(0, "
			  "[0], [1, 1])", CACHEW_EINVAL,
	    "bucket_boundaries[0] must be an integer >= 1");
	cwt_build_refused("range(3) | bucket_by_sequence_length(0, [3], "
			  "[1, 1])", CACHEW_ETYPE,
	    "element_length is component 0, a scalar");
	cwt_build_refused("from_list([[1]]) | bucket_by_sequence_length(\"x\", "
			  "[3], [1, 1])", CACHEW_ENOENT,
	    "no component is named 'x'");
	cwt_build_refused("from_list([[1]]) | bucket_by_sequence_length(2, "
			  "[3], [1, 1])", CACHEW_EINVAL,
	    "element_length 2 is not a component of the input");
	cwt_build_refused("from_list([[1]]) | bucket_by_sequence_length(0, "
			  "bucket_boundaries=[3])", CACHEW_EINVAL,
	    "bucket_batch_sizes");
	/* tf.data: with pad_to_bucket_boundary no element may reach the last
	 * boundary. */
	cwt_run_fails("from_list([[1], [1, 2, 3]]) | bucket_by_sequence_length("
		      "0, [3], [2, 2], pad_to_bucket_boundary=true)", NULL,
	    CACHEW_ERANGE, "element 1 has length 3; with "
	    "pad_to_bucket_boundary=true, elements must have length < "
	    "max(bucket_boundaries) (3)");
	/* no_padding: elements of one bucket must have one shape. */
	cwt_run_fails("from_list([[1], [1, 2]]) | bucket_by_sequence_length("
		      "0, [5], [2, 2], no_padding=true)", NULL, CACHEW_ETYPE,
	    "bucket_by_sequence_length: key 0: element 1 component 0 is "
	    "i64[2]");
}
END_TEST

START_TEST(bucket_by_sequence_length_resumes)
{
	/* Component 0 of each batch, its rows flattened. */
	cwt_resumes_at_every_cut("from_list([[1], [2, 3], [4], [5, 6, 7], [8, 9], "
			     "[10]]) | bucket_by_sequence_length(0, [2], "
			     "[2, 2])", NULL,
	    "[1 4],[2 3 0 5 6 7],[10],[8 9]", 4);
}
END_TEST

/* tf.data's ragged_batch docstring: range(6) mapped to tf.range(x), then
 * ragged_batch(5): [[], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]] and
 * [[0, 1, 2, 3, 4]], here as flat values and row splits. */
START_TEST(ragged_batch_as_in_tf_data_docs)
{
	static const char *const ranges = "from_list([[], [0], [0, 1], "
	    "[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]])";

	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		char *p;

		p = cwt_fmt("%s | ragged_batch(5)", ranges);
		elems_are(p, o, "10{0 0 1 0 1 2 0 1 2 3}|6{0 0 1 3 6 10},"
				"5{0 1 2 3 4}|2{0 5}");
		free(p);
		p = cwt_fmt("%s | ragged_batch(4, drop_remainder=true, "
			    "row_splits_dtype=i32)", ranges);
		elems_are(p, o, "6{0 0 1 0 1 2}|i32:5{0 0 1 3 6}");
		free(p);
		/* A fully known component stays dense, as in tf.data. */
		p = cwt_fmt("%s | enumerate | ragged_batch(3)", ranges);
		elems_are(p, o, "3{0 1 2}|3{0 0 1}|4{0 0 1 3},"
				"3{3 4 5}|12{0 1 2 0 1 2 3 0 1 2 3 4}|4{0 3 7 12}");
		free(p);
		/* Rows of rank 2 and strings. */
		elems_are("from_list([[[1, 2], [3, 4]], [[5, 6]], [[7, 8]]]) | "
			  "ragged_batch(2)", o,
		    "3x2{1 2 3 4 5 6}|3{0 2 3},1x2{7 8}|2{0 1}");
		elems_are("from_list([[\"a\", \"b\"], [\"\"], [\"c\"]]) | "
			  "ragged_batch(3)", o, "4{'a' 'b' '' 'c'}|4{0 2 3 4}");
		elems_are("range(0) | map(cast, dtype=i32) | ragged_batch(2)", o,
		    "");
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(ragged_batch_specs_cardinality_and_builder)
{
	cachew_dataset *in, *ds = NULL;
	char *s = NULL;

	spec_card_is("from_list([[1], [2, 3]]) | ragged_batch(5)",
	    "(i64[-1], i64[-1])", 1);
	spec_card_is("from_list([[1], [2, 3]]) | ragged_batch(1, "
		     "drop_remainder=true, row_splits_dtype=i32)",
	    "(i64[-1], i32[2])", 2);
	spec_card_is("from_list([{a=[1, 2], b=7}, {a=[3], b=8}]) | "
		     "ragged_batch(2)",
	    "{a: i64[-1], a_row_splits: i64[-1], b: i64[-1]}", 1);
	spec_card_is("from_list([[[1, 2]], [[3, 4], [5, 6]]]) | ragged_batch(2, "
		     "drop_remainder=true)", "(i64[-1,2], i64[3])", 1);
	spec_card_is("range(5) | batch(2, drop_remainder=true) | "
		     "ragged_batch(2, drop_remainder=true)", "i64[2,2]", 1);
	spec_card_is("counter() | ragged_batch(2)", "i64[-1]",
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cachew_dataset_parse(&in, "from_list([[1], [2, 3]])"),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_ragged_batch(&ds, in, 2, 1,
	    CACHEW_I32), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "from_list(values=[[1], [2, 3]]) | ragged_batch("
			    "n=2, drop_remainder=true, row_splits_dtype=i32)");
	cachew_free(s);
	cachew_dataset_release(ds);
	ds = NULL;
	ck_assert_int_eq(cachew_dataset_ragged_batch(&ds, in, 2, 0,
	    CACHEW_F32), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_dataset_ragged_batch(&ds, in, 0, 0,
	    CACHEW_I64), CACHEW_ERANGE);
	ck_assert_ptr_null(ds);
	cachew_dataset_release(in);
	cwt_build_refused("range(3) | ragged_batch(2, row_splits_dtype=f32)",
	    CACHEW_EINVAL, "row_splits_dtype 'f32' is neither i64 nor i32");
	/* Only dimension 0 may vary within a batch. */
	cwt_run_fails("from_list([[[1, 2], [3, 4]], [[5]]]) | ragged_batch(2)",
	    NULL, CACHEW_ETYPE, "ragged_batch: element 1 component 0 is "
	    "i64[1,1], expected i64[2,2] with only dimension 0 varying");
}
END_TEST

START_TEST(ragged_batch_resumes)
{
	cwt_resumes_at_every_cut("from_list([[1], [], [2, 3], [4], [5, 6]]) | "
			     "ragged_batch(2)", NULL, "[1],[2 3 4],[5 6]", 3);
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
	tcase_add_test(tc, unique_refusing_mid_chunk_gives_the_kept_ones_once);
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

	tc = tcase_create("grouping");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, group_by_window_as_in_tf_data_docs);
	tcase_add_test(tc, group_by_window_specs_cardinality_and_builder);
	tcase_add_test(tc, group_by_window_refuses_bad_keys);
	tcase_add_test(tc, group_by_window_resumes);
	tcase_add_test(tc, bucket_by_sequence_length_as_in_tf_data_docs);
	tcase_add_test(tc,
	    bucket_by_sequence_length_specs_cardinality_and_builder);
	tcase_add_test(tc, bucket_by_sequence_length_refuses_bad_buckets);
	tcase_add_test(tc, bucket_by_sequence_length_resumes);
	tcase_add_test(tc, ragged_batch_as_in_tf_data_docs);
	tcase_add_test(tc, ragged_batch_specs_cardinality_and_builder);
	tcase_add_test(tc, ragged_batch_resumes);
	suite_add_tcase(s, tc);
	return s;
}
