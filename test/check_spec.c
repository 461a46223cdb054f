/*
 * check_spec.c - element specs, cardinality and named components, modelled
 * on the examples of tf.data's element_spec and cardinality() docstrings:
 * what building a dataset knows, what it refuses (with the parser's
 * column and caret), and that named components read the same in-process
 * and through service=embedded.
 */
#include "cwt.h"

#include <stdlib.h>
#include <string.h>

/* ---- cardinality ------------------------------------------------------------ */

/* tf.data: range(42).cardinality() == 42; .repeat() INFINITE;
 * .filter(...) UNKNOWN (is_valid_jpeg: a built-in filter, on bytes). */
START_TEST(range_repeat_filter_as_in_tf_data_docs)
{
	ck_assert_int_eq(cwt_card("range(42)"), 42);
	ck_assert_int_eq(cwt_card("range(42) | repeat()"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("from_list([\"a\", \"b\"]) | "
	    "filter(is_valid_jpeg)"), CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cwt_card("text_lines(\"/dev/null\")"),
	    CACHEW_CARDINALITY_UNKNOWN);
}
END_TEST

START_TEST(sources_count_their_elements)
{
	ck_assert_int_eq(cwt_card("range(5, 1)"), 0);
	ck_assert_int_eq(cwt_card("range(0, 10, 3)"), 4);
	ck_assert_int_eq(cwt_card("range(10, 0, -3)"), 4);
	ck_assert_int_eq(cwt_card("from_tensors([1, 2, 3])"), 1);
	ck_assert_int_eq(cwt_card("from_list([1, 2, 3])"), 3);
}
END_TEST

START_TEST(repeat_take_skip_shard)
{
	ck_assert_int_eq(cwt_card("range(10) | repeat(3)"), 30);
	ck_assert_int_eq(cwt_card("range(10) | repeat(0)"), 0);
	ck_assert_int_eq(cwt_card("range(0) | repeat()"), 0);
	ck_assert_int_eq(cwt_card("range(10) | take(3)"), 3);
	ck_assert_int_eq(cwt_card("range(2) | take(3)"), 2);
	ck_assert_int_eq(cwt_card("range(10) | take(-1)"), 10);
	ck_assert_int_eq(cwt_card("range(10) | repeat() | take(7)"), 7);
	ck_assert_int_eq(cwt_card("range(10) | skip(4)"), 6);
	ck_assert_int_eq(cwt_card("range(10) | skip(40)"), 0);
	ck_assert_int_eq(cwt_card("range(10) | skip(-1)"), 0);
	ck_assert_int_eq(cwt_card("range(10) | repeat() | skip(4)"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("range(10) | shard(3, 0)"), 4);
	ck_assert_int_eq(cwt_card("range(10) | shard(3, 1)"), 3);
	ck_assert_int_eq(cwt_card("range(10) | shard(3, 2)"), 3);
}
END_TEST

START_TEST(batch_zip_concatenate_enumerate)
{
	ck_assert_int_eq(cwt_card("range(10) | batch(3)"), 4);
	ck_assert_int_eq(cwt_card("range(10) | batch(3, drop_remainder=true)"),
	    3);
	ck_assert_int_eq(cwt_card("range(10) | repeat() | batch(3)"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("range(10) | batch(5) | unbatch"),
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cwt_card("range(10) | batch(5, drop_remainder=true) | "
	    "unbatch"), 10);
	ck_assert_int_eq(cwt_card("zip(range(3), range(10))"), 3);
	ck_assert_int_eq(cwt_card("zip(range(3), range(10) | repeat())"), 3);
	ck_assert_int_eq(cwt_card("zip(range(3) | repeat(), range(1) | "
	    "repeat())"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("zip(range(3), text_lines(\"/dev/null\"))"),
	    CACHEW_CARDINALITY_UNKNOWN);
	ck_assert_int_eq(cwt_card("range(3) | concatenate(range(4))"), 7);
	ck_assert_int_eq(cwt_card("range(3) | concatenate(range(4) | "
	    "repeat())"),
	    CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("range(3) | enumerate | map(add)"), 3);
}
END_TEST

/* The counted runs yield what the cardinality says. */
START_TEST(cardinality_matches_the_run)
{
	static const char *const pipelines[] = {
	    "range(10) | batch(3)",
	    "range(10) | shard(3, 1)",
	    "range(10) | repeat(3) | skip(4) | take(20)",
	    "range(3) | concatenate(range(4)) | enumerate",
	    "range(10) | batch(5, drop_remainder=true) | unbatch",
	};

	for (size_t i = 0; i < sizeof(pipelines) / sizeof(pipelines[0]); i++) {
		cachew_element **v;
		size_t n;
		char err[256];

		ck_assert_int_eq(cwt_run(pipelines[i], NULL, &v, &n, err,
		    sizeof(err)), CACHEW_OK);
		ck_assert_msg((int64_t)n == cwt_card(pipelines[i]),
		    "%s: %zu elements, cardinality %lld", pipelines[i], n,
		    (long long)cwt_card(pipelines[i]));
		cwt_free(v, n);
	}
}
END_TEST

/* ---- specs ------------------------------------------------------------------ */

/* tf.data: range(5).element_spec is TensorSpec(shape=(), dtype=int64);
 * batch(2) gives shape (None,), and (2,) with drop_remainder. */
START_TEST(specs_follow_the_operators)
{
	cwt_spec_is("range(5)", "i64[]");
	cwt_spec_is("range(5) | batch(2)", "i64[-1]");
	cwt_spec_is("range(5) | batch(2, drop_remainder=true)", "i64[2]");
	cwt_spec_is("range(5) | batch(2, drop_remainder=true) | unbatch",
	    "i64[]");
	cwt_spec_is("from_tensors([[1, 2], [3, 4]])", "i64[2,2]");
	cwt_spec_is("from_tensors((1, 2.5, \"a\", true))",
	    "(i64[], f64[], bytes[], bool[])");
	cwt_spec_is("from_list([[1, 2], [3, 4, 5]])", "i64[-1]");
	cwt_spec_is("from_list([1, 2.5])", "?[]");
	cwt_spec_is("from_list([1, [2]])", "i64[?]");
	cwt_spec_is("from_list([1, (2, 3)])", "?");
	cwt_spec_is("range(3) | enumerate", "(i64[], i64[])");
	cwt_spec_is("zip(range(3), from_list([\"a\"]))", "(i64[], bytes[])");
	cwt_spec_is("text_lines(\"/dev/null\") | tokenize | "
		"pad_truncate(len=16) | batch(4, drop_remainder=true)",
	    "i64[4,16]");
	cwt_spec_is("list_files(\"/dev/null\") | read_file | decode_jpeg",
	    "u8[-1,-1,3]");
	cwt_spec_is("list_files(\"/dev/null\") | random_resized_crop(size=[32, "
		"48]) | transpose",
	    "u8[3,32,48]");
	cwt_spec_is("range(3) | map(cast, dtype=f32)", "f32[]");
	cwt_spec_is("range(3) | map(uniform)", "(i64[], f64[])");
	cwt_spec_is("range(4) | padded_batch(2)", "i64[-1]");
}
END_TEST

/* A function registered from C does not say what it yields: the spec is
 * unknown and checks after it are skipped; the cardinality of a map stays
 * the input's. */
static cachew_err
noop_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	*out = in;
	return CACHEW_OK;
}

START_TEST(user_functions_have_an_unknown_spec)
{
	static const cachew_op_def def = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "spec_test_noop",
	    .kind = CACHEW_OP_MAP,
	    .map = noop_map,
	};
	cachew_dataset *ds;
	cachew_dtype dt;

	ck_assert_int_eq(cachew_op_register(&def), CACHEW_OK);
	ds = cwt_parse("range(4) | map(spec_test_noop)");
	ck_assert_uint_eq(cachew_dataset_num_components(ds), 0);
	ck_assert_int_eq(cachew_dataset_cardinality(ds), 4);
	ck_assert_int_eq(cachew_dataset_component(ds, 0, &dt, NULL, NULL,
	    NULL), CACHEW_EINVAL);
	cachew_dataset_release(ds);
	cwt_spec_is("range(4) | map(spec_test_noop) | batch(2)", "?");
	/* Nothing to check a concatenation against: allowed. */
	ds = cwt_parse("range(4) | map(spec_test_noop) | "
		   "concatenate(from_list([\"a\"]))");
	cachew_dataset_release(ds);
	cwt_build_refused("range(4) | map(spec_test_noop) | "
		"decode_jpeg(component=\"image\")",
	    CACHEW_EINVAL, "components are not known");
}
END_TEST

/* ---- named components -------------------------------------------------------- */

START_TEST(from_tensors_of_a_map_names_components)
{
	cachew_dataset *ds = cwt_parse("from_tensors({label=3, image=[[1, 2], "
				   "[3, 4]]})");
	const char *name = NULL;
	int64_t shape[CACHEW_MAX_RANK];
	cachew_dtype dt;
	size_t i = 99;
	int rank = -2;
	char *s;

	ck_assert_uint_eq(cachew_dataset_num_components(ds), 2);
	/* In key order, as tf.data flattens a dict. */
	ck_assert_int_eq(cachew_dataset_component(ds, 0, &dt, &rank, shape,
	    &name), CACHEW_OK);
	ck_assert_str_eq(name, "image");
	ck_assert_int_eq(dt, CACHEW_I64);
	ck_assert_int_eq(rank, 2);
	ck_assert_int_eq(shape[0], 2);
	ck_assert_int_eq(shape[1], 2);
	ck_assert_int_eq(cachew_dataset_component_find(ds, "label", &i),
	    CACHEW_OK);
	ck_assert_uint_eq(i, 1);
	ck_assert_int_eq(cachew_dataset_component_find(ds, "mask", &i),
	    CACHEW_ENOENT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "'mask'"));
	ck_assert_int_eq(cachew_dataset_spec_str(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "{image: i64[2,2], label: i64[]}");
	cachew_free(s);
	cachew_dataset_release(ds);
	cwt_spec_is("from_tensors({image=[[1, 2], [3, 4]], label=3}) | "
		"repeat(3) | batch(2, drop_remainder=true)",
	    "{image: i64[2,2,2], label: i64[2]}");
	cwt_spec_is("from_tensors(\"x\") | parse_example(label=\"y:i64\", "
		"pixels=\"x:f32:[4]\")",
	    "{label: i64[?], pixels: f32[4]}");
}
END_TEST

/* A named component is addressed by name; the canonical form holds its
 * index and parses back to the same fingerprint. */
START_TEST(map_addresses_a_component_by_name)
{
	static const char *const services[] = {NULL, "embedded"};
	const char *p = "from_list([{ids=[1, 2, 3], label=7}, {ids=[4, 5, 6], "
			"label=8}]) | pad_truncate(len=5, component=\"ids\")";

	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);
		cachew_element **v;
		size_t n;
		char err[256], *s;

		ck_assert_int_eq(cwt_run(p, o, &v, &n, err, sizeof(err)),
		    CACHEW_OK);
		s = cwt_join_i64(v, n, 0);
		ck_assert_str_eq(s, "[1 2 3 0 0],[4 5 6 0 0]");
		free(s);
		s = cwt_join_i64(v, n, 1);
		ck_assert_str_eq(s, "7,8");
		free(s);
		cwt_free(v, n);
		cachew_options_destroy(o);
	}
	cwt_spec_is(p, "{ids: i64[5], label: i64[]}");
}
END_TEST

/* Elements carry their dataset's names out of the iterator, in-process,
 * through the embedded service and after a cache. */
START_TEST(elements_read_by_name)
{
	static const char *const services[] = {NULL, "embedded"};
	char *dir = cwt_tmpdir();
	char *pipelines[2];

	pipelines[0] = cwt_fmt("from_list([{image=[1, 2], label=7}, "
			       "{image=[3, 4], label=8}]) | shuffle(2, seed=1)");
	pipelines[1] = cwt_fmt("from_list([{image=[1, 2], label=7}, "
			       "{image=[3, 4], label=8}]) | cache(\"%s\") | "
			       "batch(2)", dir);
	for (size_t p = 0; p < 2; p++)
		for (size_t k = 0; k < 2; k++) {
			cachew_options *o = cwt_opts_at(1, 0, services[k]);
			cachew_element **v;
			size_t n, i = 99;
			char err[256];

			ck_assert_int_eq(cwt_run(pipelines[p], o, &v, &n, err,
			    sizeof(err)), CACHEW_OK);
			ck_assert_uint_ge(n, 1);
			for (size_t j = 0; j < n; j++) {
				ck_assert_str_eq(cachew_element_name(v[j], 0),
				    "image");
				ck_assert_str_eq(cachew_element_name(v[j], 1),
				    "label");
				ck_assert_ptr_null(cachew_element_name(v[j], 2));
				ck_assert_int_eq(cachew_element_find(v[j],
				    "label", &i), CACHEW_OK);
				ck_assert_uint_eq(i, 1);
				ck_assert_int_eq(cachew_element_find(v[j],
				    "mask", &i), CACHEW_ENOENT);
			}
			cwt_free(v, n);
			cachew_options_destroy(o);
		}
	free(pipelines[0]);
	free(pipelines[1]);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* n batches of {image, label} whose labels are [7 8], named. */
static void
assert_label_batches(cachew_element **v, size_t n, size_t want)
{
	size_t i = 99;
	char *s;

	ck_assert_uint_eq(n, want);
	s = cwt_join_i64(v, n, 1);
	for (size_t j = 0; j < n; j++)
		ck_assert_msg(strncmp(s + j * 6, "[7 8]", 5) == 0, "%s", s);
	ck_assert_uint_eq(strlen(s), n * 6 - 1);
	free(s);
	for (size_t j = 0; j < n; j++) {
		ck_assert_str_eq(cachew_element_name(v[j], 0), "image");
		ck_assert_int_eq(cachew_element_find(v[j], "label", &i),
		    CACHEW_OK);
		ck_assert_uint_eq(i, 1);
	}
}

/* Real worker processes send elements over tcp without names: the client
 * names them from the pipeline it submitted. */
START_TEST(names_survive_remote_workers)
{
	const char *p = "from_list([{image=[1, 2], label=7}, {image=[3, 4], "
			"label=8}]) | repeat(3) | batch(2)";
	cwt_cluster c;
	cachew_options *o;
	cachew_element **v;
	size_t n;
	char err[256];

	cwt_cluster_start(&c, 1);
	o = cwt_opts_at(1, 0, c.dispatcher.url);
	ck_assert_msg(cwt_run(p, o, &v, &n, err, sizeof(err)) == CACHEW_OK,
	    "%s", err);
	assert_label_batches(v, n, 3);
	cwt_free(v, n);
	cachew_options_destroy(o);
	cwt_cluster_stop(&c);
}
END_TEST

/* A cache of named components read by cache_get on a real worker process:
 * the client knows the names from the cache's manifest at build and
 * names what the worker sends. */
START_TEST(cache_get_names_survive_remote_workers)
{
	const char *in = "from_list([{image=[1, 2], label=7}, {image=[3, 4], "
			 "label=8}]) | repeat(2)";
	cachew_dataset *ds = cwt_parse(in);
	cachew_fingerprint fp;
	cwt_cluster c;
	cachew_options *o;
	cachew_element **v;
	size_t n;
	char err[256], hex[33], *put, *get;

	ck_assert_int_eq(cachew_dataset_fingerprint(ds, &fp), CACHEW_OK);
	cachew_dataset_release(ds);
	cachew_fingerprint_hex(&fp, hex);
	/* Under the cluster's cache root: what its workers may read. */
	cwt_cluster_start(&c, 1);
	put = cwt_fmt("%s | cache_put(\"%s/cache\")", in, c.dir);
	ck_assert_int_eq(cwt_run(put, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	cwt_free(v, n);
	get = cwt_fmt("cache_get(\"%s/cache\", \"%s\") | batch(2)", c.dir,
	    hex);
	cwt_spec_is(get, "{image: i64[-1,2], label: i64[-1]}");
	o = cwt_opts_at(1, 0, c.dispatcher.url);
	ck_assert_msg(cwt_run(get, o, &v, &n, err, sizeof(err)) == CACHEW_OK,
	    "%s", err);
	assert_label_batches(v, n, 2);
	cwt_free(v, n);
	cachew_options_destroy(o);
	cwt_cluster_stop(&c);
	free(get);
	free(put);
}
END_TEST

START_TEST(unnamed_elements_have_no_names)
{
	cachew_element **v;
	size_t n, i;
	char err[256];

	ck_assert_int_eq(cwt_run("range(2) | enumerate", NULL, &v, &n, err,
	    sizeof(err)), CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	ck_assert_ptr_null(cachew_element_name(v[0], 0));
	ck_assert_int_eq(cachew_element_find(v[0], "x", &i), CACHEW_ENOENT);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "unnamed"));
	cwt_free(v, n);
}
END_TEST

START_TEST(set_name_builds_named_elements)
{
	cachew_element *e, *shared;
	size_t i = 99;

	ck_assert_int_eq(cachew_element_create(&e, 3), CACHEW_OK);
	ck_assert_int_eq(cachew_element_set_name(e, 0, "image"), CACHEW_OK);
	ck_assert_int_eq(cachew_element_set_name(e, 2, "label"), CACHEW_OK);
	ck_assert_str_eq(cachew_element_name(e, 0), "image");
	ck_assert_ptr_null(cachew_element_name(e, 1));
	ck_assert_int_eq(cachew_element_find(e, "label", &i), CACHEW_OK);
	ck_assert_uint_eq(i, 2);
	ck_assert_int_eq(cachew_element_set_name(e, 1, "label"), CACHEW_EEXIST);
	ck_assert_int_eq(cachew_element_set_name(e, 3, "x"), CACHEW_ERANGE);
	ck_assert_int_eq(cachew_element_set_name(e, 1, ""), CACHEW_EINVAL);
	/* A name caches and the service could not carry is refused here. */
	ck_assert_int_eq(cachew_element_set_name(e, 1, "a\nb"), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_element_set_name(e, 1, "tab\there"), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_element_set_name(e, 2, NULL), CACHEW_OK);
	ck_assert_ptr_null(cachew_element_name(e, 2));
	shared = cachew_element_retain(e);
	ck_assert_int_eq(cachew_element_set_name(e, 1, "mask"), CACHEW_EINVAL);
	cachew_element_release(shared);
	cachew_element_release(e);
}
END_TEST

/* A function registered from C names what it builds; its output's spec is
 * not known, so the iterator keeps the function's names. */
static cachew_err
naming_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	cachew_err rv = cachew_element_set_name(in, 0, "value");

	if (rv != CACHEW_OK) {
		cachew_element_release(in);
		return cachew_op_ctx_fail(ctx, "%s", cachew_errmsg());
	}
	*out = in;
	return CACHEW_OK;
}

START_TEST(user_functions_name_their_output)
{
	static const cachew_op_def def = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "spec_test_naming",
	    .kind = CACHEW_OP_MAP,
	    .map = naming_map,
	};
	cachew_element **v;
	size_t n, i = 99;
	char err[256];

	ck_assert_int_eq(cachew_op_register(&def), CACHEW_OK);
	ck_assert_int_eq(cwt_run("range(3) | map(spec_test_naming)", NULL, &v,
	    &n, err, sizeof(err)), CACHEW_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(cachew_element_find(v[2], "value", &i), CACHEW_OK);
	ck_assert_uint_eq(i, 0);
	ck_assert_int_eq(cwt_i64(v[2], i), 2);
	cwt_free(v, n);
	/* Through a cache: the spec is not known, so the writer records the
	 * names the elements carry, and the pass that reads the cache (the
	 * function is not run) gives them back from the manifest. */
	{
		char *dir = cwt_tmpdir();
		char *p = cwt_fmt("range(3) | map(spec_test_naming) | "
				  "cache(\"%s\")", dir);
		for (int pass = 0; pass < 2; pass++) {
			ck_assert_msg(cwt_run(p, NULL, &v, &n, err,
					  sizeof(err)) == CACHEW_OK, "%s", err);
			ck_assert_uint_eq(n, 3);
			ck_assert_str_eq(cachew_element_name(v[2], 0), "value");
			ck_assert_int_eq(cwt_i64(v[2], 0), 2);
			cwt_free(v, n);
		}
		cwt_rmtree(dir);
		free(p);
		free(dir);
	}
}
END_TEST

START_TEST(named_specs_survive_the_graph_format)
{
	cachew_dataset *ds = cwt_parse("from_tensors({image=[1, 2], label=3}) | "
				   "repeat(4) | batch(2)");
	cachew_dataset *back = NULL;
	void *buf = NULL;
	size_t len = 0;
	char *a, *b;

	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_from_msgpack(&back, buf, len),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_spec_str(ds, &a), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_spec_str(back, &b), CACHEW_OK);
	ck_assert_str_eq(a, "{image: i64[-1,2], label: i64[-1]}");
	ck_assert_str_eq(a, b);
	ck_assert_int_eq(cachew_dataset_cardinality(back), 2);
	cachew_free(a);
	cachew_free(b);
	cachew_free(buf);
	cachew_dataset_release(ds);
	cachew_dataset_release(back);
}
END_TEST

/* ---- refusals when building ----------------------------------------------------- */

/* tf.data refuses concatenating incompatible datasets at construction;
 * cachew used to yield the first input and fail at the second. */
START_TEST(concatenate_of_other_specs_is_refused)
{
	cwt_build_refused("range(3) | concatenate(from_list([\"a\", \"b\"]))",
	    CACHEW_ETYPE, "component 0 is i64[] in one and bytes[] in the "
	    "other");
	cwt_build_refused("range(3) | concatenate(range(3) | enumerate)",
	    CACHEW_ETYPE, "elements of 1 and of 2 components");
	cwt_build_refused("range(3) | batch(2) | concatenate(range(3))",
	    CACHEW_ETYPE, "rank 1 against 0");
	cwt_build_refused("from_tensors({a=1}) | "
	    "concatenate(from_tensors({b=1}))",
	    CACHEW_ETYPE, "named 'a' in one and 'b' in the other");
	/* Dimensions that differ are allowed and become -1. */
	cwt_spec_is("from_tensors([1, 2]) | "
	    "concatenate(from_tensors([1, 2, 3]))",
	    "i64[-1]");
}
END_TEST

START_TEST(wrong_dtypes_and_names_are_refused)
{
	cwt_build_refused("range(3) | decode_jpeg", CACHEW_ETYPE,
	    "decode_jpeg: component 0 is i64[]; expected JPEG bytes");
	cwt_build_refused("range(3) | tokenize", CACHEW_ETYPE,
	    "component 0 is i64[]");
	cwt_build_refused("from_list([\"a\"]) | pad_truncate", CACHEW_ETYPE,
	    "is bytes[]; expected i64 or i32 [n] ids");
	cwt_build_refused("range(3) | map(decode_jpeg, component=\"image\")",
	    CACHEW_ENOENT, "no component is named 'image'");
	cwt_build_refused("from_tensors({image=\"x\", label=1}) | decode_jpeg("
		"component=\"label\")",
	    CACHEW_ETYPE, "component 'label' is i64[]");
	cwt_build_refused("range(3) | decode_jpeg(component=2)", CACHEW_EINVAL,
	    "component 2: the elements have 1 component");
	cwt_build_refused("range(3) | unbatch", CACHEW_ETYPE, "is a scalar");
	cwt_build_refused("zip(from_tensors({a=1}), from_tensors({a=2}))",
	    CACHEW_ETYPE, "names a component 'a' as an earlier input does");
}
END_TEST

START_TEST(filter_keeps_the_spec)
{
	cwt_spec_is("from_list([\"a\", \"b\"]) | filter(is_valid_jpeg)",
	    "bytes[]");
}
END_TEST

/* ---- take_while ------------------------------------------------------------------ */

static cachew_err
below5(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	(void)ctx;
	*keep = cwt_i64(in, 0) < 5;
	return CACHEW_OK;
}

static void
register_below5(void)
{
	static const cachew_op_def def = {
	    .version = CACHEW_OP_DEF_VERSION,
	    .name = "spec_test_below5",
	    .kind = CACHEW_OP_FILTER,
	    .filter = below5,
	};
	cachew_err rv = cachew_op_register(&def);

	ck_assert(rv == CACHEW_OK || rv == CACHEW_EEXIST);
}

/* tf.data: range(10).take_while(lambda x: x < 5) is [0, 1, 2, 3, 4]; it
 * stops at the first rejected element even if later ones pass. */
START_TEST(take_while_as_in_tf_data_docs)
{
	static const char *const services[] = {NULL, "embedded"};
	cachew_dataset *ds, *in;
	char *s;

	register_below5();
	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		s = cwt_seq("range(10) | take_while(spec_test_below5)", o);
		ck_assert_str_eq(s, "0,1,2,3,4");
		free(s);
		s = cwt_seq("from_list([1, 7, 2, 3]) | "
			    "take_while(spec_test_below5)", o);
		ck_assert_str_eq(s, "1");
		free(s);
		s = cwt_seq("range(3) | repeat() | "
			    "take_while(spec_test_below5) | take(4)", o);
		ck_assert_str_eq(s, "0,1,2,0");
		free(s);
		s = cwt_seq("range(100) | batch(7) | unbatch | "
			    "take_while(spec_test_below5) | batch(2)", o);
		ck_assert_str_eq(s, "[0 1],[2 3],[4]");
		free(s);
		cachew_options_destroy(o);
	}
	ck_assert_int_eq(cwt_card("range(10) | take_while(spec_test_below5)"),
	    CACHEW_CARDINALITY_UNKNOWN);
	cwt_spec_is("range(10) | batch(2) | take_while(spec_test_below5)",
	    "i64[-1]");
	ck_assert_int_eq(cachew_dataset_range(&in, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_take_while(&ds, in, "spec_test_below5",
	    NULL), CACHEW_OK);
	s = NULL;
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "range(start=0, stop=10, step=1) | "
			    "take_while(spec_test_below5)");
	cachew_free(s);
	cachew_dataset_release(ds);
	cachew_dataset_release(in);
}
END_TEST

START_TEST(take_while_refuses_a_map_function)
{
	cwt_build_refused("range(3) | take_while(add)", CACHEW_EINVAL,
	    "is a map function, not a filter function");
}
END_TEST

/* A saved position resumes where it was, before and after the rejected
 * element. */
START_TEST(take_while_resumes)
{
	cachew_dataset *ds;

	register_below5();
	ds = cwt_parse("range(10) | take_while(spec_test_below5)");
	for (int cut = 0; cut <= 6; cut++) {
		cachew_iterator *it, *back;
		cachew_element *e;
		void *state;
		size_t len;
		int64_t next = cut;

		ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL),
		    CACHEW_OK);
		for (int i = 0; i < cut && i < 5; i++) {
			ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
			cachew_element_release(e);
		}
		if (cut >= 5)
			ck_assert_int_eq(cachew_iterator_next(it, &e),
			    CACHEW_EOF);
		ck_assert_int_eq(cachew_iterator_save(it, &state, &len),
		    CACHEW_OK);
		cachew_iterator_destroy(it);
		ck_assert_int_eq(cachew_iterator_restore(&back, ds, NULL, state,
		    len), CACHEW_OK);
		cachew_free(state);
		while (cachew_iterator_next(back, &e) == CACHEW_OK) {
			ck_assert_int_eq(cwt_i64(e, 0), next++);
			cachew_element_release(e);
		}
		ck_assert_int_eq(next, 5 > cut ? 5 : cut);
		cachew_iterator_destroy(back);
	}
	cachew_dataset_release(ds);
}
END_TEST

/* ---- counter ------------------------------------------------------------------ */

/* tf.data: Counter().take(5) is [0, 1, 2, 3, 4], Counter(start=2, step=5)
 * .take(5) is [2, 7, 12, 17, 22], Counter(start=0, step=-1).take(5)
 * [0, -1, -2, -3, -4]; its cardinality is INFINITE. */
START_TEST(counter_as_in_tf_data_docs)
{
	static const char *const services[] = {NULL, "embedded"};
	cachew_dataset *ds;
	char *s;

	for (size_t k = 0; k < 2; k++) {
		cachew_options *o = cwt_opts_at(1, 0, services[k]);

		s = cwt_seq("counter | take(5)", o);
		ck_assert_str_eq(s, "0,1,2,3,4");
		free(s);
		s = cwt_seq("counter(start=2, step=5) | take(5)", o);
		ck_assert_str_eq(s, "2,7,12,17,22");
		free(s);
		s = cwt_seq("counter(0, -1) | take(5)", o);
		ck_assert_str_eq(s, "0,-1,-2,-3,-4");
		free(s);
		s = cwt_seq("zip(counter(10), range(3))", o);
		ck_assert_str_eq(s, "10,11,12");
		free(s);
		cachew_options_destroy(o);
	}
	s = cwt_seq("counter(9223372036854775806) | take(3)", NULL);
	ck_assert_str_eq(s, "9223372036854775806,9223372036854775807,"
			    "-9223372036854775808");
	free(s);
	ck_assert_int_eq(cwt_card("counter"), CACHEW_CARDINALITY_INFINITE);
	ck_assert_int_eq(cwt_card("counter | take(7)"), 7);
	ck_assert_int_eq(cwt_card("zip(counter(), range(3))"), 3);
	cwt_spec_is("counter", "i64[]");
	ck_assert_int_eq(cachew_dataset_counter(&ds, 5, 0), CACHEW_OK);
	s = NULL;
	ck_assert_int_eq(cachew_dataset_to_string(ds, &s), CACHEW_OK);
	ck_assert_str_eq(s, "counter(start=5, step=0)");
	cachew_free(s);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(counter_resumes)
{
	cachew_dataset *ds = cwt_parse("counter(3, 4)");
	cachew_iterator *it, *back;
	cachew_element *e;
	void *state;
	size_t len;

	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_save(it, &state, &len), CACHEW_OK);
	cachew_iterator_destroy(it);
	ck_assert_int_eq(cachew_iterator_restore(&back, ds, NULL, state, len),
	    CACHEW_OK);
	cachew_free(state);
	ck_assert_int_eq(cachew_iterator_next(back, &e), CACHEW_OK);
	ck_assert_int_eq(cwt_i64(e, 0), 15);
	cachew_element_release(e);
	cachew_iterator_destroy(back);
	cachew_dataset_release(ds);
}
END_TEST

Suite *
cwt_spec_suite(void)
{
	Suite *s = suite_create("spec");
	TCase *tc = tcase_create("cardinality");

	tcase_add_test(tc, range_repeat_filter_as_in_tf_data_docs);
	tcase_add_test(tc, sources_count_their_elements);
	tcase_add_test(tc, repeat_take_skip_shard);
	tcase_add_test(tc, batch_zip_concatenate_enumerate);
	tcase_add_test(tc, cardinality_matches_the_run);
	suite_add_tcase(s, tc);

	tc = tcase_create("spec");
	tcase_add_test(tc, specs_follow_the_operators);
	tcase_add_test(tc, user_functions_have_an_unknown_spec);
	tcase_add_test(tc, filter_keeps_the_spec);
	suite_add_tcase(s, tc);

	tc = tcase_create("names");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, from_tensors_of_a_map_names_components);
	tcase_add_test(tc, map_addresses_a_component_by_name);
	tcase_add_test(tc, named_specs_survive_the_graph_format);
	tcase_add_test(tc, elements_read_by_name);
	tcase_add_test(tc, unnamed_elements_have_no_names);
	tcase_add_test(tc, set_name_builds_named_elements);
	tcase_add_test(tc, user_functions_name_their_output);
	suite_add_tcase(s, tc);

	tc = tcase_create("service");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, names_survive_remote_workers);
	tcase_add_test(tc, cache_get_names_survive_remote_workers);
	suite_add_tcase(s, tc);

	tc = tcase_create("take_while");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, take_while_as_in_tf_data_docs);
	tcase_add_test(tc, take_while_refuses_a_map_function);
	tcase_add_test(tc, take_while_resumes);
	suite_add_tcase(s, tc);

	tc = tcase_create("counter");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, counter_as_in_tf_data_docs);
	tcase_add_test(tc, counter_resumes);
	suite_add_tcase(s, tc);

	tc = tcase_create("refusals");
	tcase_add_test(tc, concatenate_of_other_specs_is_refused);
	tcase_add_test(tc, wrong_dtypes_and_names_are_refused);
	suite_add_tcase(s, tc);
	return s;
}
