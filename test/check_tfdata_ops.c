/*
 * check_tfdata_ops.c - more of tf.data (issue 15, part A): ignore_errors
 * (with decode_jpeg over a truncated JPEG), rebatch, range(output_type=),
 * random, padded_batch's per-component padding, batch(parallel=) and the
 * in-memory cache(). Modelled on tf.data's docstring examples, run
 * in-process and through service=embedded.
 */
#include "cwt.h"
#include "../src/tools/gen.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const services[] = {NULL, "embedded"};

/* The value of a scalar of any number dtype, as a double. */
static double
scalar_f64(const cachew_tensor *t)
{
	const void *p = cachew_tensor_data(t);

	ck_assert_int_eq(cachew_tensor_numel(t), 1);
	switch (cachew_tensor_dtype(t)) {
	case CACHEW_F64: return *(const double *)p;
	case CACHEW_F32: return *(const float *)p;
	case CACHEW_I64: return (double)*(const int64_t *)p;
	case CACHEW_I32: return *(const int32_t *)p;
	case CACHEW_U8: return *(const uint8_t *)p;
	default: ck_abort_msg("dtype %s is not a number",
	    cachew_dtype_name(cachew_tensor_dtype(t)));
	}
	return 0;
}

static cachew_err
element_f64(cachew_element **out, double x)
{
	void *p;
	cachew_err rv = cachew_element_create(out, 1);

	if (rv != CACHEW_OK)
		return rv;
	rv = cachew_element_alloc(*out, 0, CACHEW_F64, 0, NULL, &p);
	if (rv != CACHEW_OK) {
		cachew_element_release(*out);
		return rv;
	}
	*(double *)p = x;
	return CACHEW_OK;
}

/* "1,0.5,0.25": component c (a scalar of any number dtype) of every
 * element of a run, %g, comma-joined. Free with free(). */
static char *
num_seq(const char *pipeline, const cachew_options *opts, size_t c)
{
	cachew_element **v = NULL;
	size_t n = 0, len = 0;
	char errmsg[512] = "";
	char *s = calloc(1, 8192);
	cachew_err rv = cwt_run(pipeline, opts, &v, &n, errmsg, sizeof(errmsg));

	ck_assert_msg(rv == CACHEW_OK, "%s: %s", pipeline, errmsg);
	ck_assert_ptr_nonnull(s);
	for (size_t i = 0; i < n; i++) {
		double x = scalar_f64(cachew_element_component(v[i], c));
		len += (size_t)snprintf(s + len, 8192 - len, "%s%g",
		    i > 0 ? "," : "", x);
		ck_assert_uint_lt(len, 8000);
	}
	cwt_free(v, n);
	return s;
}

static void
num_seq_is(const char *pipeline, const cachew_options *opts, size_t c,
    const char *want)
{
	char *s = num_seq(pipeline, opts, c);
	ck_assert_msg(strcmp(s, want) == 0, "%s: %s, want %s", pipeline, s,
	    want);
	free(s);
}

/* ---- ignore_errors ---------------------------------------------------------- */

/* tf.debugging.check_numerics(1. / x): fails (EOP) where x is 0. */
static cachew_err
recip_checked_map(cachew_op_ctx *ctx, cachew_element *in,
    cachew_element **out)
{
	double x = scalar_f64(cachew_element_component(in, 0));
	cachew_element *e;

	cachew_element_release(in);
	if (x == 0)
		return cachew_op_ctx_fail(ctx, "1/x is not finite (x = 0)");
	if (element_f64(&e, 1.0 / x) != CACHEW_OK)
		return CACHEW_ENOMEM;
	*out = e;
	return CACHEW_OK;
}

/* An I/O failure on 3 (not a data error: ignore_errors keeps it). */
static cachew_err
io_on_three_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	double x = scalar_f64(cachew_element_component(in, 0));

	(void)ctx;
	if (x == 3) {
		cachew_element_release(in);
		return CACHEW_EIO;
	}
	*out = in;
	return CACHEW_OK;
}

/* A filter that fails (ECORRUPT) on odd values and keeps the rest. */
static cachew_err
odd_corrupt_filter(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	double x = scalar_f64(cachew_element_component(in, 0));

	if ((int64_t)x % 2 != 0)
		return CACHEW_ECORRUPT;
	(void)ctx;
	*keep = 1;
	return CACHEW_OK;
}

static void register_test_fns(void);

/* The `dropped` of the ignore_errors row of a run read to its end. */
static uint64_t
dropped_of(const char *pipeline, const cachew_options *opts, size_t *count)
{
	cachew_dataset *ds = cwt_parse(pipeline);
	cachew_op_stats rows[32];
	cachew_iterator *it;
	cachew_element *e;
	uint64_t dropped = UINT64_MAX;
	size_t n = 0;
	cachew_err rv;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, opts), CACHEW_OK);
	*count = 0;
	while ((rv = cachew_iterator_next(it, &e)) == CACHEW_OK) {
		cachew_element_release(e);
		(*count)++;
	}
	ck_assert_msg(rv == CACHEW_EOF, "%s: %s", pipeline,
	    cachew_iterator_errmsg(it));
	ck_assert_int_eq(cachew_iterator_stats(it, rows, 32, &n), CACHEW_OK);
	for (size_t i = 0; i < n && i < 32; i++)
		if (strcmp(rows[i].name, "ignore_errors") == 0)
			dropped = rows[i].dropped;
		else
			ck_assert_uint_eq(rows[i].dropped, 0);
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	return dropped;
}

/* tf.data's docstring: from_tensor_slices([1., 2., 0., 4.]).map(lambda x:
 * check_numerics(1. / x)) fails at 0; .ignore_errors() yields 1.0, 0.5,
 * 0.25. Inline and parallel maps, in-process and through the service. */
START_TEST(ignore_errors_as_in_tf_data_docs)
{
	register_test_fns();
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		size_t count = 0;

		cwt_run_fails("from_list([1.0, 2.0, 0.0, 4.0]) | "
			      "map(tfd_recip_checked)", o, CACHEW_EOP,
		    "1/x is not finite");
		num_seq_is("from_list([1.0, 2.0, 0.0, 4.0]) | "
			   "map(tfd_recip_checked) | ignore_errors", o, 0,
		    "1,0.5,0.25");
		num_seq_is("from_list([1.0, 2.0, 0.0, 4.0]) | "
			   "map(tfd_recip_checked, parallel=2) | "
			   "ignore_errors()", o, 0, "1,0.5,0.25");
		/* Every element failing: an empty stream, not an error. */
		num_seq_is("from_list([0.0, 0.0]) | map(tfd_recip_checked) | "
			   "ignore_errors", o, 0, "");
		/* Operators between the function and ignore_errors. */
		num_seq_is("from_list([0.0, 1.0, 0.0, 2.0, 4.0]) | "
			   "map(tfd_recip_checked) | batch(2) | unbatch | "
			   "ignore_errors", o, 0, "1,0.5,0.25");
		/* A filter's data error drops the element too. */
		num_seq_is("range(7) | filter(tfd_odd_corrupt) | ignore_errors",
		    o, 0, "0,2,4,6");
		ck_assert_uint_eq(dropped_of("range(1000) | map(cast, dtype=f64) | "
		    "map(tfd_recip_checked, parallel=2) | ignore_errors", o,
		    &count), 1);
		ck_assert_uint_eq(count, 999);
		ck_assert_uint_eq(dropped_of("range(100) | "
		    "filter(tfd_odd_corrupt) | ignore_errors", o, &count), 50);
		ck_assert_uint_eq(count, 50);
		cachew_options_destroy(o);
	}
}
END_TEST

/* Only data errors are dropped: an I/O failure, a bad parameter and a
 * function above ignore_errors still end the stream. */
START_TEST(ignore_errors_keeps_other_errors)
{
	register_test_fns();
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		cwt_run_fails("range(6) | map(cast, dtype=f64) | "
			      "map(tfd_io_on_three) | ignore_errors", o,
		    CACHEW_EIO, "tfd_io_on_three");
		cwt_run_fails("range(6) | map(cast, dtype=f64) | "
			      "map(tfd_io_on_three, parallel=2) | "
			      "ignore_errors", o, CACHEW_EIO,
		    "tfd_io_on_three");
		cwt_run_fails("from_list([1.0, 0.0]) | ignore_errors | "
			      "map(tfd_recip_checked)", o, CACHEW_EOP,
		    "not finite");
		cachew_options_destroy(o);
	}
}
END_TEST

typedef struct log_capture {
	int warnings;
	char last[512];
} log_capture;

static void
capture_log(void *ctx, cachew_log_level level, const char *module,
    const char *msg)
{
	log_capture *c = ctx;

	if (level == CACHEW_LOG_WARN && strcmp(module, "ignore_errors") == 0) {
		c->warnings++;
		snprintf(c->last, sizeof(c->last), "%s", msg);
	}
}

/* log_warning=true: one counted warning per dropped element, naming the
 * function's reason; none without it. */
START_TEST(ignore_errors_logs_counted_warnings)
{
	log_capture cap = {0};
	char *s;

	register_test_fns();
	cachew_log_set(capture_log, &cap, CACHEW_LOG_WARN);
	s = num_seq("from_list([0.0, 1.0, 0.0, 2.0, 0.0]) | "
		    "map(tfd_recip_checked) | ignore_errors", NULL, 0);
	ck_assert_str_eq(s, "1,0.5");
	free(s);
	ck_assert_int_eq(cap.warnings, 0);
	s = num_seq("from_list([0.0, 1.0, 0.0, 2.0, 0.0]) | "
		    "map(tfd_recip_checked) | ignore_errors(log_warning=true)",
	    NULL, 0);
	ck_assert_str_eq(s, "1,0.5");
	free(s);
	cachew_log_set(NULL, NULL, CACHEW_LOG_ERROR);
	ck_assert_int_eq(cap.warnings, 3);
	ck_assert_msg(strstr(cap.last, "dropped element 4 of "
				       "map(tfd_recip_checked): 1/x is not "
				       "finite (x = 0) (3 dropped so far)") !=
		NULL, "%s", cap.last);
}
END_TEST

/* decode_jpeg over real JPEGs (cachew gen imagenet's encoder), one of them
 * truncated and one overwritten with garbage: without ignore_errors the
 * epoch fails with ECORRUPT; with it the good images come through, in
 * order, and the two bad ones count as dropped. */
START_TEST(ignore_errors_drops_corrupt_jpegs)
{
	char *dir = cwt_tmpdir(), *list = NULL, *p;
	size_t listlen = 0, count = 0;
	FILE *f = open_memstream(&list, &listlen);

	ck_assert_ptr_nonnull(f);
	fputs("from_list([", f);
	for (int i = 0; i < 6; i++) {
		uint8_t *jpeg;
		size_t len;
		char err[256];
		char *path = cwt_fmt("%s/img%d.jpg", dir, i);

		ck_assert_msg(cwi_gen_imagenet_jpeg(7, i, 40 + i, 30, 85, &jpeg,
				  &len, err, sizeof(err)) == CACHEW_OK,
		    "%s", err);
		if (i == 2)
			len /= 3; /* truncated */
		if (i == 4)
			memset(jpeg + 2, 0x5a, len - 2); /* garbage after SOI */
		cwt_write_file(path, jpeg, len);
		free(jpeg);
		fprintf(f, "%s\"%s\"", i > 0 ? ", " : "", path);
		free(path);
	}
	fputs("]) | read_file | decode_jpeg", f);
	ck_assert_int_eq(fclose(f), 0);
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		cachew_element **v = NULL;
		size_t n = 0;
		char errmsg[512];

		cwt_run_fails(list, o, CACHEW_ECORRUPT, "decode_jpeg");
		p = cwt_fmt("%s | ignore_errors", list);
		ck_assert_int_eq(cwt_run(p, o, &v, &n, errmsg, sizeof(errmsg)),
		    CACHEW_OK);
		ck_assert_uint_eq(n, 4);
		/* The widths say which images came: 40, 41, 43, 45. */
		{
			const int64_t want[4] = {40, 41, 43, 45};
			for (size_t i = 0; i < n; i++) {
				const cachew_tensor *t =
				    cachew_element_component(v[i], 0);
				const int64_t *shape = cachew_tensor_shape(t);
				ck_assert_uint_eq(cachew_tensor_rank(t), 3);
				ck_assert_int_eq(shape[0], 30);
				ck_assert_int_eq(shape[1], want[i]);
			}
		}
		cwt_free(v, n);
		ck_assert_uint_eq(dropped_of(p, o, &count), 2);
		ck_assert_uint_eq(count, 4);
		free(p);
		p = cwt_fmt("%s | map(identity, parallel=2) | ignore_errors",
		    list);
		ck_assert_uint_eq(dropped_of(p, o, &count), 2);
		free(p);
		cachew_options_destroy(o);
	}
	free(list);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(ignore_errors_spec_cardinality_and_builder)
{
	cachew_dataset *r, *ds;
	char *s;

	cwt_spec_is("range(4) | ignore_errors", "i64[]");
	ck_assert_int_eq(cwt_card("range(4) | ignore_errors"),
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cachew_dataset_range(&r, 0, 3, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_ignore_errors(&ds, r, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_msg(strstr(s, "ignore_errors(log_warning=true)") != NULL,
	    "%s", s);
	cachew_free(s);
	cachew_dataset_release(ds);
	cachew_dataset_release(r);
	cwt_build_refused("range(4) | ignore_errors(log_warning=3)",
	    CACHEW_EINVAL, "log_warning");
}
END_TEST

/* ---- rebatch ------------------------------------------------------------------ */

/* tf.data's docstring: range(8).batch(4).rebatch(2) and
 * range(16).batch(4).rebatch([2, 1, 1]); batches cross the input's
 * boundaries; drop_remainder; two components. */
START_TEST(rebatch_as_in_tf_data_docs)
{
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		char *s;

		cwt_seq_is("range(8) | batch(4) | rebatch(2)", o,
		    "[0 1],[2 3],[4 5],[6 7]");
		cwt_seq_is("range(16) | batch(4) | rebatch([2, 1, 1])", o,
		    "[0 1],[2],[3],[4 5],[6],[7],[8 9],[10],[11],[12 13],"
		    "[14],[15]");
		cwt_seq_is("range(6) | batch(4) | rebatch(3)", o,
		    "[0 1 2],[3 4 5]");
		cwt_seq_is("range(7) | batch(3) | rebatch(5)", o,
		    "[0 1 2 3 4],[5 6]");
		cwt_seq_is("range(7) | batch(3) | rebatch(5, "
			   "drop_remainder=true)", o, "[0 1 2 3 4]");
		cwt_seq_is("range(7) | batch(2) | rebatch(batch_size=[3, 1], "
			   "drop_remainder=true)", o, "[0 1 2],[3],[4 5 6]");
		cwt_seq_is("range(0) | batch(2) | rebatch(3)", o, "");
		cwt_seq_is("range(5) | batch(5) | rebatch(1) | take(3)", o,
		    "[0],[1],[2]");
		/* Every component is cut alike. */
		s = cwt_seq("range(10, 15) | enumerate | batch(2) | "
			    "rebatch(3) | map(identity)", o);
		ck_assert_str_eq(s, "[0 1 2],[3 4]");
		free(s);
		cachew_options_destroy(o);
	}
	{
		cachew_element **v = NULL;
		size_t n = 0;
		char *s;
		ck_assert_int_eq(cwt_run("range(10, 15) | enumerate | batch(2) "
					 "| rebatch(3)", NULL, &v, &n, NULL, 0),
		    CACHEW_OK);
		s = cwt_join_i64(v, n, 1);
		ck_assert_str_eq(s, "[10 11 12],[13 14]");
		free(s);
		cwt_free(v, n);
	}
}
END_TEST

START_TEST(rebatch_specs_cardinality_and_builder)
{
	const int64_t sizes[3] = {2, 1, 1};
	cachew_dataset *r, *b, *ds;
	char *s;

	cwt_spec_is("range(8) | batch(4) | rebatch(2)", "i64[-1]");
	cwt_spec_is("range(8) | batch(4) | rebatch(2, drop_remainder=true)",
	    "i64[2]");
	cwt_spec_is("range(8) | batch(4) | rebatch([2, 2], "
		    "drop_remainder=true)", "i64[-1]");
	/* Rows unknown (the last input batch may be short): unknown. */
	ck_assert_int_eq(cwt_card("range(8) | batch(4) | rebatch(3)"),
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cwt_card("range(8) | batch(4, drop_remainder=true) | "
				  "rebatch(3)"), 3);
	ck_assert_int_eq(cwt_card("range(8) | batch(4, drop_remainder=true) | "
				  "rebatch(3, drop_remainder=true)"), 2);
	ck_assert_int_eq(cwt_card("range(16) | batch(4, drop_remainder=true) "
				  "| rebatch([2, 1, 1])"), 12);
	ck_assert_int_eq(cwt_card("range(7) | batch(1, drop_remainder=true) | "
				  "rebatch([3, 1])"), 3);
	ck_assert_int_eq(cwt_card("range(6) | batch(1, drop_remainder=true) | "
				  "rebatch([3, 1], drop_remainder=true)"), 2);
	ck_assert_int_eq(cwt_card("counter | batch(2) | rebatch(3)"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cachew_dataset_range(&r, 0, 16, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_batch(&b, r, 4, 0), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_rebatch(&ds, b, sizes, 3, 0),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_msg(strstr(s, "rebatch(batch_size=[2, 1, 1], "
				"drop_remainder=false)") != NULL, "%s", s);
	cachew_free(s);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_rebatch(&ds, b, sizes, 0, 0),
	    CACHEW_ERANGE);
	ck_assert_int_eq(cachew_dataset_rebatch(&ds, b, NULL, 1, 0),
	    CACHEW_EINVAL);
	cachew_dataset_release(b);
	cachew_dataset_release(r);
}
END_TEST

START_TEST(rebatch_refuses_bad_parameters)
{
	cwt_build_refused("range(8) | batch(4) | rebatch(0)", CACHEW_ERANGE,
	    "batch size 0");
	cwt_build_refused("range(8) | batch(4) | rebatch([2, -1])",
	    CACHEW_ERANGE, "item 1");
	cwt_build_refused("range(8) | batch(4) | rebatch([])", CACHEW_ERANGE,
	    "lists 0 sizes");
	cwt_build_refused("range(8) | batch(4) | rebatch(\"2\")",
	    CACHEW_EINVAL, "integer or a list of integers");
	cwt_build_refused("range(8) | rebatch(2)", CACHEW_ETYPE,
	    "is a scalar");
}
END_TEST

START_TEST(rebatch_resumes)
{
	cwt_resumes_at_every_cut("range(16) | batch(4) | rebatch([2, 1, 3])", NULL,
	    "[0 1],[2],[3 4 5],[6 7],[8],[9 10 11],[12 13],[14],[15]", 9);
	cwt_resumes_at_every_cut("range(7) | batch(3) | rebatch(5)", NULL,
	    "[0 1 2 3 4],[5 6]", 2);
}
END_TEST

/* ---- range(output_type=) ------------------------------------------------------ */

/* The dtype of component 0 of every element of a run: all `want`. */
static void
dtypes_are(const char *pipeline, const cachew_options *opts,
    cachew_dtype want)
{
	cachew_element **v = NULL;
	size_t n = 0;
	char errmsg[512] = "";

	ck_assert_msg(cwt_run(pipeline, opts, &v, &n, errmsg, sizeof(errmsg)) ==
	    CACHEW_OK, "%s: %s", pipeline, errmsg);
	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(cachew_tensor_dtype(
		    cachew_element_component(v[i], 0)), want);
	cwt_free(v, n);
}

/* tf.data's docstring: range(2, 5, output_type=tf.int32) is [2, 3, 4],
 * range(1, 5, 2, output_type=tf.float32) is [1.0, 3.0]; and the rest of
 * its examples (i64). */
START_TEST(range_output_type_as_in_tf_data_docs)
{
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		num_seq_is("range(5)", o, 0, "0,1,2,3,4");
		num_seq_is("range(2, 5)", o, 0, "2,3,4");
		num_seq_is("range(1, 5, 2)", o, 0, "1,3");
		num_seq_is("range(1, 5, -2)", o, 0, "");
		num_seq_is("range(5, 1)", o, 0, "");
		num_seq_is("range(5, 1, -2)", o, 0, "5,3");
		num_seq_is("range(2, 5, output_type=i32)", o, 0, "2,3,4");
		dtypes_are("range(2, 5, output_type=i32)", o, CACHEW_I32);
		num_seq_is("range(1, 5, 2, output_type=f32)", o, 0, "1,3");
		dtypes_are("range(1, 5, 2, output_type=float32)", o,
		    CACHEW_F32);
		num_seq_is("range(250, 256, 2, output_type=u8)", o, 0,
		    "250,252,254");
		dtypes_are("range(250, 256, 2, output_type=uint8)", o,
		    CACHEW_U8);
		num_seq_is("range(-3, 3, 2, output_type=f64) | "
			   "map(mul, value=0.5)", o, 0, "-1.5,-0.5,0.5");
		dtypes_are("range(3, output_type=f64)", o, CACHEW_F64);
		/* A split source through the service, batched. */
		cwt_seq_is("range(7, output_type=i32) | map(cast, dtype=i64) | "
			   "batch(3)", o, "[0 1 2],[3 4 5],[6]");
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(range_output_type_spec_and_refusals)
{
	cachew_dataset *ds;
	char *s;

	cwt_spec_is("range(3, output_type=i32)", "i32[]");
	cwt_spec_is("range(3, output_type=float32) | batch(2)", "f32[-1]");
	cwt_spec_is("range(3)", "i64[]");
	ck_assert_int_eq(cwt_card("range(1, 5, 2, output_type=f32)"), 2);
	cwt_build_refused("range(3, output_type=bool)", CACHEW_EINVAL,
	    "output_type must be one of");
	cwt_build_refused("range(3, output_type=3)", CACHEW_EINVAL,
	    "output_type");
	cwt_build_refused("range(250, 257, output_type=u8)", CACHEW_ERANGE,
	    "values from 250 to 256 do not fit output_type u8");
	cwt_build_refused("range(0, -2, -1, output_type=u8)", CACHEW_ERANGE,
	    "values from -1 to 0 do not fit");
	cwt_spec_is("range(0, -1, -1, output_type=u8)", "u8[]");
	cwt_build_refused("range(2147483647, 2147483649, output_type=i32)",
	    CACHEW_ERANGE, "do not fit output_type i32");
	/* The canonical form names a dtype one way. */
	ck_assert_int_eq(cachew_dataset_range_typed(&ds, 1, 5, 2, CACHEW_F32),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=1, stop=5, step=2, output_type=f32)");
	cachew_free(s);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_range_typed(&ds, 1, 5, 2, CACHEW_I64),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=1, stop=5, step=2)");
	cachew_free(s);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_range_typed(&ds, 0, 3, 1, CACHEW_BOOL),
	    CACHEW_EINVAL);
	ck_assert_int_eq(cachew_dataset_range_typed(&ds, 0, 300, 1, CACHEW_U8),
	    CACHEW_ERANGE);
	ds = cwt_parse("range(start=0, stop=3, output_type=float32)");
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=3, step=1, output_type=f32)");
	cachew_free(s);
	cachew_dataset_release(ds);
}
END_TEST

/* ---- random ------------------------------------------------------------------- */

/* tf.data's docstring: Dataset.random(seed=4).take(10) is the same ten
 * values every time; here too, in-process and through the service, and
 * epoch after epoch unless rerandomize_each_iteration. */
START_TEST(random_as_in_tf_data_docs)
{
	cachew_options *o0 = cwt_opts_at(7, 0, NULL);
	cachew_options *o1 = cwt_opts_at(7, 1, NULL);
	cachew_options *e0 = cwt_opts_at(7, 0, "embedded");
	cachew_options *e1 = cwt_opts_at(7, 1, "embedded");
	cachew_options *other = cwt_opts_at(8, 0, NULL);
	char *a, *b;

	a = cwt_seq("random(seed=4) | take(10)", o0);
	b = cwt_seq("random(seed=4) | take(10)", other);
	ck_assert_str_eq(a, b); /* a fixed seed ignores the pipeline's */
	free(b);
	b = cwt_seq("random(seed=4) | take(10)", e1);
	ck_assert_str_eq(a, b); /* the service, another epoch */
	free(b);
	b = cwt_seq("random(seed=5) | take(10)", o0);
	ck_assert_str_ne(a, b);
	free(b);
	/* The first epoch's values repeat under repeat() ... */
	b = cwt_seq("random(seed=4) | take(10) | repeat(2) | skip(10)", o0);
	ck_assert_str_eq(a, b);
	free(b);
	/* ... but not with rerandomize_each_iteration. */
	free(a);
	a = cwt_seq("random(seed=4, rerandomize_each_iteration=true) | "
		    "take(10)", o0);
	b = cwt_seq("random(seed=4, rerandomize_each_iteration=true) | "
		    "take(10) | repeat(2) | skip(10)", o0);
	ck_assert_str_ne(a, b);
	free(b);
	b = cwt_seq("random(seed=4, rerandomize_each_iteration=true) | "
		    "take(10)", o1);
	ck_assert_str_ne(a, b); /* epoch 1 */
	free(b);
	b = cwt_seq("random(seed=4, rerandomize_each_iteration=true) | "
		    "take(10)", e0);
	ck_assert_str_eq(a, b); /* epoch 0 through the service */
	free(b);
	free(a);
	/* seed -1: the pipeline seed's values, the same on the service. */
	a = cwt_seq("random | take(10)", o0);
	b = cwt_seq("random | take(10)", e0);
	ck_assert_str_eq(a, b);
	free(b);
	b = cwt_seq("random | take(10)", other);
	ck_assert_str_ne(a, b);
	free(b);
	b = cwt_seq("random(seed=-1) | take(10)", o1);
	ck_assert_str_eq(a, b); /* not rerandomized: epoch 1 alike */
	free(b);
	free(a);
	cachew_options_destroy(o0);
	cachew_options_destroy(o1);
	cachew_options_destroy(e0);
	cachew_options_destroy(e1);
	cachew_options_destroy(other);
}
END_TEST

/* 20,000 values: all in [0, 2^63), all distinct, mean near 2^62 and each
 * of the low bits set about half the time. */
START_TEST(random_values_are_uniform)
{
	cachew_options *o = cwt_opts_at(3, 0, NULL);
	cachew_element **v = NULL;
	size_t n = 0, ones[4] = {0};
	double mean = 0;
	char errmsg[256];

	ck_assert_int_eq(cwt_run("random | take(20000)", o, &v, &n, errmsg,
			     sizeof(errmsg)), CACHEW_OK);
	ck_assert_uint_eq(n, 20000);
	for (size_t i = 0; i < n; i++) {
		int64_t x = cwt_i64(v[i], 0);
		ck_assert_int_ge(x, 0);
		mean += (double)x / 9223372036854775808.0 / (double)n;
		for (int bit = 0; bit < 4; bit++)
			ones[bit] += (size_t)((x >> bit) & 1);
	}
	/* Standard error of the mean 0.29/sqrt(20000) = 0.002. */
	ck_assert_msg(mean > 0.49 && mean < 0.51, "mean %f", mean);
	for (int bit = 0; bit < 4; bit++)
		ck_assert_msg(ones[bit] > 9700 && ones[bit] < 10300,
		    "bit %d set %zu times", bit, ones[bit]);
	cwt_free(v, n);
	ck_assert_int_eq(cwt_run("random | take(20000) | unique", o, &v, &n,
			     errmsg, sizeof(errmsg)), CACHEW_OK);
	ck_assert_uint_eq(n, 20000);
	cwt_free(v, n);
	cachew_options_destroy(o);
}
END_TEST

START_TEST(random_spec_cardinality_builder_and_resume)
{
	cachew_options *o = cwt_opts_at(3, 0, NULL);
	cachew_dataset *ds, *t;
	char *s, *want, *got;

	cwt_spec_is("random", "i64[]");
	ck_assert_int_eq(cwt_card("random(seed=1)"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("random | take(5)"), 5);
	cwt_build_refused("random(seed=-2)", CACHEW_ERANGE, "seed");
	cwt_build_refused("range(3) | random", CACHEW_EINVAL, "random");
	ck_assert_int_eq(cachew_dataset_random(&ds, 4, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "random(seed=4, rerandomize_each_iteration=true)");
	cachew_free(s);
	ck_assert_int_eq(cachew_dataset_take(&t, ds, 8), CACHEW_OK);
	want = cwt_seq("random(seed=4, rerandomize_each_iteration=true) | "
		       "take(8)", o);
	{
		cachew_element **v = NULL;
		size_t n = 0;
		ck_assert_int_eq(cwt_run_ds(t, o, &v, &n, NULL, 0), CACHEW_OK);
		got = cwt_join_i64(v, n, 0);
		cwt_free(v, n);
	}
	ck_assert_str_eq(got, want);
	free(got);
	free(want);
	cachew_dataset_release(t);
	cachew_dataset_release(ds);
	cachew_options_destroy(o);
	/* Saved after k values, the rest are the same values. */
	want = cwt_seq("random(seed=9) | take(6)", NULL);
	cwt_resumes_at_every_cut("random(seed=9) | take(6)", NULL, want, 6);
	free(want);
}
END_TEST

/* ---- padded_batch: a padding value per component --------------------------------- */

/* "[1 2 3 -1],[4 5 -1 -1]|[10 100],[11 12]": component 0's rows, then
 * component 1's, of the one batch a run yields. */
static char *
two_components(const char *pipeline, const cachew_options *opts)
{
	cachew_element **v = NULL;
	size_t n = 0;
	char errmsg[512] = "", *out = calloc(1, 512);

	ck_assert_msg(cwt_run(pipeline, opts, &v, &n, errmsg, sizeof(errmsg)) ==
	    CACHEW_OK, "%s: %s", pipeline, errmsg);
	ck_assert_uint_eq(n, 1);
	for (size_t c = 0; c < 2; c++) {
		const cachew_tensor *t = cachew_element_component(v[0], c);
		const int64_t *shape = cachew_tensor_shape(t);
		size_t len = strlen(out);
		ck_assert_uint_eq(cachew_tensor_rank(t), 2);
		for (int64_t r = 0; r < shape[0]; r++) {
			len += (size_t)snprintf(out + len, 512 - len, "%s[",
			    r > 0 ? "," : c > 0 ? "|" : "");
			for (int64_t j = 0; j < shape[1]; j++) {
				int64_t i = r * shape[1] + j;
				double x = cachew_tensor_dtype(t) == CACHEW_F64
				    ? ((const double *)cachew_tensor_data(t))[i]
				    : (double)((const int64_t *)
					  cachew_tensor_data(t))[i];
				len += (size_t)snprintf(out + len, 512 - len,
				    "%s%g", j > 0 ? " " : "", x);
			}
			len += (size_t)snprintf(out + len, 512 - len, "]");
		}
	}
	cwt_free(v, n);
	return out;
}

/* tf.data's docstring: elements ([1, 2, 3], [10]) and ([4, 5], [11, 12]),
 * padded_batch(2, padded_shapes=([4], [None]), padding_values=(-1, 100))
 * gives [[1 2 3 -1] [4 5 -1 -1]] and [[10 100] [11 12]]. By position and
 * by name, in-process and through the service. */
START_TEST(padded_batch_values_as_in_tf_data_docs)
{
	static const char *const src =
	    "from_list([([1, 2, 3], [10]), ([4, 5], [11, 12])])";
	static const char *const named =
	    "from_list([{a=[1, 2, 3], b=[10.5]}, {a=[4, 5], b=[11.5, 12.5]}])";

	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		char *p, *s;

		p = cwt_fmt("%s | padded_batch(2, shape=[[4], [-1]], "
			    "pad_value=[-1, 100])", src);
		s = two_components(p, o);
		ck_assert_str_eq(s, "[1 2 3 -1],[4 5 -1 -1]|[10 100],[11 12]");
		free(s);
		free(p);
		/* One value for all, as before. */
		p = cwt_fmt("%s | padded_batch(2, pad_value=7)", src);
		s = two_components(p, o);
		ck_assert_str_eq(s, "[1 2 3],[4 5 7]|[10 7],[11 12]");
		free(s);
		free(p);
		/* By name: b's padding given, a's left at 0. */
		p = cwt_fmt("%s | padded_batch(2, pad_value={b=-0.5})", named);
		s = two_components(p, o);
		ck_assert_str_eq(s, "[1 2 3],[4 5 0]|[10.5 -0.5],[11.5 12.5]");
		free(s);
		free(p);
		p = cwt_fmt("%s | padded_batch(2, pad_value={a=-1, b=2})",
		    named);
		s = two_components(p, o);
		ck_assert_str_eq(s, "[1 2 3],[4 5 -1]|[10.5 2],[11.5 12.5]");
		free(s);
		free(p);
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(padded_batch_values_refusals_and_builder)
{
	static const char *const src =
	    "from_list([([1, 2, 3], [10]), ([4, 5], [11, 12])])";
	cachew_dataset *in, *ds;
	char *p, *s;

	p = cwt_fmt("%s | padded_batch(2, pad_value=[-1])", src);
	cwt_build_refused(p, CACHEW_EINVAL, "lists 1 values but the "
					    "elements have 2 components");
	free(p);
	p = cwt_fmt("%s | padded_batch(2, pad_value={a=1})", src);
	cwt_build_refused(p, CACHEW_EINVAL, "names 'a', which is no "
					    "component");
	free(p);
	p = cwt_fmt("%s | padded_batch(2, pad_value=[\"x\", 1])", src);
	cwt_build_refused(p, CACHEW_EINVAL, "a number, a list of numbers");
	free(p);
	register_test_fns();
	cwt_build_refused("range(3) | map(tfd_recip_checked) | "
			  "padded_batch(2, pad_value={a=1})",
	    CACHEW_EINVAL, "needs the input's component names");
	/* A value the dtype cannot hold fails when padding. */
	p = cwt_fmt("%s | padded_batch(2, pad_value=[0.5, 1])", src);
	cwt_run_fails(p, NULL, CACHEW_EINVAL, "pad_value 0.5 does not fit "
					      "component 0");
	free(p);
	/* The canonical form keeps one number as before. */
	p = cwt_fmt("%s | padded_batch(2, pad_value=1)", src);
	in = cwt_parse(p);
	ck_assert_int_eq(cachew_dataset_to_string(in, &s), CACHEW_OK);
	ck_assert_msg(strstr(s, "padded_batch(n=2, pad_value=1.0, "
				"drop_remainder=false)") != NULL, "%s", s);
	cachew_free(s);
	cachew_dataset_release(in);
	free(p);
	in = cwt_parse(src);
	ck_assert_int_eq(cachew_dataset_padded_batch_values(&ds, in, 2,
			     "[-1, 100]", 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_msg(strstr(s, "padded_batch(n=2, pad_value=[-1.0, 1e+02], "
				"drop_remainder=true)") != NULL, "%s", s);
	cachew_free(s);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_padded_batch_values(&ds, in, 2,
			     "[1, 2, 3]", 0), CACHEW_EINVAL);
	cachew_dataset_release(in);
}
END_TEST

/* ---- batch(parallel=, deterministic=) ---------------------------------------------- */

#define BIG_ROW_BYTES (64 * 1024)

/* Element i becomes i followed by a u8 [BIG_ROW_BYTES] row of bytes
 * (i * 7 + j) % 251: large enough that batch(20) copies over 1 MiB. */
static cachew_err
big_row_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	int64_t shape[1] = {BIG_ROW_BYTES};
	int64_t i = (int64_t)scalar_f64(cachew_element_component(in, 0));
	cachew_element *e;
	uint8_t *p;
	void *data;

	(void)ctx;
	if (cachew_element_create(&e, 2) != CACHEW_OK) {
		cachew_element_release(in);
		return CACHEW_ENOMEM;
	}
	(void)cachew_element_set(e, 0, cachew_element_component(in, 0));
	cachew_element_release(in);
	if (cachew_element_alloc(e, 1, CACHEW_U8, 1, shape, &data) !=
	    CACHEW_OK) {
		cachew_element_release(e);
		return CACHEW_ENOMEM;
	}
	p = data;
	for (int64_t j = 0; j < BIG_ROW_BYTES; j++)
		p[j] = (uint8_t)((i * 7 + j) % 251);
	*out = e;
	return CACHEW_OK;
}


/* tf.data: range(8).batch(3, num_parallel_calls=..., deterministic=True)
 * is [0 1 2], [3 4 5], [6 7]: the same batches as batch(3). Here also
 * batches of 1.3 MiB, which the threads share, byte for byte alike at
 * every parallelism, in-process and through the service. */
START_TEST(batch_parallel_as_in_tf_data_docs)
{
	register_test_fns();
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		char *want, *got;

		ck_assert_int_eq(cachew_options_set_int(o, "threads", 2),
		    CACHEW_OK);
		cwt_seq_is("range(8) | batch(3, parallel=2, "
			   "deterministic=true)", o, "[0 1 2],[3 4 5],[6 7]");
		cwt_seq_is("range(8) | batch(3, true, parallel=auto, "
			   "deterministic=false)", o, "[0 1 2],[3 4 5]");
		want = cwt_hash_seq("range(65) | map(tfd_big_row) | batch(20)",
		    o, 0);
		got = cwt_hash_seq("range(65) | map(tfd_big_row) | batch(20, "
				   "parallel=2)", o, 0);
		ck_assert_str_eq(got, want);
		free(got);
		got = cwt_hash_seq("range(65) | map(tfd_big_row) | batch(20, "
				   "parallel=auto, deterministic=false)", o, 0);
		ck_assert_str_eq(got, want);
		free(got);
		free(want);
		cwt_seq_is("range(65) | map(tfd_big_row) | batch(20, "
			   "parallel=2) | unbatch | map(identity)", o,
		    "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,"
		    "22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,"
		    "41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,"
		    "60,61,62,63,64");
		cachew_options_destroy(o);
	}
	{
		/* The rows land where they belong. */
		cachew_options *o = cwt_opts(1, 2);
		cachew_element **v = NULL;
		size_t n = 0;
		const uint8_t *p;

		ck_assert_int_eq(cwt_run("range(40) | map(tfd_big_row) | "
					 "batch(40, parallel=2)", o, &v, &n,
				     NULL, 0), CACHEW_OK);
		ck_assert_uint_eq(n, 1);
		p = cachew_tensor_data(cachew_element_component(v[0], 1));
		for (int64_t i = 0; i < 40; i += 13)
			for (int64_t j = 0; j < BIG_ROW_BYTES; j += 4099)
				ck_assert_uint_eq(p[i * BIG_ROW_BYTES + j],
				    (uint8_t)((i * 7 + j) % 251));
		cwt_free(v, n);
		cachew_options_destroy(o);
	}
}
END_TEST

START_TEST(batch_parallel_fingerprint_refusals_and_builder)
{
	cachew_dataset *a = cwt_parse("range(8) | batch(3)");
	cachew_dataset *b = cwt_parse("range(8) | batch(3, parallel=2, "
				      "deterministic=false)");
	cachew_dataset *r, *ds;
	cachew_fingerprint fa, fb;
	char *s;

	/* Speed only: the same data, the same fingerprint. */
	ck_assert_int_eq(cachew_dataset_fingerprint(a, &fa), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_fingerprint(b, &fb), CACHEW_OK);
	ck_assert_mem_eq(&fa, &fb, sizeof(fa));
	ck_assert_int_eq(cachew_dataset_to_string(a, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=8, step=1) | batch(n=3, "
			    "drop_remainder=false)");
	cachew_free(s);
	cachew_dataset_release(a);
	cachew_dataset_release(b);
	cwt_spec_is("range(8) | batch(3, true, parallel=2)", "i64[3]");
	cwt_build_refused("range(8) | batch(3, parallel=0)", CACHEW_ERANGE,
	    "parallel");
	cwt_build_refused("range(8) | batch(3, parallel=65)", CACHEW_ERANGE,
	    "parallel");
	cwt_build_refused("range(8) | batch(3, deterministic=2)",
	    CACHEW_EINVAL, "deterministic");
	ck_assert_int_eq(cachew_dataset_range(&r, 0, 8, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_batch_parallel(&ds, r, 3, 0,
			     CACHEW_AUTO, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=8, step=1) | batch(n=3, "
			    "drop_remainder=false, parallel=auto, "
			    "deterministic=true)");
	cachew_free(s);
	cachew_dataset_release(ds);
	cachew_dataset_release(r);
}
END_TEST

/* ---- cache() in memory --------------------------------------------------------- */

static _Atomic long count_calls;

static cachew_err
count_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	atomic_fetch_add(&count_calls, 1);
	*out = in;
	return CACHEW_OK;
}


/* The elements of a run of ds (hash per element, comma-joined), reading
 * at most `max` of them. */
static char *
hashes_of(cachew_dataset *ds, const cachew_options *o, size_t max)
{
	cachew_iterator *it;
	cachew_element *e;
	char *s = calloc(1, max * 17 + 1);
	size_t n = 0;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, o), CACHEW_OK);
	while (n < max && cachew_iterator_next(it, &e) == CACHEW_OK) {
		snprintf(s + n * 17, 18, "%016llx,",
		    (unsigned long long)cachew_element_hash(e));
		cachew_element_release(e);
		n++;
	}
	cachew_iterator_destroy(it);
	return s;
}

/* tf.data's docstring: range(5).map(f).cache(): the first epoch runs f
 * on every element, the second reads memory (f never runs). Random
 * values (drawn per epoch) show which epoch's elements come. */
START_TEST(cache_in_memory_as_in_tf_data_docs)
{
	cachew_options *e0 = cwt_opts_at(1, 0, NULL);
	cachew_options *e1 = cwt_opts_at(1, 1, NULL);
	cachew_options *e2 = cwt_opts_at(1, 2, NULL);
	cachew_dataset *ds;
	char *a, *b, *c;

	register_test_fns();
	cwt_seq_is("range(5) | cache() | repeat(2)", NULL, "0,1,2,3,4,0,1,2,3,"
							 "4");
	ds = cwt_parse("range(5) | map(tfd_count) | cache()");
	atomic_store(&count_calls, 0);
	a = hashes_of(ds, e0, 100);
	ck_assert_int_eq(atomic_load(&count_calls), 5);
	b = hashes_of(ds, e1, 100);
	ck_assert_int_eq(atomic_load(&count_calls), 5); /* from memory */
	ck_assert_str_eq(a, b);
	free(a);
	free(b);
	cachew_dataset_release(ds);
	/* Values drawn per epoch: without the cache the epochs differ. */
	ds = cwt_parse("range(6) | map(uniform) | cache()");
	a = hashes_of(ds, e0, 100);
	b = hashes_of(ds, e1, 100);
	ck_assert_str_eq(a, b);
	free(b);
	free(a);
	cachew_dataset_release(ds);
	a = cwt_hash_seq("range(6) | map(uniform)", e0, 0);
	b = cwt_hash_seq("range(6) | map(uniform)", e1, 0);
	ck_assert_str_ne(a, b);
	free(a);
	free(b);
	/* A partial first pass is discarded: the next full pass computes
	 * (its own epoch's values) and fills; the one after reads it. */
	ds = cwt_parse("range(6) | map(uniform) | cache()");
	a = hashes_of(ds, e0, 2);
	b = hashes_of(ds, e1, 100);
	c = cwt_hash_seq("range(6) | map(uniform)", e1, 0);
	ck_assert_uint_eq(strlen(b), 6 * 17);
	ck_assert_int_eq(strncmp(b, c, strlen(c)), 0);
	ck_assert_int_ne(strncmp(a, b, strlen(a)), 0);
	free(a);
	a = hashes_of(ds, e2, 100);
	ck_assert_str_eq(a, b);
	free(a);
	free(b);
	free(c);
	cachew_dataset_release(ds);
	/* Through the service: the repetitions of one iterator. */
	{
		cachew_options *o = cwt_opts_at(1, 0, "embedded");
		char *run = cwt_hash_seq("range(4) | map(uniform) | cache() | "
					 "repeat(2)", o, 0);
		ck_assert_uint_eq(strlen(run), 8 * 17 - 1);
		ck_assert_int_eq(strncmp(run, run + 4 * 17, 4 * 17 - 1), 0);
		free(run);
		run = cwt_hash_seq("range(4) | map(uniform) | repeat(2)", o, 0);
		ck_assert_int_ne(strncmp(run, run + 4 * 17, 4 * 17 - 1), 0);
		free(run);
		cwt_seq_is("range(5) | cache() | repeat(2)", o,
		    "0,1,2,3,4,0,1,2,3,4");
		cachew_options_destroy(o);
	}
	cachew_options_destroy(e0);
	cachew_options_destroy(e1);
	cachew_options_destroy(e2);
}
END_TEST

/* Past memory_limit a pass fails with ENOMEM naming the limit, and fills
 * nothing: a later pass computes again. */
START_TEST(cache_in_memory_limit_and_resume)
{
	cachew_dataset *ds;
	char *s;

	cwt_run_fails("range(1000) | cache(memory_limit=800)", NULL,
	    CACHEW_ENOMEM, "past its memory_limit of 800 bytes");
	cwt_seq_is("range(100) | cache(memory_limit=800) | take(3)", NULL,
	    "0,1,2");
	cwt_seq_is("range(100) | cache(memory_limit=800)", NULL,
	    "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,"
	    "24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,"
	    "45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,"
	    "66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,"
	    "87,88,89,90,91,92,93,94,95,96,97,98,99");
	cwt_build_refused("range(3) | cache(memory_limit=0)", CACHEW_ERANGE,
	    "memory_limit");
	{
		cachew_dataset *r, *c;
		cachew_element **v = NULL;
		size_t n = 0;
		char errmsg[256] = "";
		ck_assert_int_eq(cachew_dataset_range(&r, 0, 100, 1), CACHEW_OK);
		ck_assert_int_eq(cachew_dataset_cache_memory(&c, r, -1),
		    CACHEW_ERANGE);
		ck_assert_int_eq(cachew_dataset_cache_memory(&c, r, 400),
		    CACHEW_OK);
		ck_assert_int_eq(cwt_run_ds(c, NULL, &v, &n, errmsg,
				     sizeof(errmsg)), CACHEW_ENOMEM);
		ck_assert_msg(strstr(errmsg, "memory_limit of 400") != NULL,
		    "%s", errmsg);
		cachew_dataset_release(c);
		ck_assert_int_eq(cachew_dataset_cache_memory(&c, r, 0),
		    CACHEW_OK);
		ck_assert_int_eq(cwt_run_ds(c, NULL, &v, &n, NULL, 0),
		    CACHEW_OK);
		ck_assert_uint_eq(n, 100);
		cwt_free(v, n);
		cachew_dataset_release(c);
		cachew_dataset_release(r);
	}
	cwt_spec_is("range(3) | cache()", "i64[]");
	ck_assert_int_eq(cwt_card("range(3) | cache()"), 3);
	/* Saved while filling (restored passes fill nothing), then while
	 * reading memory once a whole pass has filled it. */
	ds = cwt_parse("range(6) | cache()");
	cwt_resumes_ds_at_every_cut(ds, "filling", NULL, "0,1,2,3,4,5", 6);
	s = hashes_of(ds, NULL, 100);
	free(s);
	cwt_resumes_ds_at_every_cut(ds, "reading", NULL, "0,1,2,3,4,5", 6);
	cachew_dataset_release(ds);
	/* Saved while filling, restored once another pass completed the
	 * store: the restored pass reads on from memory (it crashed: it
	 * restored an input that a reading pass does not have). */
	{
		cachew_iterator *it;
		cachew_element *e;
		void *state = NULL;
		size_t len = 0;
		int64_t want = 2;

		ds = cwt_parse("range(6) | cache()");
		ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL),
		    CACHEW_OK);
		for (int i = 0; i < 2; i++) {
			ck_assert_int_eq(cachew_iterator_next(it, &e),
			    CACHEW_OK);
			cachew_element_release(e);
		}
		ck_assert_int_eq(cachew_iterator_save(it, &state, &len),
		    CACHEW_OK);
		cachew_iterator_destroy(it);
		s = hashes_of(ds, NULL, 100); /* a whole pass: complete */
		free(s);
		ck_assert_msg(cachew_iterator_restore(&it, ds, NULL, state,
				  len) == CACHEW_OK, "%s", cachew_errmsg());
		while (cachew_iterator_next(it, &e) == CACHEW_OK) {
			ck_assert_int_eq(cwt_i64(e, 0), want++);
			cachew_element_release(e);
		}
		ck_assert_int_eq(want, 6);
		ck_assert_str_eq(cachew_iterator_errmsg(it), "");
		cachew_iterator_destroy(it);
		free(state);
		cachew_dataset_release(ds);
	}
}
END_TEST

/* The test functions above, once per process (CK_FORK=no runs every test
 * in one). */
static void
register_test_fns(void)
{
	static const cachew_op_def defs[] = {
	    {.version = CACHEW_OP_DEF_VERSION, .name = "tfd_recip_checked",
		.kind = CACHEW_OP_MAP, .map = recip_checked_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "tfd_io_on_three",
		.kind = CACHEW_OP_MAP, .map = io_on_three_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "tfd_odd_corrupt",
		.kind = CACHEW_OP_FILTER, .filter = odd_corrupt_filter},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "tfd_big_row",
		.kind = CACHEW_OP_MAP, .map = big_row_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "tfd_count",
		.kind = CACHEW_OP_MAP, .map = count_map},
	};

	for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++) {
		cachew_err rv = cachew_op_register(&defs[i]);
		ck_assert(rv == CACHEW_OK || rv == CACHEW_EEXIST);
	}
}

Suite *
cwt_tfdata_ops_suite(void)
{
	Suite *s = suite_create("tfdata_ops");
	TCase *tc = tcase_create("ignore_errors");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, ignore_errors_as_in_tf_data_docs);
	tcase_add_test(tc, ignore_errors_keeps_other_errors);
	tcase_add_test(tc, ignore_errors_logs_counted_warnings);
	tcase_add_test(tc, ignore_errors_drops_corrupt_jpegs);
	tcase_add_test(tc, ignore_errors_spec_cardinality_and_builder);
	suite_add_tcase(s, tc);

	tc = tcase_create("rebatch");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, rebatch_as_in_tf_data_docs);
	tcase_add_test(tc, rebatch_specs_cardinality_and_builder);
	tcase_add_test(tc, rebatch_refuses_bad_parameters);
	tcase_add_test(tc, rebatch_resumes);
	suite_add_tcase(s, tc);

	tc = tcase_create("range_output_type");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, range_output_type_as_in_tf_data_docs);
	tcase_add_test(tc, range_output_type_spec_and_refusals);
	suite_add_tcase(s, tc);

	tc = tcase_create("random");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, random_as_in_tf_data_docs);
	tcase_add_test(tc, random_values_are_uniform);
	tcase_add_test(tc, random_spec_cardinality_builder_and_resume);
	suite_add_tcase(s, tc);

	tc = tcase_create("padded_batch_values");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, padded_batch_values_as_in_tf_data_docs);
	tcase_add_test(tc, padded_batch_values_refusals_and_builder);
	suite_add_tcase(s, tc);

	tc = tcase_create("batch_parallel");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, batch_parallel_as_in_tf_data_docs);
	tcase_add_test(tc, batch_parallel_fingerprint_refusals_and_builder);
	suite_add_tcase(s, tc);

	tc = tcase_create("cache_in_memory");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, cache_in_memory_as_in_tf_data_docs);
	tcase_add_test(tc, cache_in_memory_limit_and_resume);
	suite_add_tcase(s, tc);
	return s;
}
