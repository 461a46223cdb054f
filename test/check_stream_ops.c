/*
 * check_stream_ops.c - operators whose output depends on the whole
 * stream rather than on one element: unique. Modelled on the examples of
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
	return s;
}
