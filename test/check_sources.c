/*
 * check_sources.c - the sources (range, from_tensors, from_list,
 * list_files, text_lines, fixed_length_records, read_file), the file
 * functions and the built-in map functions (add, mul, cast, identity,
 * sleep_us, spin_us, uniform).
 */
#include "cwt.h"

/* The file functions are also driven directly, without flat_map. */
#include "../src/sources/sources.h"
#include "../src/pipeline/pipeline.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- helpers --------------------------------------------------------------- */

/* Runs a pipeline that must succeed; returns its elements. */
static cachew_element **
run_ok(const char *pipeline, const cachew_options *opts, size_t *n)
{
	cachew_element **v;
	char err[1024] = "";
	cachew_err rv = cwt_run(pipeline, opts, &v, n, err, sizeof(err));

	ck_assert_msg(rv == CACHEW_OK, "'%s' failed: %s: %s", pipeline,
	    cachew_strerror(rv), err);
	return v;
}

/* Runs a pipeline that must fail with `code` and a message containing
 * `needle`. */
static void
run_fails(const char *pipeline, cachew_err code, const char *needle)
{
	cwt_run_fails(pipeline, NULL, code, needle);
}

/* Component c of every element, a bytes scalar, joined with '|'. */
static char *
join_bytes(cachew_element **v, size_t n, size_t c)
{
	size_t cap = 64, len = 0;
	char *s = malloc(cap);

	ck_assert_ptr_nonnull(s);
	s[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		const cachew_tensor *t = cachew_element_component(v[i], c);
		const void *d;
		size_t l;

		ck_assert_ptr_nonnull(t);
		ck_assert_int_eq(cachew_tensor_dtype(t), CACHEW_BYTES);
		ck_assert_uint_eq(cachew_tensor_rank(t), 0);
		ck_assert_int_eq(cachew_tensor_bytes_at(t, 0, &d, &l), CACHEW_OK);
		while (len + l + 2 > cap) {
			cap *= 2;
			s = realloc(s, cap);
			ck_assert_ptr_nonnull(s);
		}
		if (i > 0)
			s[len++] = '|';
		memcpy(s + len, d, l);
		len += l;
		s[len] = '\0';
	}
	return s;
}

/* Runs a pipeline and returns join_bytes of component 0. */
static char *
seq_bytes(const char *pipeline, const cachew_options *opts)
{
	size_t n;
	cachew_element **v = run_ok(pipeline, opts, &n);
	char *s = join_bytes(v, n, 0);
	cwt_free(v, n);
	return s;
}

static char *
fmt(const char *f, ...) CACHEW_PRINTF(1, 2);

static char *
fmt(const char *f, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, f);
	ck_assert_int_ge(vasprintf(&s, f, ap), 0);
	va_end(ap);
	return s;
}

static void
write_str(const char *dir, const char *name, const char *text)
{
	char *p = fmt("%s/%s", dir, name);
	cwt_write_file(p, text, strlen(text));
	free(p);
}

/* The dtype, rank and shape of a component as "i64[2,3]". */
static void
assert_spec(const cachew_element *e, size_t c, const char *want)
{
	const cachew_tensor *t = cachew_element_component(e, c);
	char buf[128];
	size_t n;

	ck_assert_ptr_nonnull(t);
	n = (size_t)snprintf(buf, sizeof(buf), "%s[",
	    cachew_dtype_name(cachew_tensor_dtype(t)));
	for (unsigned i = 0; i < cachew_tensor_rank(t); i++)
		n += (size_t)snprintf(buf + n, sizeof(buf) - n, i ? ",%lld" : "%lld",
		    (long long)cachew_tensor_shape(t)[i]);
	snprintf(buf + n, sizeof(buf) - n, "]");
	ck_assert_str_eq(buf, want);
}

static uint16_t
u16_at(const cachew_element *e, size_t c, size_t i)
{
	uint16_t h;
	memcpy(&h, (const uint8_t *)cachew_tensor_data(
			cachew_element_component(e, c)) + 2 * i, 2);
	return h;
}

/* ---- from_tensors ----------------------------------------------------------- */

START_TEST(test_from_tensors_int_is_i64_scalar)
{
	size_t n;
	cachew_element **v = run_ok("from_tensors(7)", NULL, &n);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(cachew_element_size(v[0]), 1);
	assert_spec(v[0], 0, "i64[]");
	ck_assert_int_eq(cwt_i64(v[0], 0), 7);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_float_bool_string_scalars)
{
	size_t n;
	cachew_element **v = run_ok("from_tensors((2.5, true, \"hi\"))", NULL, &n);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(cachew_element_size(v[0]), 3);
	assert_spec(v[0], 0, "f64[]");
	ck_assert(cwt_f64(v[0], 0) == 2.5);
	assert_spec(v[0], 1, "bool[]");
	ck_assert_int_eq(*(const uint8_t *)cachew_tensor_data(
			     cachew_element_component(v[0], 1)), 1);
	assert_spec(v[0], 2, "bytes[]");
	char *s = join_bytes(v, n, 2);
	ck_assert_str_eq(s, "hi");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_int_list_is_rank1_i64)
{
	size_t n;
	cachew_element **v = run_ok("from_tensors([1, 2, 3])", NULL, &n);
	char *s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "[1 2 3]");
	assert_spec(v[0], 0, "i64[3]");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_any_float_makes_f64)
{
	size_t n;
	cachew_element **v = run_ok("from_tensors([1, 2.5, -3])", NULL, &n);
	const double *d = cachew_tensor_data(cachew_element_component(v[0], 0));
	assert_spec(v[0], 0, "f64[3]");
	ck_assert(d[0] == 1.0 && d[1] == 2.5 && d[2] == -3.0);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_nested_lists_are_rank_n)
{
	size_t n;
	cachew_element **v =
	    run_ok("from_tensors([[[1, 2], [3, 4], [5, 6]], "
		   "[[7, 8], [9, 10], [11, 12]]])", NULL, &n);
	const int64_t *d = cachew_tensor_data(cachew_element_component(v[0], 0));
	assert_spec(v[0], 0, "i64[2,3,2]");
	for (int i = 0; i < 12; i++)
		ck_assert_int_eq(d[i], i + 1);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_string_list_is_bytes_rank1)
{
	size_t n;
	cachew_element **v =
	    run_ok("from_tensors([\"a\", \"bc\", \"\"])", NULL, &n);
	const cachew_tensor *t = cachew_element_component(v[0], 0);
	const void *d;
	size_t l;
	assert_spec(v[0], 0, "bytes[3]");
	ck_assert_int_eq(cachew_tensor_bytes_at(t, 1, &d, &l), CACHEW_OK);
	ck_assert_uint_eq(l, 2);
	ck_assert_int_eq(memcmp(d, "bc", 2), 0);
	ck_assert_int_eq(cachew_tensor_bytes_at(t, 2, &d, &l), CACHEW_OK);
	ck_assert_uint_eq(l, 0);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_tuple_gives_components)
{
	size_t n;
	cachew_element **v = run_ok("from_tensors((1, \"a\"))", NULL, &n);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(cachew_element_size(v[0]), 2);
	ck_assert_int_eq(cwt_i64(v[0], 0), 1);
	char *s = join_bytes(v, n, 1);
	ck_assert_str_eq(s, "a");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_empty_list_is_i64_shape_0)
{
	size_t n;
	cachew_element **v = run_ok("from_tensors([])", NULL, &n);
	assert_spec(v[0], 0, "i64[0]");
	cwt_free(v, n);
	v = run_ok("from_tensors([[], []])", NULL, &n);
	assert_spec(v[0], 0, "i64[2,0]");
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_bool_list)
{
	size_t n;
	cachew_element **v = run_ok("from_tensors([true, false])", NULL, &n);
	const uint8_t *d = cachew_tensor_data(cachew_element_component(v[0], 0));
	assert_spec(v[0], 0, "bool[2]");
	ck_assert(d[0] == 1 && d[1] == 0);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_tensors_ragged_list_fails_naming_path)
{
	run_fails("from_tensors([[1, 2], [3]])", CACHEW_EINVAL,
	    "from_tensors: values[1] has 1 items where 2 were expected");
	run_fails("from_tensors([[1], 2])", CACHEW_EINVAL,
	    "values[1] is a number where a list of 1 items was expected");
	run_fails("from_tensors([1, [2]])", CACHEW_EINVAL,
	    "values[1] is a list where a scalar was expected");
}
END_TEST

START_TEST(test_from_tensors_mixed_strings_and_numbers_fail)
{
	run_fails("from_tensors([1, \"a\"])", CACHEW_EINVAL,
	    "values mixes strings and numbers (values[1] is a string, "
	    "values[0] is not)");
	run_fails("from_tensors([true, 1])", CACHEW_EINVAL,
	    "mixes bools and numbers");
}
END_TEST

START_TEST(test_from_tensors_deeper_than_rank_8_fails)
{
	run_fails("from_tensors([[[[[[[[[1]]]]]]]]])", CACHEW_EINVAL,
	    "nests lists deeper than 8");
}
END_TEST

START_TEST(test_from_tensors_c_builder)
{
	cachew_dataset *ds;
	cachew_element **v;
	size_t n;

	ck_assert_int_eq(cachew_dataset_from_tensors(&ds, "(1, [2, 3])"),
	    CACHEW_OK);
	ck_assert_int_eq(cwt_run_ds(ds, NULL, &v, &n, NULL, 0), CACHEW_OK);
	ck_assert_uint_eq(n, 1);
	assert_spec(v[0], 0, "i64[]");
	assert_spec(v[0], 1, "i64[2]");
	cwt_free(v, n);
	cachew_dataset_release(ds);
	ck_assert_int_eq(cachew_dataset_from_tensors(&ds, "[[1], [2, 3]]"),
	    CACHEW_EINVAL);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "values[1] has 2 items"));
}
END_TEST

/* ---- from_list --------------------------------------------------------------- */

START_TEST(test_from_list_one_element_per_item)
{
	char *s = cwt_seq("from_list([4, 5, 6])", NULL);
	ck_assert_str_eq(s, "4,5,6");
	free(s);
}
END_TEST

START_TEST(test_from_list_nested_items_are_tensors)
{
	char *s = cwt_seq("from_list([[1, 2], [3, 4]])", NULL);
	ck_assert_str_eq(s, "[1 2],[3 4]");
	free(s);
}
END_TEST

START_TEST(test_from_list_tuple_items_have_components)
{
	size_t n;
	cachew_element **v =
	    run_ok("from_list([(1, \"a\"), (2, \"b\")])", NULL, &n);
	char *s;
	ck_assert_uint_eq(n, 2);
	ck_assert_uint_eq(cachew_element_size(v[1]), 2);
	s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "1,2");
	free(s);
	s = join_bytes(v, n, 1);
	ck_assert_str_eq(s, "a|b");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_from_list_empty_yields_nothing)
{
	char *s = cwt_seq("from_list([])", NULL);
	ck_assert_str_eq(s, "");
	free(s);
}
END_TEST

START_TEST(test_from_list_bad_item_fails_naming_path)
{
	run_fails("from_list([[1, 2], [3, [4]]])", CACHEW_EINVAL,
	    "from_list: values[1][1] is a list where a scalar was expected");
	run_fails("from_list(5)", CACHEW_EINVAL, "must be a list");
}
END_TEST

START_TEST(test_from_list_iterates_again_identically)
{
	cachew_dataset *ds;
	cachew_element **a, **b;
	size_t na, nb;

	ck_assert_int_eq(cachew_dataset_from_list(&ds, "[[1, 2], [3, 4], 5]"),
	    CACHEW_OK);
	ck_assert_int_eq(cwt_run_ds(ds, NULL, &a, &na, NULL, 0), CACHEW_OK);
	ck_assert_int_eq(cwt_run_ds(ds, NULL, &b, &nb, NULL, 0), CACHEW_OK);
	ck_assert_uint_eq(na, 3);
	ck_assert_uint_eq(nb, 3);
	char *sa = cwt_join_i64(a, na, 0), *sb = cwt_join_i64(b, nb, 0);
	ck_assert_str_eq(sa, "[1 2],[3 4],5");
	ck_assert_str_eq(sa, sb);
	free(sa);
	free(sb);
	cwt_free(a, na);
	cwt_free(b, nb);
	cachew_dataset_release(ds);
}
END_TEST

/* ---- list_files ---------------------------------------------------------------- */

/* A directory with files f00.txt .. f{n-1}.txt, created out of order. */
static char *
make_files(int n)
{
	char *d = cwt_tmpdir();
	for (int i = n - 1; i >= 0; i--) {
		char name[32];
		snprintf(name, sizeof(name), "f%02d.txt", i);
		write_str(d, name, name);
	}
	return d;
}

/* The basenames of a list_files run, joined with '|'. */
static char *
list_names(const char *dir, const char *args, const cachew_options *opts)
{
	char *p = fmt("list_files(\"%s/*.txt\"%s)", dir, args);
	char *s = seq_bytes(p, opts);
	char *out = malloc(strlen(s) + 1), *w = out;
	size_t dl = strlen(dir) + 1;

	/* Strip "<dir>/" from each path. */
	for (char *r = s; *r != '\0';) {
		if (strncmp(r, dir, dl - 1) == 0 && r[dl - 1] == '/')
			r += dl;
		while (*r != '\0' && *r != '|')
			*w++ = *r++;
		if (*r == '|')
			*w++ = *r++;
	}
	*w = '\0';
	free(s);
	free(p);
	return out;
}

START_TEST(test_list_files_sorted_without_shuffle)
{
	char *d = make_files(3);
	char *s = list_names(d, ", shuffle=false", NULL);
	ck_assert_str_eq(s, "f00.txt|f01.txt|f02.txt");
	free(s);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_list_files_patterns_sorted_together)
{
	char *d = make_files(4);
	char *p = fmt("list_files([\"%s/f03*\", \"%s/f0[0-1]*\"], "
		      "shuffle=false)", d, d);
	char *s = seq_bytes(p, NULL);
	char *want = fmt("%s/f00.txt|%s/f01.txt|%s/f03.txt", d, d, d);
	ck_assert_str_eq(s, want);
	free(want);
	free(s);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_list_files_shuffle_reproducible_with_seed)
{
	char *d = make_files(20);
	char *a = list_names(d, ", seed=7", NULL);
	char *b = list_names(d, ", seed=7", NULL);
	char *c = list_names(d, ", seed=8", NULL);
	char *sorted = list_names(d, ", shuffle=false", NULL);

	ck_assert_str_eq(a, b);
	ck_assert_str_ne(a, c);
	ck_assert_str_ne(a, sorted);
	ck_assert_uint_eq(strlen(a), strlen(sorted)); /* a permutation */
	for (int i = 0; i < 20; i++) {
		char name[32];
		snprintf(name, sizeof(name), "f%02d.txt", i);
		ck_assert_ptr_nonnull(strstr(a, name));
	}
	free(a);
	free(b);
	free(c);
	free(sorted);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_list_files_reshuffles_per_epoch)
{
	char *d = make_files(20);
	cachew_options *o0 = cwt_opts(1, 0), *o1 = cwt_opts(1, 0);
	char *a, *b, *a2;

	ck_assert_int_eq(cachew_options_set_int(o1, "epoch", 1), CACHEW_OK);
	a = list_names(d, ", seed=7", o0);
	b = list_names(d, ", seed=7", o1);
	a2 = list_names(d, ", seed=7", o0);
	ck_assert_str_ne(a, b);
	ck_assert_str_eq(a, a2);
	free(a);
	free(b);
	free(a2);
	cachew_options_destroy(o0);
	cachew_options_destroy(o1);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_list_files_default_seed_follows_pipeline_seed)
{
	char *d = make_files(20);
	cachew_options *o1 = cwt_opts(1, 0), *o2 = cwt_opts(2, 0);
	char *a = list_names(d, "", o1);
	char *a2 = list_names(d, "", o1);
	char *b = list_names(d, "", o2);

	ck_assert_str_eq(a, a2);
	ck_assert_str_ne(a, b);
	free(a);
	free(a2);
	free(b);
	cachew_options_destroy(o1);
	cachew_options_destroy(o2);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_list_files_no_match_fails_naming_pattern)
{
	char *d = cwt_tmpdir();
	char *p = fmt("list_files(\"%s/*.nope\")", d);
	char *want = fmt("no files match '%s/*.nope'", d);
	run_fails(p, CACHEW_ENOENT, want);
	free(want);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_list_files_c_builder)
{
	char *d = make_files(2);
	char *g = fmt("%s/*.txt", d);
	cachew_dataset *ds;
	cachew_element **v;
	size_t n;

	ck_assert_int_eq(cachew_dataset_list_files(&ds, g, 0, -1), CACHEW_OK);
	ck_assert_int_eq(cwt_run_ds(ds, NULL, &v, &n, NULL, 0), CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	char *s = join_bytes(v, n, 0);
	char *want = fmt("%s/f00.txt|%s/f01.txt", d, d);
	ck_assert_str_eq(s, want);
	free(want);
	free(s);
	cwt_free(v, n);
	cachew_dataset_release(ds);
	free(g);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* ---- text_lines ----------------------------------------------------------------- */

/* text_lines of one file with `text`, extra args appended. */
static char *
lines_of(const char *text, const char *args)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "t.txt", text);
	p = fmt("text_lines(\"%s/t.txt\"%s)", d, args);
	s = seq_bytes(p, NULL);
	free(p);
	cwt_rmtree(d);
	free(d);
	return s;
}

static size_t
count_lines(const char *text, const char *args)
{
	char *d = cwt_tmpdir();
	char *p;
	cachew_element **v;
	size_t n;

	write_str(d, "t.txt", text);
	p = fmt("text_lines(\"%s/t.txt\"%s)", d, args);
	v = run_ok(p, NULL, &n);
	cwt_free(v, n);
	free(p);
	cwt_rmtree(d);
	free(d);
	return n;
}

START_TEST(test_text_lines_strips_newlines)
{
	char *s = lines_of("alpha\nbeta\ngamma\n", "");
	ck_assert_str_eq(s, "alpha|beta|gamma");
	free(s);
}
END_TEST

START_TEST(test_text_lines_strips_crlf_only)
{
	char *s = lines_of("a\r\nb\r\nc\rd\n", "");
	ck_assert_str_eq(s, "a|b|c\rd");
	free(s);
}
END_TEST

START_TEST(test_text_lines_last_line_without_newline)
{
	char *s = lines_of("one\ntwo", "");
	ck_assert_str_eq(s, "one|two");
	free(s);
}
END_TEST

START_TEST(test_text_lines_empty_lines_kept)
{
	ck_assert_uint_eq(count_lines("\n\n", ""), 2);
	char *s = lines_of("\n\n", "");
	ck_assert_str_eq(s, "|");
	free(s);
	s = lines_of("a\n\nb\r\n\r\n", "");
	ck_assert_str_eq(s, "a||b|");
	free(s);
}
END_TEST

START_TEST(test_text_lines_empty_file_yields_nothing)
{
	ck_assert_uint_eq(count_lines("", ""), 0);
}
END_TEST

START_TEST(test_text_lines_lines_across_small_blocks)
{
	/* Every line straddles blocks of 3 bytes; CRLF split by a block
	 * boundary too. */
	const char *text = "first line\r\nsecond\n\nx\nlast one";
	for (int bs = 1; bs <= 8; bs++) {
		char args[32];
		snprintf(args, sizeof(args), ", buffer_size=%d", bs);
		char *s = lines_of(text, args);
		ck_assert_str_eq(s, "first line|second||x|last one");
		free(s);
	}
}
END_TEST

START_TEST(test_text_lines_3mb_line_with_4k_buffer)
{
	size_t big = 3u << 20;
	char *text = malloc(big + 16), *d = cwt_tmpdir(), *p, *path;
	cachew_element **v;
	size_t n;
	const void *data;
	size_t len;

	memcpy(text, "head\n", 5);
	for (size_t i = 0; i < big; i++)
		text[5 + i] = (char)('a' + i % 26);
	memcpy(text + 5 + big, "\ntail\n", 6);
	path = fmt("%s/big.txt", d);
	cwt_write_file(path, text, big + 11);
	p = fmt("text_lines(\"%s\", buffer_size=4096)", path);
	v = run_ok(p, NULL, &n);
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(cachew_tensor_bytes_at(cachew_element_component(v[1], 0),
			     0, &data, &len), CACHEW_OK);
	ck_assert_uint_eq(len, big);
	ck_assert_int_eq(memcmp(data, text + 5, big), 0);
	char *s = join_bytes(v, 1, 0);
	ck_assert_str_eq(s, "head");
	free(s);
	s = join_bytes(v + 2, 1, 0);
	ck_assert_str_eq(s, "tail");
	free(s);
	cwt_free(v, n);
	free(p);
	free(path);
	free(text);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_text_lines_files_in_given_order)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "a.txt", "a1\na2\n");
	write_str(d, "b.txt", "b1\n");
	write_str(d, "c.txt", "");
	write_str(d, "d.txt", "d1\nd2");
	p = fmt("text_lines([\"%s/d.txt\", \"%s/a.txt\", \"%s/c.txt\", "
		"\"%s/b.txt\"])", d, d, d, d);
	s = seq_bytes(p, NULL);
	ck_assert_str_eq(s, "d1|d2|a1|a2|b1");
	free(s);
	free(p);
	p = fmt("text_lines(\"%s/*.txt\")", d);
	s = seq_bytes(p, NULL);
	ck_assert_str_eq(s, "a1|a2|b1|d1|d2");
	free(s);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_text_lines_many_files_many_lines)
{
	char *d = cwt_tmpdir();
	char *p;
	cachew_element **v;
	size_t n;

	for (int f = 0; f < 12; f++) {
		char name[32], line[32];
		char *text = malloc(1000 * 16), *w = text;
		snprintf(name, sizeof(name), "p%02d.txt", f);
		for (int i = 0; i < 1000; i++) {
			int l = snprintf(line, sizeof(line), "%d\n", f * 1000 + i);
			memcpy(w, line, (size_t)l);
			w += l;
		}
		*w = '\0';
		write_str(d, name, text);
		free(text);
	}
	p = fmt("text_lines(\"%s/p*.txt\", buffer_size=1000)", d);
	v = run_ok(p, NULL, &n);
	ck_assert_uint_eq(n, 12000);
	for (size_t i = 0; i < n; i++) {
		const void *data;
		size_t len;
		char want[32];
		snprintf(want, sizeof(want), "%zu", i);
		ck_assert_int_eq(cachew_tensor_bytes_at(
				     cachew_element_component(v[i], 0), 0, &data,
				     &len), CACHEW_OK);
		ck_assert_uint_eq(len, strlen(want));
		ck_assert_int_eq(memcmp(data, want, len), 0);
	}
	cwt_free(v, n);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_text_lines_are_views_of_one_block)
{
	char *d = cwt_tmpdir();
	char *p;
	cachew_element **v;
	size_t n, l0, l1;
	const void *d0, *d1;

	write_str(d, "t.txt", "abc\nde\n");
	p = fmt("text_lines(\"%s/t.txt\")", d);
	v = run_ok(p, NULL, &n);
	ck_assert_uint_eq(n, 2);
	cachew_tensor_bytes_at(cachew_element_component(v[0], 0), 0, &d0, &l0);
	cachew_tensor_bytes_at(cachew_element_component(v[1], 0), 0, &d1, &l1);
	/* No copy: line 2 starts right after line 1's newline. */
	ck_assert_ptr_eq((const char *)d0 + 4, d1);
	cwt_free(v, n);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_text_lines_missing_file_fails_naming_it)
{
	char *d = cwt_tmpdir();
	char *p = fmt("text_lines([\"%s/a.txt\", \"%s/gone.txt\"])", d, d);
	char *want = fmt("%s/gone.txt", d);

	write_str(d, "a.txt", "x\n");
	run_fails(p, CACHEW_ENOENT, want);
	free(p);
	p = fmt("text_lines(\"%s/*.log\")", d);
	run_fails(p, CACHEW_ENOENT, "no files match");
	free(want);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_text_lines_delivers_lines_before_a_failing_file)
{
	char *d = cwt_tmpdir();
	char *p = fmt("text_lines([\"%s/a.txt\", \"%s\"])", d, d);
	cachew_dataset *ds;
	cachew_iterator *it;
	cachew_element *e;

	write_str(d, "a.txt", "x\ny\n");
	ck_assert_int_eq(cachew_dataset_parse(&ds, p), CACHEW_OK);
	ck_assert_int_eq(cachew_iterator_create(&it, ds, NULL), CACHEW_OK);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_OK);
		cachew_element_release(e);
	}
	ck_assert_int_eq(cachew_iterator_next(it, &e), CACHEW_EIO);
	ck_assert_ptr_nonnull(strstr(cachew_iterator_errmsg(it),
	    "is a directory"));
	cachew_iterator_destroy(it);
	cachew_dataset_release(ds);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

static void
fingerprint_of(const char *pipeline, char hex[33])
{
	cachew_dataset *ds;
	cachew_fingerprint fp;

	ck_assert_msg(cachew_dataset_parse(&ds, pipeline) == CACHEW_OK, "%s: %s",
	    pipeline, cachew_errmsg());
	ck_assert_int_eq(cachew_dataset_fingerprint(ds, &fp), CACHEW_OK);
	cachew_fingerprint_hex(&fp, hex);
	cachew_dataset_release(ds);
}

START_TEST(test_text_lines_fingerprint_tracks_file_identity)
{
	char *d = cwt_tmpdir();
	char *path = fmt("%s/t.txt", d);
	char *p = fmt("text_lines(\"%s\")", path);
	char *p_buf = fmt("text_lines(\"%s\", buffer_size=4096)", path);
	char a[33], b[33], e[33], f[33];
	struct timespec ts[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};

	write_str(d, "t.txt", "hello\n");
	ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
	fingerprint_of(p, a);
	fingerprint_of(p, b);
	ck_assert_str_eq(a, b); /* unchanged file, same fingerprint */
	fingerprint_of(p_buf, b);
	ck_assert_str_eq(a, b); /* buffer_size only changes speed */

	ts[1].tv_sec = 1000000001;
	ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
	fingerprint_of(p, e);
	ck_assert_str_ne(a, e); /* touched */

	write_str(d, "t.txt", "hello, world\n");
	ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
	fingerprint_of(p, f);
	ck_assert_str_ne(e, f); /* rewritten with another size */

	free(p);
	free(p_buf);
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_text_lines_c_builder)
{
	char *d = cwt_tmpdir();
	char *f1 = fmt("%s/1.txt", d), *f2 = fmt("%s/2.txt", d);
	const char *files[2] = {f2, f1};
	cachew_dataset *ds;
	cachew_element **v;
	size_t n;

	write_str(d, "1.txt", "one\n");
	write_str(d, "2.txt", "two\n");
	ck_assert_int_eq(cachew_dataset_text_lines(&ds, files, 2), CACHEW_OK);
	ck_assert_int_eq(cwt_run_ds(ds, NULL, &v, &n, NULL, 0), CACHEW_OK);
	char *s = join_bytes(v, n, 0);
	ck_assert_str_eq(s, "two|one");
	free(s);
	cwt_free(v, n);
	cachew_dataset_release(ds);
	free(f1);
	free(f2);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* ---- the file functions ------------------------------------------------------------ */

START_TEST(test_flat_map_text_lines_reads_each_path)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "a.txt", "a1\na2\n");
	write_str(d, "b.txt", "b1\nb2\nb3");
	p = fmt("list_files(\"%s/*.txt\", shuffle=false) | flat_map(text_lines)",
	    d);
	s = seq_bytes(p, NULL);
	ck_assert_str_eq(s, "a1|a2|b1|b2|b3");
	free(s);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_interleave_text_lines_cycles_files)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "a.txt", "a1\na2\na3\n");
	write_str(d, "b.txt", "b1\nb2\n");
	p = fmt("list_files(\"%s/*.txt\", shuffle=false) | "
		"interleave(text_lines, cycle=2, block=1)", d);
	s = seq_bytes(p, NULL);
	ck_assert_str_eq(s, "a1|b1|a2|b2|a3");
	free(s);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* Drives a flat_map function the way flat_map does, without the op. */
static char *
flat_fn_run(const char *fn, const char *params_text, const char *path,
    cachew_err *err, char *msg, size_t msglen)
{
	const cachew_op_def *def = NULL;
	cachew_params *params;
	cachew_op_ctx ctx;
	cachew_element *in, **v = NULL, *e;
	size_t n = 0;
	void *seq = NULL;
	char *s = NULL;
	cachew_err rv;
	const void *items[1] = {path};
	size_t lens[1] = {strlen(path)};
	cachew_tensor *t;
	char ierr[256] = "";

	for (size_t i = 0; cwi_source_fns[i] != NULL; i++)
		if (strcmp(cwi_source_fns[i]->name, fn) == 0)
			def = cwi_source_fns[i];
	ck_assert_ptr_nonnull(def);
	ck_assert_int_eq(cachew_params_parse(&params, params_text), CACHEW_OK);
	memset(&ctx, 0, sizeof(ctx));
	rv = def->init(params, &ctx.state, ierr, sizeof(ierr));
	cachew_params_destroy(params);
	if (rv != CACHEW_OK) {
		*err = rv;
		snprintf(msg, msglen, "%s", ierr);
		return NULL;
	}
	ck_assert_int_eq(cachew_element_create(&in, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_tensor_create_bytes(&t, 0, NULL, items, lens),
	    CACHEW_OK);
	ck_assert_int_eq(cachew_element_set(in, 0, t), CACHEW_OK);
	cachew_tensor_release(t);
	rv = def->flat_open(&ctx, in, &seq);
	cachew_element_release(in); /* the sequence keeps what it needs */
	while (rv == CACHEW_OK) {
		rv = def->flat_next(&ctx, seq, &e);
		if (rv != CACHEW_OK)
			break;
		v = realloc(v, (n + 1) * sizeof(*v));
		v[n++] = e;
	}
	if (seq != NULL)
		def->flat_close(seq);
	def->fini(ctx.state);
	*err = rv;
	snprintf(msg, msglen, "%s", ctx.errmsg);
	if (rv == CACHEW_EOF)
		s = join_bytes(v, n, 0);
	cwt_free(v, n);
	return s;
}

START_TEST(test_text_lines_function_reads_path_of_component_0)
{
	char *d = cwt_tmpdir();
	char *path = fmt("%s/t.txt", d);
	char msg[512];
	cachew_err rv;
	char *s;

	write_str(d, "t.txt", "x\r\ny\nz");
	s = flat_fn_run("text_lines", "buffer_size=2", path, &rv, msg,
	    sizeof(msg));
	ck_assert_int_eq(rv, CACHEW_EOF);
	ck_assert_str_eq(s, "x|y|z");
	free(s);
	s = flat_fn_run("text_lines", "bufsize=2", path, &rv, msg, sizeof(msg));
	ck_assert_ptr_null(s);
	ck_assert_int_eq(rv, CACHEW_EINVAL);
	ck_assert_str_eq(msg, "unknown parameter 'bufsize' (parameters: "
			      "buffer_size)");
	free(path);
	path = fmt("%s/none.txt", d);
	s = flat_fn_run("text_lines", "", path, &rv, msg, sizeof(msg));
	ck_assert_ptr_null(s);
	ck_assert_int_eq(rv, CACHEW_ENOENT);
	char *want = fmt("%s: No such file or directory", path);
	ck_assert_str_eq(msg, want);
	free(want);
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_fixed_length_records_function_takes_params)
{
	char *d = cwt_tmpdir();
	char *path = fmt("%s/r.bin", d);
	char msg[512];
	cachew_err rv;
	char *s;

	write_str(d, "r.bin", "HHaaabbbccc");
	s = flat_fn_run("fixed_length_records", "record_bytes=3, header_bytes=2",
	    path, &rv, msg, sizeof(msg));
	ck_assert_int_eq(rv, CACHEW_EOF);
	ck_assert_str_eq(s, "aaa|bbb|ccc");
	free(s);
	s = flat_fn_run("fixed_length_records", "header_bytes=2", path, &rv,
	    msg, sizeof(msg));
	ck_assert_int_eq(rv, CACHEW_EINVAL);
	ck_assert_str_eq(msg, "missing required parameter 'record_bytes'");
	s = flat_fn_run("fixed_length_records", "record_bytes=0", path, &rv,
	    msg, sizeof(msg));
	ck_assert_int_eq(rv, CACHEW_ERANGE);
	ck_assert_ptr_nonnull(strstr(msg, "'record_bytes' must be in [1,"));
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_flat_map_fixed_length_records_with_params)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "a.bin", "aabb");
	write_str(d, "b.bin", "ccddee");
	p = fmt("list_files(\"%s/*.bin\", shuffle=false) | "
		"flat_map(fixed_length_records, record_bytes=2)", d);
	s = seq_bytes(p, NULL);
	ck_assert_str_eq(s, "aa|bb|cc|dd|ee");
	free(s);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* ---- fixed_length_records ------------------------------------------------------------ */

START_TEST(test_fixed_length_records_splits_file)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "r.bin", "aaaabbbbcccc");
	p = fmt("fixed_length_records(\"%s/r.bin\", record_bytes=4)", d);
	s = seq_bytes(p, NULL);
	ck_assert_str_eq(s, "aaaa|bbbb|cccc");
	free(s);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_fixed_length_records_header_and_footer)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "r1.bin", "HDR12345678FT");
	write_str(d, "r2.bin", "HDRabcdFT");
	for (int bs = 1; bs <= 9; bs += 4) {
		p = fmt("fixed_length_records(\"%s/r*.bin\", record_bytes=4, "
			"header_bytes=3, footer_bytes=2, buffer_size=%d)", d, bs);
		s = seq_bytes(p, NULL);
		ck_assert_str_eq(s, "1234|5678|abcd");
		free(s);
		free(p);
	}
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_fixed_length_records_binary_data)
{
	char *d = cwt_tmpdir();
	char *path = fmt("%s/b.bin", d), *p;
	uint8_t data[256];
	cachew_element **v;
	size_t n;

	for (int i = 0; i < 256; i++)
		data[i] = (uint8_t)i;
	cwt_write_file(path, data, sizeof(data));
	p = fmt("fixed_length_records(\"%s\", record_bytes=16, buffer_size=100)",
	    path);
	v = run_ok(p, NULL, &n);
	ck_assert_uint_eq(n, 16);
	for (size_t i = 0; i < n; i++) {
		const void *rec;
		size_t len;
		ck_assert_int_eq(cachew_tensor_bytes_at(
				     cachew_element_component(v[i], 0), 0, &rec,
				     &len), CACHEW_OK);
		ck_assert_uint_eq(len, 16);
		ck_assert_int_eq(memcmp(rec, data + 16 * i, 16), 0);
	}
	cwt_free(v, n);
	free(p);
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* The records a mapping reader gives (cfg.map: a worker whose records
 * leave unread) are the ones a reading reader gives, byte for byte, across
 * mapping blocks (CWI_MAP_BLOCK) and with a header that puts records off
 * page boundaries; records of at least CWI_MAP_MIN bytes view mappings,
 * smaller ones are read. After a seek (a restore) it maps from there. */
START_TEST(test_fixed_length_records_mapped_equal_read)
{
	char *d = cwt_tmpdir();
	char *path = fmt("%s/m.bin", d);
	size_t rb = 5000, nrec = 2 * CWI_MAP_BLOCK / 5000 + 7;
	size_t hdr = 13, ftr = 5, size = hdr + nrec * rb + ftr;
	uint8_t *data = malloc(size);

	for (size_t i = 0; i < size; i++)
		data[i] = (uint8_t)(i * 31 + i / 4099);
	cwt_write_file(path, data, size);
	for (int small = 0; small < 2; small++) {
		cwi_rec_config cfg = {
		    .record_bytes = small ? 1000 : (int64_t)rb,
		    .header_bytes = (int64_t)hdr,
		    .footer_bytes = (int64_t)ftr,
		    .buffer_size = CWI_READ_BLOCK,
		    .map = true,
		};
		size_t want = small ? 0 : nrec, got = 0;
		cwi_rec_reader r;
		cwi_tensor t;
		cachew_err rv;

		if (small) { /* 13 + 5 + 1000 k: the body is whole records */
			cfg.footer_bytes = (int64_t)((size - hdr) % 1000);
			want = (size - hdr) / 1000;
		}
		cwi_rec_init(&r, &cfg);
		ck_assert_int_eq(cwi_rec_open(&r, path, strlen(path)),
		    CACHEW_OK);
		while ((rv = cwi_rec_next(&r, &t)) == CACHEW_OK) {
			size_t len = (size_t)cfg.record_bytes;
			const void *rec;
			size_t rlen;

			ck_assert_int_eq(cachew_tensor_bytes_at(&t, 0, &rec,
					     &rlen), CACHEW_OK);
			ck_assert_uint_eq(rlen, len);
			ck_assert_msg(memcmp(rec, data + hdr + got * len, len) ==
				0, "record %zu differs", got);
			ck_assert_int_eq(cwi_buffer_mapped(t.buf), !small);
			cwi_tensor_clear(&t);
			got++;
		}
		ck_assert_int_eq(rv, CACHEW_EOF);
		ck_assert_uint_eq(got, want);
		if (!small) {
			/* Reopened at the second last record (a restore). */
			const void *rec;
			size_t rlen;

			ck_assert_int_eq(cwi_rec_open(&r, path, strlen(path)),
			    CACHEW_OK);
			ck_assert_int_eq(cwi_rec_seek(&r, hdr + (nrec - 2) * rb),
			    CACHEW_OK);
			ck_assert_int_eq(cwi_rec_next(&r, &t), CACHEW_OK);
			ck_assert(cwi_buffer_mapped(t.buf));
			ck_assert_int_eq(cachew_tensor_bytes_at(&t, 0, &rec,
					     &rlen), CACHEW_OK);
			ck_assert_int_eq(memcmp(rec, data + hdr +
					     (nrec - 2) * rb, rb), 0);
			cwi_tensor_clear(&t);
			ck_assert_int_eq(cwi_rec_next(&r, &t), CACHEW_OK);
			cwi_tensor_clear(&t);
			ck_assert_int_eq(cwi_rec_next(&r, &t), CACHEW_EOF);
		}
		cwi_rec_close(&r);
	}
	free(data);
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_fixed_length_records_partial_record_fails)
{
	char *d = cwt_tmpdir();
	char *path = fmt("%s/r.bin", d);
	char *p = fmt("fixed_length_records(\"%s\", record_bytes=4, "
		      "header_bytes=1)", path);
	char *want = fmt("fixed_length_records: %s: partial record at byte "
			 "offset 9: 2 of 4 bytes", path);

	write_str(d, "r.bin", "Haaaabbbbcc");
	run_fails(p, CACHEW_ECORRUPT, want);
	free(want);
	free(p);
	write_str(d, "r.bin", "HH");
	p = fmt("fixed_length_records(\"%s\", record_bytes=4, header_bytes=2, "
		"footer_bytes=1)", path);
	run_fails(p, CACHEW_ECORRUPT, "the file is 2 bytes, shorter than its "
				      "2-byte header and 1-byte footer");
	free(p);
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_fixed_length_records_record_bytes_required)
{
	run_fails("fixed_length_records(\"x.bin\")", CACHEW_EINVAL,
	    "missing required parameter 'record_bytes'");
	run_fails("fixed_length_records(\"x.bin\", record_bytes=0)",
	    CACHEW_ERANGE, "'record_bytes' must be in [1,");
}
END_TEST

START_TEST(test_fixed_length_records_c_builder)
{
	char *d = cwt_tmpdir();
	char *f = fmt("%s/r.bin", d);
	const char *files[1] = {f};
	cachew_dataset *ds;
	cachew_element **v;
	size_t n;

	write_str(d, "r.bin", "xyzw");
	ck_assert_int_eq(cachew_dataset_fixed_length_records(&ds, files, 1, 2),
	    CACHEW_OK);
	ck_assert_int_eq(cwt_run_ds(ds, NULL, &v, &n, NULL, 0), CACHEW_OK);
	char *s = join_bytes(v, n, 0);
	ck_assert_str_eq(s, "xy|zw");
	free(s);
	cwt_free(v, n);
	cachew_dataset_release(ds);
	free(f);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* ---- read_file ------------------------------------------------------------------ */

START_TEST(test_read_file_binary_with_nuls)
{
	char *d = cwt_tmpdir();
	char *path = fmt("%s/b.bin", d), *p;
	uint8_t data[300];
	cachew_element **v;
	size_t n, len;
	const void *got;

	for (int i = 0; i < 300; i++)
		data[i] = (uint8_t)(i % 3 == 0 ? 0 : i);
	cwt_write_file(path, data, sizeof(data));
	p = fmt("from_list([(\"%s\", 7)]) | read_file", path);
	v = run_ok(p, NULL, &n);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(cachew_element_size(v[0]), 2);
	ck_assert_int_eq(cachew_tensor_bytes_at(cachew_element_component(v[0], 0),
			     0, &got, &len), CACHEW_OK);
	ck_assert_uint_eq(len, 300);
	ck_assert_int_eq(memcmp(got, data, 300), 0);
	ck_assert_int_eq(cwt_i64(v[0], 1), 7); /* other components kept */
	cwt_free(v, n);
	free(p);
	free(path);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_read_file_empty_file)
{
	char *d = cwt_tmpdir();
	char *p, *s;

	write_str(d, "e", "");
	write_str(d, "f", "contents");
	p = fmt("list_files(\"%s/*\", shuffle=false) | map(read_file)", d);
	s = seq_bytes(p, NULL);
	ck_assert_str_eq(s, "|contents");
	free(s);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* A pattern like train-* also matches the record indexes that cachew gen
 * writes beside its shards: an index reads as a file of no records, never
 * as a corrupt TFRecord file (issue 17: "length checksum mismatch"). */
START_TEST(test_tfrecord_reads_a_record_index_as_no_records)
{
	char *dir = cwt_tmpdir(), path[600], pipeline[800], err[512];
	const char *idx = "0 120\n120 98\n";
	cachew_element **v = NULL;
	size_t n = 1;

	snprintf(path, sizeof(path), "%s/train-00000-of-00001.tfrecord.idx",
	    dir);
	cwt_write_file(path, idx, strlen(idx));
	snprintf(pipeline, sizeof(pipeline), "tfrecord(\"%s\")", path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 0);
	cwt_free(v, n);
	snprintf(pipeline, sizeof(pipeline),
	    "tfrecord(\"%s\", compression=gzip)", path);
	ck_assert_int_eq(cwt_run(pipeline, NULL, &v, &n, err, sizeof(err)),
	    CACHEW_OK);
	ck_assert_uint_eq(n, 0);
	cwt_free(v, n);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_read_file_missing_fails_naming_path)
{
	char *d = cwt_tmpdir();
	char *p = fmt("from_list([\"%s/nope\"]) | read_file", d);
	char *want = fmt("%s/nope: No such file or directory", d);
	run_fails(p, CACHEW_ENOENT, want);
	free(want);
	free(p);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_read_file_needs_bytes_path)
{
	run_fails("from_list([1]) | read_file", CACHEW_ETYPE,
	    "component 0 is i64[]; expected a path (a bytes scalar)");
	run_fails("range(1) | read_file(mode=1)", CACHEW_EINVAL,
	    "unknown parameter 'mode'");
}
END_TEST

/* read_file reads regular files only (/dev/zero would grow without end, a
 * FIFO block), within max_element_bytes: a larger file fails the element
 * before its size is allocated. */
START_TEST(test_read_file_refuses_devices_and_files_over_the_limit)
{
	char *d = cwt_tmpdir(), *fifo = fmt("%s/fifo", d), *p, *want;
	cachew_options *o = cwt_opts(1, 1);
	char big[10000];

	run_fails("from_list([\"/dev/zero\"]) | read_file", CACHEW_EINVAL,
	    "map(read_file): /dev/zero: not a regular file (a character "
	    "device) (element 0)");
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	p = fmt("from_list([\"%s\"]) | read_file", fifo);
	want = fmt("%s: not a regular file (a FIFO)", fifo);
	run_fails(p, CACHEW_EINVAL, want);
	free(want);
	free(p);
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	write_str(d, "big", big);
	ck_assert_int_eq(cachew_options_set_int(o, "max_element_bytes", 4096),
	    CACHEW_OK);
	p = fmt("from_list([\"%s/big\"]) | read_file", d);
	want = fmt("%s/big: 9999 bytes, over the limit of 4096 "
	    "(max_element_bytes)", d);
	cwt_run_fails(p, o, CACHEW_ERANGE, want);
	free(want);
	free(p);
	cachew_options_destroy(o);
	free(fifo);
	cwt_rmtree(d);
	free(d);
}
END_TEST

START_TEST(test_read_file_c_builder)
{
	char *d = cwt_tmpdir();
	char *g = fmt("%s/*", d);
	cachew_dataset *files, *ds;
	cachew_element **v;
	size_t n;

	write_str(d, "x", "data!");
	ck_assert_int_eq(cachew_dataset_list_files(&files, g, 0, -1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_read_file(&ds, files), CACHEW_OK);
	ck_assert_str_eq(cachew_dataset_op(ds), "map");
	ck_assert_int_eq(cwt_run_ds(ds, NULL, &v, &n, NULL, 0), CACHEW_OK);
	char *s = join_bytes(v, n, 0);
	ck_assert_str_eq(s, "data!");
	free(s);
	cwt_free(v, n);
	cachew_dataset_release(ds);
	cachew_dataset_release(files);
	free(g);
	cwt_rmtree(d);
	free(d);
}
END_TEST

/* ---- add / mul ------------------------------------------------------------------ */

START_TEST(test_add_default_one)
{
	char *s = cwt_seq("range(4) | map(add)", NULL);
	ck_assert_str_eq(s, "1,2,3,4");
	free(s);
}
END_TEST

START_TEST(test_add_float_value_on_f64)
{
	size_t n;
	cachew_element **v =
	    run_ok("from_list([1.5, -2.0]) | map(add, value=0.25)", NULL, &n);
	ck_assert(cwt_f64(v[0], 0) == 1.75);
	ck_assert(cwt_f64(v[1], 0) == -1.75);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_add_f16_and_bf16)
{
	size_t n;
	cachew_element **v = run_ok(
	    "from_tensors([1.0, 2.0]) | map(cast, dtype=f16) | map(add, value=1)",
	    NULL, &n);
	ck_assert_uint_eq(u16_at(v[0], 0, 0), 0x4000); /* 2.0 */
	ck_assert_uint_eq(u16_at(v[0], 0, 1), 0x4200); /* 3.0 */
	cwt_free(v, n);
	v = run_ok("from_tensors([1.0]) | map(cast, dtype=bf16) | "
		   "map(mul, value=-4)", NULL, &n);
	ck_assert_uint_eq(u16_at(v[0], 0, 0), 0xc080); /* -4.0 */
	cwt_free(v, n);
}
END_TEST

START_TEST(test_add_integer_value_required_for_ints)
{
	run_fails("range(2) | map(add, value=0.5)", CACHEW_EOP,
	    "value 0.5 is not an integer, component 0 is i64");
}
END_TEST

START_TEST(test_add_rejects_bytes)
{
	run_fails("from_list([\"a\"]) | map(add)", CACHEW_EOP,
	    "component 0 is bytes: not a number");
}
END_TEST

START_TEST(test_add_unknown_param_fails)
{
	run_fails("range(2) | map(add, valeu=2)", CACHEW_EINVAL,
	    "unknown parameter 'valeu' (parameters: value)");
}
END_TEST

START_TEST(test_add_on_rank1_tensor)
{
	size_t n;
	cachew_element **v =
	    run_ok("from_tensors([1, 2, 3]) | map(add, value=10)", NULL, &n);
	char *s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "[11 12 13]");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_mul_multiplies)
{
	char *s = cwt_seq("range(4) | map(mul, value=3)", NULL);
	ck_assert_str_eq(s, "0,3,6,9");
	free(s);
	s = cwt_seq("from_tensors([[1, -2], [3, 4]]) | map(mul, value=-1)", NULL);
	ck_assert_str_eq(s, "[-1 2 -3 -4]");
	free(s);
}
END_TEST

START_TEST(test_mul_value_required)
{
	run_fails("range(2) | map(mul)", CACHEW_EINVAL,
	    "missing required parameter 'value'");
}
END_TEST

/* ---- cast ---------------------------------------------------------------------------- */

START_TEST(test_cast_i64_f32_round_trip)
{
	size_t n;
	cachew_element **v = run_ok(
	    "from_tensors([-5, 0, 16777216]) | map(cast, dtype=f32)", NULL, &n);
	const float *f = cachew_tensor_data(cachew_element_component(v[0], 0));
	assert_spec(v[0], 0, "f32[3]");
	ck_assert(f[0] == -5.0f && f[1] == 0.0f && f[2] == 16777216.0f);
	cwt_free(v, n);
	char *s = cwt_seq("from_tensors([-5, 0, 16777216]) | map(cast, "
			  "dtype=f32) | map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[-5 0 16777216]");
	free(s);
}
END_TEST

START_TEST(test_cast_float_to_int_truncates_and_saturates)
{
	char *s = cwt_seq("from_tensors([2.9, -2.9, 1e300, -1e300, 0.5]) | "
			  "map(cast, dtype=i32) | map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[2 -2 2147483647 -2147483648 0]");
	free(s);
	s = cwt_seq("from_tensors([300.7, -3.7, 255.9]) | map(cast, dtype=u8) | "
		    "map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[255 0 255]");
	free(s);
	s = cwt_seq("from_tensors([1e19, -1e19]) | map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[9223372036854775807 -9223372036854775808]");
	free(s);
}
END_TEST

START_TEST(test_cast_int_narrowing_wraps)
{
	char *s = cwt_seq("from_tensors([300, -1, 4294967297]) | "
			  "map(cast, dtype=u8) | map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[44 255 1]");
	free(s);
	s = cwt_seq("from_tensors([4294967297, 2147483648]) | "
		    "map(cast, dtype=i32) | map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[1 -2147483648]");
	free(s);
}
END_TEST

START_TEST(test_cast_bool_both_ways)
{
	char *s = cwt_seq("from_tensors([0, 5, -1]) | map(cast, dtype=bool) | "
			  "map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[0 1 1]");
	free(s);
	s = cwt_seq("from_tensors([0.0, 0.1]) | map(cast, dtype=bool) | "
		    "map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[0 1]");
	free(s);
	s = cwt_seq("from_tensors([true, false]) | map(cast, dtype=i64)", NULL);
	ck_assert_str_eq(s, "[1 0]");
	free(s);
}
END_TEST

START_TEST(test_cast_f16_known_bit_patterns)
{
	size_t n;
	/* 1, -2, max, overflow, smallest subnormal, a tie to even (1 + 2^-11
	 * -> 1), a tie rounding up (1 + 3 * 2^-11 -> 1 + 2^-9), 0.1, -0.0 */
	cachew_element **v = run_ok(
	    "from_tensors([1.0, -2.0, 65504.0, 65520.0, 5.960464477539063e-08, "
	    "1.00048828125, 1.00146484375, 0.1, -0.0]) | map(cast, dtype=f16)",
	    NULL, &n);
	static const uint16_t want[] = {0x3c00, 0xc000, 0x7bff, 0x7c00, 0x0001,
	    0x3c00, 0x3c02, 0x2e66, 0x8000};
	assert_spec(v[0], 0, "f16[9]");
	for (size_t i = 0; i < 9; i++)
		ck_assert_msg(u16_at(v[0], 0, i) == want[i],
		    "item %zu: 0x%04x, expected 0x%04x", i, u16_at(v[0], 0, i),
		    want[i]);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_cast_bf16_known_bit_patterns)
{
	size_t n;
	/* 1, -2, 1 + 2^-8 (tie -> even 1), 1 + 3 * 2^-8 (tie -> up),
	 * 3.0e38, 1e39 (overflow), pi */
	cachew_element **v = run_ok(
	    "from_tensors([1.0, -2.0, 1.00390625, 1.01171875, 3.0e38, 1e39, "
	    "3.141592653589793]) | map(cast, dtype=bf16)", NULL, &n);
	static const uint16_t want[] = {0x3f80, 0xc000, 0x3f80, 0x3f82, 0x7f62,
	    0x7f80, 0x4049};
	for (size_t i = 0; i < 7; i++)
		ck_assert_msg(u16_at(v[0], 0, i) == want[i],
		    "item %zu: 0x%04x, expected 0x%04x", i, u16_at(v[0], 0, i),
		    want[i]);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_cast_f16_round_trip_to_f64)
{
	size_t n;
	cachew_element **v = run_ok(
	    "from_tensors([0.5, 1024.0, -65504.0, 6.103515625e-05, 1.5]) | "
	    "map(cast, dtype=f16) | map(cast, dtype=f64)", NULL, &n);
	const double *d = cachew_tensor_data(cachew_element_component(v[0], 0));
	ck_assert(d[0] == 0.5 && d[1] == 1024.0 && d[2] == -65504.0 &&
	    d[3] == 6.103515625e-05 && d[4] == 1.5);
	cwt_free(v, n);
	v = run_ok("from_tensors([-7]) | map(cast, dtype=bf16) | "
		   "map(cast, dtype=i32) | map(cast, dtype=i64)", NULL, &n);
	char *s = cwt_join_i64(v, n, 0);
	ck_assert_str_eq(s, "[-7]");
	free(s);
	cwt_free(v, n);
}
END_TEST

START_TEST(test_cast_every_component)
{
	size_t n;
	cachew_element **v = run_ok(
	    "from_tensors((1, [2.5, 3.5], true)) | map(cast, dtype=f32)", NULL, &n);
	assert_spec(v[0], 0, "f32[]");
	assert_spec(v[0], 1, "f32[2]");
	assert_spec(v[0], 2, "f32[]");
	cwt_free(v, n);
}
END_TEST

START_TEST(test_cast_errors)
{
	run_fails("from_list([\"a\"]) | map(cast, dtype=i64)", CACHEW_EOP,
	    "component 0 is bytes");
	run_fails("range(1) | map(cast, dtype=f128)", CACHEW_EINVAL,
	    "unknown dtype 'f128'");
	run_fails("range(1) | map(cast, dtype=bytes)", CACHEW_EINVAL,
	    "cannot cast to bytes");
	run_fails("range(1) | map(cast)", CACHEW_EINVAL,
	    "missing required parameter 'dtype'");
	run_fails("range(1) | map(cast, dtype=f32, mode=x)", CACHEW_EINVAL,
	    "unknown parameter 'mode' (parameters: dtype)");
}
END_TEST

/* ---- identity, sleep_us, spin_us ------------------------------------------------- */

START_TEST(test_identity_returns_element)
{
	char *s = cwt_seq("from_list([(1, 2), (3, 4)]) | map(identity)", NULL);
	ck_assert_str_eq(s, "1,3");
	free(s);
	run_fails("range(1) | map(identity, x=1)", CACHEW_EINVAL,
	    "unknown parameter 'x' (parameters: none)");
}
END_TEST

START_TEST(test_sleep_us_returns_element)
{
	char *s = cwt_seq("range(3) | map(sleep_us, us=100)", NULL);
	ck_assert_str_eq(s, "0,1,2");
	free(s);
}
END_TEST

START_TEST(test_spin_us_returns_element)
{
	char *s = cwt_seq("range(3) | map(spin_us, us=100)", NULL);
	ck_assert_str_eq(s, "0,1,2");
	free(s);
	s = cwt_seq("range(2) | map(spin_us, us=0)", NULL);
	ck_assert_str_eq(s, "0,1");
	free(s);
}
END_TEST

START_TEST(test_delay_us_param_checked)
{
	run_fails("range(1) | map(sleep_us)", CACHEW_EINVAL,
	    "missing required parameter 'us'");
	run_fails("range(1) | map(spin_us, us=-1)", CACHEW_ERANGE,
	    "parameter 'us' must be in [0,");
	run_fails("range(1) | map(sleep_us, us=\"x\")", CACHEW_EINVAL,
	    "parameter 'us' must be an integer");
}
END_TEST

/* ---- uniform --------------------------------------------------------------------------- */

/* Component 1 of `range(n) | map(uniform, ...)`. */
static double *
uniform_values(const char *pipeline, int64_t seed, size_t *n)
{
	cachew_options *o = cwt_opts(seed, 0);
	cachew_element **v = run_ok(pipeline, o, n);
	double *d = malloc(*n * sizeof(double));

	for (size_t i = 0; i < *n; i++) {
		ck_assert_uint_eq(cachew_element_size(v[i]), 2);
		ck_assert_int_eq(cwt_i64(v[i], 0), (int64_t)i);
		d[i] = cwt_f64(v[i], 1);
	}
	cwt_free(v, *n);
	cachew_options_destroy(o);
	return d;
}

START_TEST(test_uniform_same_seed_same_values)
{
	size_t na, nb;
	double *a = uniform_values("range(50) | map(uniform)", 11, &na);
	double *b = uniform_values("range(50) | map(uniform)", 11, &nb);
	ck_assert_uint_eq(na, 50);
	ck_assert_int_eq(memcmp(a, b, 50 * sizeof(double)), 0);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_uniform_different_seed_different_values)
{
	size_t na, nb, same = 0;
	double *a = uniform_values("range(50) | map(uniform)", 11, &na);
	double *b = uniform_values("range(50) | map(uniform)", 12, &nb);
	for (size_t i = 0; i < 50; i++)
		same += a[i] == b[i];
	ck_assert_uint_eq(same, 0);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_uniform_values_in_range)
{
	size_t n;
	double *a = uniform_values("range(2000) | map(uniform, lo=-3, hi=5.5)",
	    5, &n);
	double lo = 1e9, hi = -1e9;
	for (size_t i = 0; i < n; i++) {
		ck_assert(a[i] >= -3.0 && a[i] < 5.5);
		lo = fmin(lo, a[i]);
		hi = fmax(hi, a[i]);
	}
	/* Spread over the range, not stuck. */
	ck_assert(lo < -2.5 && hi > 5.0);
	free(a);
	a = uniform_values("range(100) | map(uniform)", 5, &n);
	for (size_t i = 0; i < n; i++)
		ck_assert(a[i] >= 0.0 && a[i] < 1.0);
	free(a);
}
END_TEST

START_TEST(test_uniform_same_under_parallelism)
{
	size_t na, nb;
	double *a = uniform_values("range(200) | map(uniform)", 3, &na);
	double *b = uniform_values("range(200) | map(uniform, parallel=4)", 3,
	    &nb);
	ck_assert_uint_eq(nb, 200);
	ck_assert_int_eq(memcmp(a, b, 200 * sizeof(double)), 0);
	free(a);
	free(b);
}
END_TEST

START_TEST(test_uniform_params_checked)
{
	run_fails("range(1) | map(uniform, lo=2, hi=1)", CACHEW_EINVAL,
	    "'lo' (2) must be less than 'hi' (1)");
	run_fails("range(1) | map(uniform, low=0)", CACHEW_EINVAL,
	    "unknown parameter 'low' (parameters: lo, hi)");
}
END_TEST

/* ---- suite ------------------------------------------------------------------------------- */

Suite *
cwt_sources_suite(void)
{
	Suite *s = suite_create("sources");
	TCase *lit = tcase_create("literals");
	TCase *files = tcase_create("files");
	TCase *fns = tcase_create("functions");

	tcase_add_test(lit, test_from_tensors_int_is_i64_scalar);
	tcase_add_test(lit, test_from_tensors_float_bool_string_scalars);
	tcase_add_test(lit, test_from_tensors_int_list_is_rank1_i64);
	tcase_add_test(lit, test_from_tensors_any_float_makes_f64);
	tcase_add_test(lit, test_from_tensors_nested_lists_are_rank_n);
	tcase_add_test(lit, test_from_tensors_string_list_is_bytes_rank1);
	tcase_add_test(lit, test_from_tensors_tuple_gives_components);
	tcase_add_test(lit, test_from_tensors_empty_list_is_i64_shape_0);
	tcase_add_test(lit, test_from_tensors_bool_list);
	tcase_add_test(lit, test_from_tensors_ragged_list_fails_naming_path);
	tcase_add_test(lit, test_from_tensors_mixed_strings_and_numbers_fail);
	tcase_add_test(lit, test_from_tensors_deeper_than_rank_8_fails);
	tcase_add_test(lit, test_from_tensors_c_builder);
	tcase_add_test(lit, test_from_list_one_element_per_item);
	tcase_add_test(lit, test_from_list_nested_items_are_tensors);
	tcase_add_test(lit, test_from_list_tuple_items_have_components);
	tcase_add_test(lit, test_from_list_empty_yields_nothing);
	tcase_add_test(lit, test_from_list_bad_item_fails_naming_path);
	tcase_add_test(lit, test_from_list_iterates_again_identically);
	suite_add_tcase(s, lit);

	tcase_add_test(files, test_list_files_sorted_without_shuffle);
	tcase_add_test(files, test_tfrecord_reads_a_record_index_as_no_records);
	tcase_add_test(files, test_list_files_patterns_sorted_together);
	tcase_add_test(files, test_list_files_shuffle_reproducible_with_seed);
	tcase_add_test(files, test_list_files_reshuffles_per_epoch);
	tcase_add_test(files, test_list_files_default_seed_follows_pipeline_seed);
	tcase_add_test(files, test_list_files_no_match_fails_naming_pattern);
	tcase_add_test(files, test_list_files_c_builder);
	tcase_add_test(files, test_text_lines_strips_newlines);
	tcase_add_test(files, test_text_lines_strips_crlf_only);
	tcase_add_test(files, test_text_lines_last_line_without_newline);
	tcase_add_test(files, test_text_lines_empty_lines_kept);
	tcase_add_test(files, test_text_lines_empty_file_yields_nothing);
	tcase_add_test(files, test_text_lines_lines_across_small_blocks);
	tcase_add_test(files, test_text_lines_3mb_line_with_4k_buffer);
	tcase_add_test(files, test_text_lines_files_in_given_order);
	tcase_add_test(files, test_text_lines_many_files_many_lines);
	tcase_add_test(files, test_text_lines_are_views_of_one_block);
	tcase_add_test(files, test_text_lines_missing_file_fails_naming_it);
	tcase_add_test(files, test_text_lines_delivers_lines_before_a_failing_file);
	tcase_add_test(files, test_text_lines_fingerprint_tracks_file_identity);
	tcase_add_test(files, test_text_lines_c_builder);
	tcase_add_test(files, test_flat_map_text_lines_reads_each_path);
	tcase_add_test(files, test_interleave_text_lines_cycles_files);
	tcase_add_test(files, test_text_lines_function_reads_path_of_component_0);
	tcase_add_test(files, test_fixed_length_records_function_takes_params);
	tcase_add_test(files, test_flat_map_fixed_length_records_with_params);
	tcase_add_test(files, test_fixed_length_records_splits_file);
	tcase_add_test(files, test_fixed_length_records_header_and_footer);
	tcase_add_test(files, test_fixed_length_records_binary_data);
	tcase_add_test(files, test_fixed_length_records_mapped_equal_read);
	tcase_add_test(files, test_fixed_length_records_partial_record_fails);
	tcase_add_test(files, test_fixed_length_records_record_bytes_required);
	tcase_add_test(files, test_fixed_length_records_c_builder);
	tcase_add_test(files, test_read_file_binary_with_nuls);
	tcase_add_test(files, test_read_file_empty_file);
	tcase_add_test(files, test_read_file_missing_fails_naming_path);
	tcase_add_test(files, test_read_file_needs_bytes_path);
	tcase_add_test(files, test_read_file_c_builder);
	tcase_add_test(files,
	    test_read_file_refuses_devices_and_files_over_the_limit);
	suite_add_tcase(s, files);

	tcase_add_test(fns, test_add_default_one);
	tcase_add_test(fns, test_add_float_value_on_f64);
	tcase_add_test(fns, test_add_f16_and_bf16);
	tcase_add_test(fns, test_add_integer_value_required_for_ints);
	tcase_add_test(fns, test_add_rejects_bytes);
	tcase_add_test(fns, test_add_unknown_param_fails);
	tcase_add_test(fns, test_add_on_rank1_tensor);
	tcase_add_test(fns, test_mul_multiplies);
	tcase_add_test(fns, test_mul_value_required);
	tcase_add_test(fns, test_cast_i64_f32_round_trip);
	tcase_add_test(fns, test_cast_float_to_int_truncates_and_saturates);
	tcase_add_test(fns, test_cast_int_narrowing_wraps);
	tcase_add_test(fns, test_cast_bool_both_ways);
	tcase_add_test(fns, test_cast_f16_known_bit_patterns);
	tcase_add_test(fns, test_cast_bf16_known_bit_patterns);
	tcase_add_test(fns, test_cast_f16_round_trip_to_f64);
	tcase_add_test(fns, test_cast_every_component);
	tcase_add_test(fns, test_cast_errors);
	tcase_add_test(fns, test_identity_returns_element);
	tcase_add_test(fns, test_sleep_us_returns_element);
	tcase_add_test(fns, test_spin_us_returns_element);
	tcase_add_test(fns, test_delay_us_param_checked);
	tcase_add_test(fns, test_uniform_same_seed_same_values);
	tcase_add_test(fns, test_uniform_different_seed_different_values);
	tcase_add_test(fns, test_uniform_values_in_range);
	tcase_add_test(fns, test_uniform_same_under_parallelism);
	tcase_add_test(fns, test_uniform_params_checked);
	suite_add_tcase(s, fns);
	return s;
}
