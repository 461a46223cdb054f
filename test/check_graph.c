/*
 * check_graph.c - the pipeline-string parser, the canonical printer, the
 * msgpack codecs (values and graphs) and fingerprint properties.
 */
#include "cwt.h"

#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/core/value_msgpack.h"
#include "../src/graph/graph.h"
#include "../src/pipeline/pipeline.h"

/* ---- helpers ----------------------------------------------------------------- */

static cachew_dataset *
parse_ok(const char *text)
{
	cachew_dataset *ds = NULL;
	cachew_err rv = cachew_dataset_parse(&ds, text);

	ck_assert_msg(rv == CACHEW_OK, "parse '%s': %s: %s", text,
	    cachew_strerror(rv), cachew_errmsg());
	return ds;
}

static void
fp_hex(const cachew_dataset *ds, char out[33])
{
	cachew_fingerprint fp;

	ck_assert_int_eq(cachew_dataset_fingerprint(ds, &fp), CACHEW_OK);
	cachew_fingerprint_hex(&fp, out);
}

/* The fingerprint of a pipeline string, as hex. */
static void
fp_of(const char *text, char out[33])
{
	cachew_dataset *ds = parse_ok(text);

	fp_hex(ds, out);
	cachew_dataset_release(ds);
}

static char *
to_str(const cachew_dataset *ds)
{
	char *s = NULL;
	cachew_err rv = cachew_dataset_to_string(ds, &s);

	ck_assert_msg(rv == CACHEW_OK, "to_string: %s", cachew_errmsg());
	return s;
}

/* Asserts that parse(text) prints as `canonical`. */
static void
assert_canonical(const char *text, const char *canonical)
{
	cachew_dataset *ds = parse_ok(text);
	char *s = to_str(ds);

	ck_assert_str_eq(s, canonical);
	cachew_free(s);
	cachew_dataset_release(ds);
}

/* Asserts that parsing fails with `code` and a message containing each of
 * the NULL-terminated fragments. */
static void
assert_parse_fails(const char *text, cachew_err code, ...)
{
	cachew_dataset *ds = NULL;
	cachew_err rv = cachew_dataset_parse(&ds, text);
	const char *frag;
	va_list ap;

	ck_assert_msg(rv == code, "parse '%s': want %s, got %s (%s)", text,
	    cachew_strerror(code), cachew_strerror(rv), cachew_errmsg());
	ck_assert_ptr_null(ds);
	va_start(ap, code);
	while ((frag = va_arg(ap, const char *)) != NULL)
		ck_assert_msg(strstr(cachew_errmsg(), frag) != NULL,
		    "parse '%s': message '%s' lacks '%s'", text, cachew_errmsg(),
		    frag);
	va_end(ap);
}

static bool
has_op(const char *name)
{
	return cwi_dataset_op_lookup(name) != NULL;
}

/* Test functions of every kind, registered per test (fork mode gives each
 * test a fresh registry; without fork the second registration is EEXIST). */
static cachew_err
any_init(const cachew_params *p, void **state, char *err, size_t errlen)
{
	(void)p;
	(void)err;
	(void)errlen;
	*state = NULL;
	return CACHEW_OK;
}

static cachew_err
pass_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	(void)ctx;
	*out = in;
	return CACHEW_OK;
}

static cachew_err
keep_all(cachew_op_ctx *ctx, const cachew_element *in, int *keep)
{
	(void)ctx;
	(void)in;
	*keep = 1;
	return CACHEW_OK;
}

static cachew_err
flat_open(cachew_op_ctx *ctx, const cachew_element *in, void **seq)
{
	(void)ctx;
	(void)in;
	*seq = NULL;
	return CACHEW_OK;
}

static cachew_err
flat_next(cachew_op_ctx *ctx, void *seq, cachew_element **out)
{
	(void)ctx;
	(void)seq;
	(void)out;
	return CACHEW_EOF;
}

static void
flat_close(void *seq)
{
	(void)seq;
}

static void
register_test_fns(void)
{
	static const cachew_op_def defs[] = {
	    {.version = CACHEW_OP_DEF_VERSION, .name = "cwt_any",
		.kind = CACHEW_OP_MAP, .init = any_init,
		.map = pass_map},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "cwt_keep",
		.kind = CACHEW_OP_FILTER, .filter = keep_all},
	    {.version = CACHEW_OP_DEF_VERSION, .name = "cwt_flat",
		.kind = CACHEW_OP_FLAT_MAP,
		.flat_open = flat_open, .flat_next = flat_next,
		.flat_close = flat_close},
	};

	for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++) {
		cachew_err rv = cachew_op_register(&defs[i]);
		ck_assert_msg(rv == CACHEW_OK || rv == CACHEW_EEXIST, "%s",
		    cachew_errmsg());
	}
}

static char *
value_str(const cwi_value *v)
{
	cwi_strbuf sb;
	char *s;

	cwi_strbuf_init(&sb);
	cwi_value_print(&sb, v);
	ck_assert_int_eq(cwi_strbuf_finish(&sb, &s, NULL), CACHEW_OK);
	return s;
}

/* Parses a literal and asserts how it prints. */
static void
assert_value(const char *text, const char *printed)
{
	cwi_value v = {0};
	cachew_err rv = cwi_value_parse(&v, text);
	char *s;

	ck_assert_msg(rv == CACHEW_OK, "value '%s': %s", text, cachew_errmsg());
	s = value_str(&v);
	ck_assert_str_eq(s, printed);
	cachew_free(s);
	cwi_value_free(&v);
}

static void
assert_value_fails(const char *text, const char *frag)
{
	cwi_value v = {0};
	cachew_err rv = cwi_value_parse(&v, text);

	ck_assert_msg(rv == CACHEW_EPARSE, "value '%s': want EPARSE, got %s",
	    text, cachew_strerror(rv));
	ck_assert_msg(strstr(cachew_errmsg(), frag) != NULL,
	    "value '%s': message '%s' lacks '%s'", text, cachew_errmsg(), frag);
	ck_assert_int_eq(v.type, CWI_V_NIL);
}

static char *
hex(const void *buf, size_t len)
{
	char *s = malloc(len * 2 + 1);

	ck_assert_ptr_nonnull(s);
	for (size_t i = 0; i < len; i++)
		snprintf(s + 2 * i, 3, "%02x", ((const uint8_t *)buf)[i]);
	s[len * 2] = '\0';
	return s;
}

static size_t
unhex(const char *h, uint8_t *out, size_t cap)
{
	size_t n = strlen(h) / 2;

	ck_assert_uint_le(n, cap);
	for (size_t i = 0; i < n; i++) {
		unsigned x;
		ck_assert_int_eq(sscanf(h + 2 * i, "%2x", &x), 1);
		out[i] = (uint8_t)x;
	}
	return n;
}

/* Decodes a value from hex msgpack, expecting EPARSE with `frag`. */
static void
assert_msgpack_fails(const char *hexbytes, const char *frag)
{
	uint8_t buf[256];
	size_t n = unhex(hexbytes, buf, sizeof(buf)), used = 0;
	cwi_value v = {0};
	cachew_err rv = cwi_value_from_msgpack(buf, n, &used, &v, 32);

	ck_assert_msg(rv == CACHEW_EPARSE, "%s: want EPARSE, got %s", hexbytes,
	    cachew_strerror(rv));
	ck_assert_msg(strstr(cachew_errmsg(), frag) != NULL,
	    "%s: message '%s' lacks '%s'", hexbytes, cachew_errmsg(), frag);
	ck_assert_int_eq(v.type, CWI_V_NIL);
}

/* Decodes hex msgpack and asserts its pipeline-syntax form. */
static void
assert_msgpack_value(const char *hexbytes, const char *printed)
{
	uint8_t buf[256];
	size_t n = unhex(hexbytes, buf, sizeof(buf)), used = 0;
	cwi_value v = {0};
	cachew_err rv = cwi_value_from_msgpack(buf, n, &used, &v, 32);
	char *s;

	ck_assert_msg(rv == CACHEW_OK, "%s: %s", hexbytes, cachew_errmsg());
	ck_assert_uint_eq(used, n);
	s = value_str(&v);
	ck_assert_str_eq(s, printed);
	cachew_free(s);
	cwi_value_free(&v);
}

static void *
msgpack_of(const char *text, size_t *len)
{
	cachew_dataset *ds = parse_ok(text);
	void *buf = NULL;

	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, len), CACHEW_OK);
	cachew_dataset_release(ds);
	return buf;
}

/* Asserts that from_msgpack of the hex bytes fails with `code` and a
 * message holding `frag`. */
static void
assert_graph_fails(const char *hexbytes, cachew_err code, const char *frag)
{
	uint8_t buf[512];
	size_t n = unhex(hexbytes, buf, sizeof(buf));
	cachew_dataset *ds = NULL;
	cachew_err rv = cachew_dataset_from_msgpack(&ds, buf, n);

	ck_assert_msg(rv == code, "want %s, got %s (%s)", cachew_strerror(code),
	    cachew_strerror(rv), cachew_errmsg());
	ck_assert_ptr_null(ds);
	ck_assert_msg(strstr(cachew_errmsg(), frag) != NULL,
	    "message '%s' lacks '%s'", cachew_errmsg(), frag);
}

/* msgpack of a one-node graph whose node map is given as hex, with the
 * given root and version, built from fixed pieces:
 * {format: "cachew-graph", nodes: [<nodes>], root: R, version: V}. */
static char *
graph_hex(const char *nodes_hex, int nnodes, int root, int version)
{
	char *s = malloc(strlen(nodes_hex) + 256);

	ck_assert_ptr_nonnull(s);
	sprintf(s,
	    "84"
	    "a6666f726d6174" "ac6361636865772d6772617068" /* format */
	    "a56e6f646573" "%02x%s"                       /* nodes */
	    "a4726f6f74" "%02x"                           /* root */
	    "a776657273696f6e" "%02x",                    /* version */
	    0x90 | nnodes, nodes_hex, root & 0xff, version & 0xff);
	return s;
}

/* {inputs: [..], op: "range", params: {stop: 3}} with the inputs hex. */
#define NODE_RANGE3                                                        \
	"83" "a6696e70757473" "90" "a26f70" "a572616e6765" "a6706172616d73" \
	"81" "a473746f70" "03"

/* {inputs: <inputs hex>, op: "batch", params: {n: 1}}. */
#define NODE_BATCH(inputs)                                                  \
	"83" "a6696e70757473" inputs "a26f70" "a56261746368" "a6706172616d73" \
	"81" "a16e" "01"

/* ---- parsing: values ----------------------------------------------------------- */

START_TEST(test_value_parse_integers_decimal_hex_signed)
{
	assert_value("0", "0");
	assert_value("42", "42");
	assert_value("-17", "-17");
	assert_value("+5", "5");
	assert_value("0x1F", "31");
	assert_value("-0x10", "-16");
	assert_value("007", "7");
	assert_value("9223372036854775807", "9223372036854775807");
	assert_value("-9223372036854775808", "-9223372036854775808");
	assert_value("0x7fffffffffffffff", "9223372036854775807");
}
END_TEST

START_TEST(test_value_parse_integer_overflow_is_error)
{
	assert_value_fails("9223372036854775808", "out of range");
	assert_value_fails("-9223372036854775809", "out of range");
	assert_value_fails("0xffffffffffffffff", "out of range");
	assert_value_fails("99999999999999999999999999999999", "out of range");
	assert_value_fails("0x", "expected hex digits after '0x'");
	assert_value_fails("12abc", "column 3: unexpected 'a' after the number");
}
END_TEST

START_TEST(test_value_parse_floats_and_specials)
{
	assert_value("1.5", "1.5");
	assert_value("-2e-3", "-0.002");
	assert_value(".5", "0.5");
	assert_value("1.", "1.0");
	assert_value("1e3", "1e+03");
	assert_value("nan", "nan");
	assert_value("inf", "inf");
	assert_value("-inf", "-inf");
	assert_value("+inf", "inf");
	assert_value("-0.0", "-0.0");
	assert_value_fails("1e", "expected digits in the exponent");
	assert_value_fails("-", "expected a number");
	assert_value_fails("1.2.3", "unexpected '.' after the number");
}
END_TEST

START_TEST(test_value_parse_keywords_and_identifiers)
{
	cwi_value v = {0};

	assert_value("true", "true");
	assert_value("false", "false");
	assert_value("null", "null");
	ck_assert_int_eq(cwi_value_parse(&v, "bilinear"), CACHEW_OK);
	ck_assert_int_eq(v.type, CWI_V_STR);
	ck_assert_str_eq(v.u.s.ptr, "bilinear");
	cwi_value_free(&v);
}
END_TEST

START_TEST(test_value_parse_strings_with_escapes)
{
	cwi_value v = {0};

	ck_assert_int_eq(cwi_value_parse(&v,
			     "\"q\\\"s\\'b\\\\n\\nt\\tr\\rz\\0x\\x41\\x7e\""),
	    CACHEW_OK);
	ck_assert_int_eq(v.type, CWI_V_STR);
	ck_assert_uint_eq(v.u.s.len, 17);
	ck_assert_int_eq(memcmp(v.u.s.ptr, "q\"s'b\\n\nt\tr\rz\0xA~", 17), 0);
	cwi_value_free(&v);
	ck_assert_int_eq(cwi_value_parse(&v, "'it\\'s \"fine\"'"), CACHEW_OK);
	ck_assert_str_eq(v.u.s.ptr, "it's \"fine\"");
	cwi_value_free(&v);
	assert_value("\"a b\"", "\"a b\"");
	assert_value("\"\"", "\"\"");
	/* Strings that look like names print bare: they are the same value. */
	assert_value("\"abc\"", "abc");
	assert_value("\"true\"", "\"true\"");
}
END_TEST

START_TEST(test_value_parse_string_errors)
{
	assert_value_fails("\"abc", "column 1: unterminated string");
	assert_value_fails("\"a\\qb\"", "column 3: unknown escape '\\q'");
	assert_value_fails("\"a\\x4\"", "column 3: \\x needs two hex digits");
	assert_value_fails("\"a\nb\"", "newline inside a string");
}
END_TEST

START_TEST(test_value_parse_lists_tuples_maps)
{
	assert_value("[1, [2, 3], (4,), (), {b=\"x\", a=1}]",
	    "[1, [2, 3], (4,), (), {a=1, b=x}]");
	assert_value("[ ]", "[]");
	assert_value("[1, 2,]", "[1, 2]");
	assert_value("(1, 2.5, \"a\")", "(1, 2.5, a)");
	assert_value("{}", "{}");
	assert_value("{size=[224, 224], mode=bilinear,}",
	    "{mode=bilinear, size=[224, 224]}");
}
END_TEST

START_TEST(test_value_parse_one_item_tuple_needs_comma)
{
	assert_value_fails("(1)", "column 3: a one-item tuple needs a trailing "
				  "comma: (x,)");
	assert_value("(1,)", "(1,)");
}
END_TEST

START_TEST(test_value_parse_bracket_errors_name_the_opening)
{
	assert_value_fails("[1, 2", "column 6: expected ',' or ']' to close the "
				    "list opened at column 1, found end of input");
	assert_value_fails("[1,\n (2, 3]", "line 2, column 7: expected ',' or "
					   "')' to close the tuple opened at "
					   "line 2, column 2, found ']'");
	assert_value_fails("{a=1, a=2}", "column 7: key 'a' appears twice in "
					 "the map");
	assert_value_fails("{a 1}", "expected '=' after the map key 'a'");
	assert_value_fails("{1=2}", "expected a key name in the map, found '1'");
	assert_value_fails("[range(3)]", "'range' starts a pipeline");
	assert_value_fails("1 2", "column 3: unexpected '2' after the value");
	assert_value_fails("", "column 1: expected a value, found end of input");
}
END_TEST

START_TEST(test_value_parse_nesting_limit_is_32)
{
	char ok[80], deep[80];

	memset(ok, '[', 32);
	memset(ok + 32, ']', 32);
	ok[64] = '\0';
	memset(deep, '[', 33);
	memset(deep + 33, ']', 33);
	deep[66] = '\0';
	assert_value(ok, ok);
	assert_value_fails(deep, "column 33: nesting deeper than 32 levels");
}
END_TEST

/* ---- parsing: pipelines ------------------------------------------------------------ */

START_TEST(test_parse_positional_forms_bind_in_spec_order)
{
	char a[33], b[33], c[33], d[33];

	fp_of("range(5)", a);
	fp_of("range(0, 5, 1)", b);
	fp_of("range(0, 5)", c);
	fp_of("range(stop=5, start=0)", d);
	ck_assert_str_eq(a, b);
	ck_assert_str_eq(a, c);
	ck_assert_str_eq(a, d);
	assert_canonical("range(2, 9)", "range(start=2, stop=9, step=1)");
}
END_TEST

START_TEST(test_parse_named_args_any_order)
{
	assert_canonical("range(step=2, stop=10)",
	    "range(start=0, stop=10, step=2)");
	assert_canonical("range(3) | batch(drop_remainder=true, n=2)",
	    "range(start=0, stop=3, step=1) | batch(n=2, drop_remainder=true)");
}
END_TEST

START_TEST(test_parse_identifier_is_a_string_and_auto_an_int)
{
	cachew_dataset *ds = parse_ok("range(3) | map(add, parallel=auto)");

	ck_assert_str_eq(cachew_dataset_op(ds), "map");
	ck_assert_str_eq(cwi_node_str(ds, "fn"), "add");
	ck_assert_int_eq(cwi_node_int(ds, "parallel"), CACHEW_AUTO);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_parse_stage_without_parentheses)
{
	char a[33], b[33];

	if (!has_op("unbatch"))
		return; /* not registered in this build yet */
	fp_of("range(3) | batch(2) | unbatch", a);
	fp_of("range(3) | batch(2) | unbatch()", b);
	ck_assert_str_eq(a, b);
}
END_TEST

START_TEST(test_parse_comments_and_newlines)
{
	char a[33], b[33];

	fp_of("# the source\nrange(10)   # ten numbers\n"
	      "\t| batch(4,   # four\n drop_remainder = true)\n# end\n",
	    a);
	fp_of("range(10) | batch(4, drop_remainder=true)", b);
	ck_assert_str_eq(a, b);
}
END_TEST

START_TEST(test_parse_nested_pipelines_become_inputs)
{
	cachew_dataset *ds;
	char a[33], b[33];

	if (!has_op("zip"))
		return; /* not registered in this build yet */
	ds = parse_ok("zip(range(3), range(4) | map(add))");
	ck_assert_str_eq(cachew_dataset_op(ds), "zip");
	ck_assert_uint_eq(cachew_dataset_num_inputs(ds), 2);
	ck_assert_str_eq(cachew_dataset_op(cachew_dataset_input(ds, 0)), "range");
	ck_assert_str_eq(cachew_dataset_op(cachew_dataset_input(ds, 1)), "map");
	fp_hex(ds, a);
	cachew_dataset_release(ds);
	/* The upstream stage is input 0, like the first nested pipeline. */
	fp_of("range(3) | zip(range(4) | map(add))", b);
	ck_assert_str_eq(a, b);
}
END_TEST

START_TEST(test_params_parse_builds_a_map)
{
	cachew_params *p = NULL;
	int64_t size[4];
	size_t n = 0;
	int64_t i;
	const char *s;

	ck_assert_int_eq(cachew_params_parse(&p,
			     "value=1, size=[224, 224], mode=bilinear,"),
	    CACHEW_OK);
	ck_assert_uint_eq(cachew_params_count(p), 3);
	ck_assert_str_eq(cachew_params_key(p, 0), "mode");
	ck_assert_int_eq(cachew_params_get_int(p, "value", &i), CACHEW_OK);
	ck_assert_int_eq(i, 1);
	ck_assert_int_eq(cachew_params_get_str(p, "mode", &s), CACHEW_OK);
	ck_assert_str_eq(s, "bilinear");
	ck_assert_int_eq(
	    cachew_params_get_int_list(p, "size", size, 4, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(size[1], 224);
	cachew_params_destroy(p);
	ck_assert_int_eq(cachew_params_parse(&p, "  # nothing\n"), CACHEW_OK);
	ck_assert_uint_eq(cachew_params_count(p), 0);
	cachew_params_destroy(p);
}
END_TEST

START_TEST(test_params_parse_errors)
{
	cachew_params *p = NULL;

	ck_assert_int_eq(cachew_params_parse(&p, "a=1, b=2, a=3"), CACHEW_EPARSE);
	ck_assert_ptr_null(p);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "column 11: parameter 'a' is given twice"));
	ck_assert_int_eq(cachew_params_parse(&p, "a=1 b=2"), CACHEW_EPARSE);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "column 5: expected ',' or "
						      "the end after a parameter"));
	ck_assert_int_eq(cachew_params_parse(&p, "a"), CACHEW_EPARSE);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "column 2: expected '=' after the parameter name 'a'"));
	ck_assert_int_eq(cachew_params_parse(&p, "=1"), CACHEW_EPARSE);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(),
	    "column 1: expected a parameter name, found '='"));
}
END_TEST

/* ---- parsing: errors --------------------------------------------------------------- */

START_TEST(test_parse_error_double_comma_exact_message)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "range(10) | map(add,, value=1)"),
	    CACHEW_EPARSE);
	ck_assert_str_eq(cachew_errmsg(),
	    "column 21: expected an argument of 'map', found ','\n"
	    "range(10) | map(add,, value=1)\n"
	    "                    ^");
}
END_TEST

START_TEST(test_parse_error_unclosed_arguments)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(10) | map(add"),
	    CACHEW_EPARSE);
	ck_assert_str_eq(cachew_errmsg(),
	    "column 20: expected ')' to close the arguments of 'map', found "
	    "end of input\n"
	    "range(10) | map(add\n"
	    "                   ^");
	assert_parse_fails("range(10) | map(add value=1)", CACHEW_EPARSE,
	    "column 21: expected ')' to close the arguments of 'map', found "
	    "'value'",
	    NULL);
}
END_TEST

START_TEST(test_parse_error_unknown_operator_keeps_enoent)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(3) | frobnicate(2)"),
	    CACHEW_ENOENT);
	ck_assert_str_eq(cachew_errmsg(),
	    "column 12: unknown operator 'frobnicate'\n"
	    "range(3) | frobnicate(2)\n"
	    "           ^");
}
END_TEST

START_TEST(test_parse_error_unknown_param_keeps_einval_and_names_it)
{
	assert_parse_fails("range(3) | batch(4, dropp=true)", CACHEW_EINVAL,
	    "column 12: batch: unknown parameter 'dropp'", NULL);
	assert_parse_fails("range(3) | map(add, valu=2)", CACHEW_EINVAL,
	    "column 12: ", "'valu'", NULL);
	assert_parse_fails("range(3) | map(nosuchfn)", CACHEW_ENOENT,
	    "column 12: map: unknown function 'nosuchfn'", NULL);
}
END_TEST

START_TEST(test_parse_error_bad_values_keep_their_code)
{
	assert_parse_fails("range(3) | batch(0)", CACHEW_ERANGE,
	    "column 12: batch: parameter 'n' must be in [1, ", NULL);
	assert_parse_fails("range(3) | batch(\"four\")", CACHEW_EINVAL,
	    "column 12: batch: parameter 'n' must be an integer", NULL);
	assert_parse_fails("range(1, 2, 3, 4, 5)", CACHEW_EINVAL,
	    "column 1: range: too many positional arguments", NULL);
	assert_parse_fails("range(3) | range(4)", CACHEW_EINVAL,
	    "column 12: range: is a source", NULL);
}
END_TEST

/* A string parameter is a path, URL or name that C reads up to its first
 * NUL: one holding a NUL is refused, naming the parameter (and the item of
 * a list), never cut short ("/etc/hostname\0.txt" would read
 * /etc/hostname). Literal data keeps its NULs. */
START_TEST(test_parse_error_nul_in_a_string_parameter)
{
	cachew_dataset *ds = NULL;

	assert_parse_fails("text_lines(\"/etc/hostname\\0.txt\")",
	    CACHEW_EINVAL, "text_lines: parameter 'files' holds a NUL byte at "
	    "offset 13: a path, URL or name cannot", NULL);
	assert_parse_fails("list_files([\"/tmp/a\", \"/etc/\\0x\"])",
	    CACHEW_EINVAL, "list_files: parameter 'files' (item 1) holds a "
	    "NUL byte at offset 5", NULL);
	assert_parse_fails("range(3) | tfrecord_write(path=\"/tmp/x\\0y\")",
	    CACHEW_EINVAL, "tfrecord_write: parameter 'path' holds a NUL",
	    NULL);
	/* A function's string parameter, read with cachew_params_get_str. */
	assert_parse_fails("range(3) | map(cast, dtype=\"u8\\0\")",
	    CACHEW_EINVAL, "parameter 'dtype' holds a NUL byte", NULL);
	/* Data may hold any byte. */
	ck_assert_int_eq(cachew_dataset_parse(&ds,
			     "from_list([\"a\\0b\"]) | map(identity)"),
	    CACHEW_OK);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_parse_error_float_for_an_int_param)
{
	/* An integral float converts; one beyond int64 is not an integer
	 * (found by fuzz_pipeline: the conversion must not overflow). */
	assert_canonical("range(5.0)", "range(start=0, stop=5, step=1)");
	assert_parse_fails("range(-91111111111191111112.)", CACHEW_EINVAL,
	    "column 1: range: parameter 'stop' must be an integer", NULL);
	assert_parse_fails("range(1e300)", CACHEW_EINVAL,
	    "parameter 'stop' must be an integer", NULL);
	assert_parse_fails("range(nan)", CACHEW_EINVAL,
	    "parameter 'stop' must be an integer", NULL);
}
END_TEST

START_TEST(test_parse_error_trailing_text_and_empty)
{
	assert_parse_fails("range(3) batch(2)", CACHEW_EPARSE,
	    "column 10: expected '|' or the end of the pipeline, found 'batch'",
	    NULL);
	assert_parse_fails("range(3))", CACHEW_EPARSE, "column 9: ", "')'", NULL);
	assert_parse_fails("", CACHEW_EPARSE,
	    "column 1: expected an operator name, found end of input", NULL);
	assert_parse_fails("range(3) |", CACHEW_EPARSE,
	    "column 11: expected an operator name, found end of input", NULL);
	assert_parse_fails("| range(3)", CACHEW_EPARSE,
	    "column 1: expected an operator name, found '|'", NULL);
}
END_TEST

START_TEST(test_parse_error_names_line_after_the_first)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds, "range(3)\n  | batch(,)"),
	    CACHEW_EPARSE);
	ck_assert_str_eq(cachew_errmsg(),
	    "line 2, column 11: expected an argument of 'batch', found ','\n"
	    "  | batch(,)\n"
	    "          ^");
}
END_TEST

START_TEST(test_parse_error_long_line_is_cut_around_the_column)
{
	char text[400], *msg, *excerpt, *caret;
	cachew_dataset *ds = NULL;

	strcpy(text, "range(1)");
	for (int i = 0; i < 30; i++)
		strcat(text, " | take(1)");
	strcat(text, " | take(?)");
	ck_assert_int_eq(cachew_dataset_parse(&ds, text), CACHEW_EPARSE);
	msg = strdup(cachew_errmsg());
	ck_assert_ptr_nonnull(strstr(msg, "column 317: expected a value, found "
					  "'?'\n..."));
	excerpt = strchr(msg, '\n') + 1;
	caret = strchr(excerpt, '\n') + 1;
	*(caret - 1) = '\0';
	ck_assert_uint_le(strlen(excerpt), 78);
	/* The caret stands under the '?' of the excerpt. */
	ck_assert_uint_eq(strspn(caret, " "), strchr(excerpt, '?') - excerpt);
	ck_assert_str_eq(caret + strspn(caret, " "), "^");
	free(msg);
}
END_TEST

START_TEST(test_parse_error_duplicate_and_misplaced_arguments)
{
	assert_parse_fails("range(3) | batch(n=1, n=2)", CACHEW_EPARSE,
	    "column 23: argument 'n' is given twice", NULL);
	assert_parse_fails("range(3) | batch(n=1, 2)", CACHEW_EPARSE,
	    "column 23: positional argument of 'batch' after a named one", NULL);
	assert_parse_fails("range(3) | batch(n=range(2))", CACHEW_EPARSE,
	    "column 20: 'range' starts a pipeline, which may only be a "
	    "positional argument",
	    NULL);
	assert_parse_fails("range(3) | batch(2", CACHEW_EPARSE, "column 19", NULL);
}
END_TEST

START_TEST(test_parse_error_in_nested_pipeline_points_inside)
{
	if (!has_op("zip"))
		return; /* not registered in this build yet */
	assert_parse_fails("zip(range(3), range(4) | nope)", CACHEW_ENOENT,
	    "column 26: unknown operator 'nope'", NULL);
	assert_parse_fails("zip(range(3), range(4) | batch(0))", CACHEW_ERANGE,
	    "column 26: batch: parameter 'n'", NULL);
}
END_TEST

/* ---- parsing: limits --------------------------------------------------------------- */

START_TEST(test_parse_limit_deep_nesting_is_an_error)
{
	char text[1024] = "";

	/* zip(zip(zip(... range(1) ...))) forty levels deep. */
	for (int i = 0; i < 40; i++)
		strcat(text, "zip(");
	strcat(text, "range(1)");
	for (int i = 0; i < 40; i++)
		strcat(text, ")");
	assert_parse_fails(text, CACHEW_EPARSE, "nesting deeper than 32 levels",
	    NULL);
	/* The stage's parenthesis is a level: 31 brackets fit inside. */
	strcpy(text, "from_list(");
	memset(text + 10, '[', 32);
	strcpy(text + 42, "1");
	memset(text + 43, ']', 32);
	strcpy(text + 75, ")");
	assert_parse_fails(text, CACHEW_EPARSE,
	    "column 42: nesting deeper than 32 levels", NULL);
}
END_TEST

START_TEST(test_parse_limit_huge_integers_are_errors)
{
	assert_parse_fails("range(99999999999999999999)", CACHEW_EPARSE,
	    "column 7: integer 99999999999999999999 is out of range", NULL);
	assert_parse_fails("range(0x10000000000000000)", CACHEW_EPARSE,
	    "column 7: integer 0x10000000000000000 is out of range", NULL);
	assert_canonical("range(-9223372036854775808, 9223372036854775807)",
	    "range(start=-9223372036854775808, stop=9223372036854775807, "
	    "step=1)");
}
END_TEST

START_TEST(test_parse_limit_input_of_more_than_1mib)
{
	size_t n = (1u << 20) + 1;
	char *text = malloc(n + 1);

	ck_assert_ptr_nonnull(text);
	memset(text, ' ', n);
	memcpy(text, "range(3)", 8);
	text[n] = '\0';
	assert_parse_fails(text, CACHEW_EPARSE,
	    "pipeline is longer than 1048576 bytes", NULL);
	/* Exactly 1 MiB is fine. */
	text[n - 1] = '\0';
	cachew_dataset_release(parse_ok(text));
	free(text);
}
END_TEST

START_TEST(test_parse_limit_4096_stages)
{
	size_t cap = 4200 * 12;
	char *text = malloc(cap);
	cachew_dataset *ds;
	char *end = text + sprintf(text, "range(1)");

	ck_assert_ptr_nonnull(text);
	/* take, not batch: a batch of a batch ... reaches rank 8 after 8
	 * stages, which building refuses. */
	for (int i = 1; i < 4096; i++)
		end += sprintf(end, " | take(1)");
	ds = parse_ok(text);
	cachew_dataset_release(ds);
	strcat(text, " | take(1)");
	assert_parse_fails(text, CACHEW_EPARSE, "more than 4096 stages", NULL);
	free(text);
}
END_TEST

START_TEST(test_parse_rejects_null_arguments)
{
	cachew_dataset *ds = NULL;

	ck_assert_int_eq(cachew_dataset_parse(&ds, NULL), CACHEW_EINVAL);
	ck_assert_int_eq(cachew_dataset_parse(NULL, "range(3)"), CACHEW_EINVAL);
}
END_TEST

/* ---- canonical strings ------------------------------------------------------------- */

START_TEST(test_canonical_range_batch)
{
	assert_canonical("range(10) | batch(4)",
	    "range(start=0, stop=10, step=1) | batch(n=4, drop_remainder=false)");
}
END_TEST

START_TEST(test_canonical_map_fn_first_then_params_then_fn_params)
{
	assert_canonical("range(3)|map(add,value=2,parallel=auto)",
	    "range(start=0, stop=3, step=1) | map(add, parallel=auto, "
	    "deterministic=true, value=2)");
	assert_canonical("range(3) | map(fn=add, fn_params={value=2.5})",
	    "range(start=0, stop=3, step=1) | map(add, parallel=1, "
	    "deterministic=true, value=2.5)");
}
END_TEST

/* An operator that is a function's alias takes the function's leading
 * parameters positionally, as tf.data and torchvision users write them
 * (before, `center_crop(224, 224)` bound 224 to map's `fn`: "parameter
 * 'fn' is given twice"). */
START_TEST(test_canonical_alias_positional_values_fill_the_function)
{
	/* Decoded images, so that the functions' specs accept them. */
	static const char *const img =
	    "text_lines(files=x, buffer_size=1048576) | map(decode_jpeg, "
	    "parallel=1, deterministic=true)";
	char want[600];

	snprintf(want, sizeof(want), "%s | map(center_crop, parallel=1, "
	    "deterministic=true, h=224, w=224) | map(resize, parallel=2, "
	    "deterministic=true, h=10, w=20) | map(normalize, parallel=1, "
	    "deterministic=true, mean=[0.5], std=[0.25])", img);
	assert_canonical("text_lines(\"x\") | decode_jpeg | "
	    "center_crop(224, 224) | resize(10, w=20, parallel=2) | "
	    "normalize([0.5], [0.25])", want);
	assert_parse_fails("text_lines(\"x\") | decode_jpeg | "
	    "center_crop(224, h=3)", CACHEW_EINVAL,
	    "center_crop: parameter 'h' is given twice", NULL);
	assert_parse_fails("text_lines(\"x\") | decode_jpeg | "
	    "center_crop(1, 2, 3)", CACHEW_EINVAL,
	    "center_crop: too many positional arguments (3); name them", NULL);
}
END_TEST

START_TEST(test_canonical_fn_params_colliding_with_a_param_stay_a_map)
{
	register_test_fns();
	assert_canonical(
	    "range(3) | map(cwt_any, fn_params={parallel=3, mode=x})",
	    "range(start=0, stop=3, step=1) | map(cwt_any, parallel=1, "
	    "deterministic=true, mode=x, fn_params={parallel=3})");
	assert_canonical("range(3) | map(cwt_any, fn_params={fn_params=1})",
	    "range(start=0, stop=3, step=1) | map(cwt_any, parallel=1, "
	    "deterministic=true, fn_params={fn_params=1})");
}
END_TEST

START_TEST(test_canonical_optional_param_absent_is_skipped)
{
	if (!has_op("padded_batch"))
		return; /* not registered in this build yet */
	assert_canonical("range(3) | padded_batch(2)",
	    "range(start=0, stop=3, step=1) | padded_batch(n=2, pad_value=0.0, "
	    "drop_remainder=false)");
	assert_canonical("range(3) | padded_batch(2, shape=[4])",
	    "range(start=0, stop=3, step=1) | padded_batch(n=2, pad_value=0.0, "
	    "drop_remainder=false, shape=[4])");
}
END_TEST

START_TEST(test_canonical_nested_inputs_print_inside_the_stage)
{
	if (!has_op("zip"))
		return; /* not registered in this build yet */
	assert_canonical("zip(range(3), range(4) | map(add), range(5))",
	    "range(start=0, stop=3, step=1) | zip(range(start=0, stop=4, "
	    "step=1) | map(add, parallel=1, deterministic=true), "
	    "range(start=0, stop=5, step=1))");
}
END_TEST

START_TEST(test_canonical_strings_and_literals)
{
	if (!has_op("from_list"))
		return; /* not registered in this build yet */
	assert_canonical("from_list(['a b', \"x\", 'true', \"\\t\"])",
	    "from_list(values=[\"a b\", x, \"true\", \"\\t\"])");
	assert_canonical("from_list([1.0, -0x2, 1e300])",
	    "from_list(values=[1.0, -2, 1e+300])");
}
END_TEST

START_TEST(test_canonical_stage_without_params_prints_empty_parens)
{
	if (!has_op("unbatch"))
		return; /* not registered in this build yet */
	assert_canonical("range(3) | batch(2) | unbatch",
	    "range(start=0, stop=3, step=1) | batch(n=2, drop_remainder=false) "
	    "| unbatch()");
}
END_TEST

START_TEST(test_canonical_of_builder_api_matches_parser)
{
	cachew_dataset *r = NULL, *b = NULL;
	char *s;

	ck_assert_int_eq(cachew_dataset_range(&r, 0, 10, 1), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_batch(&b, r, 4, 0), CACHEW_OK);
	s = to_str(b);
	ck_assert_str_eq(s,
	    "range(start=0, stop=10, step=1) | batch(n=4, drop_remainder=false)");
	cachew_free(s);
	cachew_dataset_release(b);
	cachew_dataset_release(r);
}
END_TEST

/* Every operator: the canonical string parses back to the same
 * fingerprint and prints identically, and the msgpack form decodes to the
 * same fingerprint and re-encodes to the same bytes. Operators still
 * being written by others are skipped while cwi_dataset_op_lookup() does
 * not know them, so entries start counting as soon as they land. "%s" is
 * replaced by the path of a small temporary file. */
static const struct {
	const char *ops[3];
	const char *text;
} roundtrip_cases[] = {
    {{"range"}, "range(10)"},
    {{"range"}, "range(-5, 20, 3)"},
    {{"batch"}, "range(2, 20, 3) | batch(4, drop_remainder=true)"},
    {{"map"}, "range(10) | map(add, value=2.5, parallel=auto)"},
    {{"map"}, "range(10) | map(mul, value=3, parallel=4, deterministic=false)"},
    {{"map"}, "range(10) | map(cwt_any, mode=bilinear, size=[224, 224], "
	      "scale=0.5, label='x y', flag=null, fn_params={parallel=1})"},
    {{"filter"}, "range(10) | filter(cwt_keep)"},
    {{"flat_map"}, "range(10) | flat_map(cwt_flat, k=2)"},
    {{"padded_batch"}, "range(10) | padded_batch(3, pad_value=-1, shape=[4])"},
    {{"unbatch"}, "range(10) | batch(2) | unbatch"},
    {{"shuffle"}, "range(10) | shuffle(100, seed=7, "
		  "reshuffle_each_iteration=false)"},
    {{"repeat", "take", "skip"}, "range(10) | repeat(3) | take(5) | skip(1)"},
    {{"repeat"}, "range(10) | repeat"},
    {{"shard"}, "range(10) | shard(4, 1)"},
    {{"zip"}, "zip(range(3), range(4) | map(add), range(1) | batch(1))"},
    {{"zip"}, "zip(range(3), range(3))"},
    {{"concatenate"}, "range(3) | concatenate(range(5))"},
    {{"enumerate"}, "range(3) | enumerate(start=5)"},
    {{"autocache", "prefetch"}, "range(3) | autocache | prefetch(auto)"},
    {{"prefetch"}, "range(3) | prefetch(8)"},
    {{"from_tensors"}, "from_tensors((1, \"a\", [1.5, 2.5], (2,)))"},
    {{"from_tensors"}, "from_tensors([[1, 2], [3, 4]])"},
    {{"from_list"}, "from_list([1, 2, 3]) | batch(2)"},
    {{"from_list"}, "from_list([(1.5, 'a'), (2.5, 'b'), (nan, \"\\x00\\n\")])"},
    {{"text_lines"}, "text_lines(\"%s\")"},
    {{"text_lines"}, "text_lines([\"%s\", \"%s\"], buffer_size=4096)"},
    {{"fixed_length_records"},
	"fixed_length_records([\"%s\"], record_bytes=4, header_bytes=1)"},
    {{"list_files"}, "list_files(\"%s\", shuffle=false)"},
    {{"list_files", "read_file"}, "list_files(\"%s\") | read_file"},
    {{"list_files", "flat_map"}, "list_files(\"%s\") | flat_map(text_lines)"},
    {{"list_files", "interleave"}, "list_files(\"%s\") | "
				   "interleave(text_lines, cycle=2, block=1, "
				   "parallel=auto)"},
};

static void
roundtrip_one(const char *text)
{
	cachew_dataset *ds = parse_ok(text), *again, *back;
	char *s1 = to_str(ds), *s2, fp1[33], fp2[33], fp3[33];
	void *buf = NULL, *buf2 = NULL;
	size_t len = 0, len2 = 0;

	again = parse_ok(s1);
	s2 = to_str(again);
	ck_assert_str_eq(s1, s2);
	fp_hex(ds, fp1);
	fp_hex(again, fp2);
	ck_assert_msg(strcmp(fp1, fp2) == 0, "%s: string changed fingerprint",
	    text);
	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len), CACHEW_OK);
	ck_assert_msg(cachew_dataset_from_msgpack(&back, buf, len) == CACHEW_OK,
	    "%s: %s", text, cachew_errmsg());
	fp_hex(back, fp3);
	ck_assert_msg(strcmp(fp1, fp3) == 0, "%s: msgpack changed fingerprint",
	    text);
	ck_assert_int_eq(cachew_dataset_to_msgpack(back, &buf2, &len2),
	    CACHEW_OK);
	ck_assert_uint_eq(len, len2);
	ck_assert_int_eq(memcmp(buf, buf2, len), 0);
	cachew_free(buf);
	cachew_free(buf2);
	cachew_free(s1);
	cachew_free(s2);
	cachew_dataset_release(back);
	cachew_dataset_release(again);
	cachew_dataset_release(ds);
}

START_TEST(test_roundtrip_every_operator_string_and_msgpack)
{
	char *dir = cwt_tmpdir(), path[512], text[2048];
	size_t done = 0;

	register_test_fns();
	snprintf(path, sizeof(path), "%s/data.txt", dir);
	cwt_write_file(path, "abcd\nefgh\nijkl\n", 15);
	for (size_t i = 0; i < sizeof(roundtrip_cases) / sizeof(roundtrip_cases[0]);
	     i++) {
		bool ok = true;
		for (size_t k = 0; k < 3 && roundtrip_cases[i].ops[k] != NULL; k++)
			ok = ok && has_op(roundtrip_cases[i].ops[k]);
		if (!ok)
			continue; /* operator not written yet */
		snprintf(text, sizeof(text), roundtrip_cases[i].text, path, path);
		roundtrip_one(text);
		done++;
	}
	ck_assert_uint_ge(done, 5);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

START_TEST(test_to_string_refuses_nesting_deeper_than_31)
{
	cachew_dataset *cur = NULL, *r = NULL, *next, *in[2];
	char *s = NULL;

	if (!has_op("zip"))
		return; /* not registered in this build yet */
	ck_assert_int_eq(cachew_dataset_range(&r, 0, 1, 1), CACHEW_OK);
	cur = cachew_dataset_retain(r);
	/* Each zip nests the previous one as its second input. */
	for (int i = 0; i < 40; i++) {
		in[0] = r;
		in[1] = cur;
		ck_assert_int_eq(cachew_dataset_zip(&next, in, 2), CACHEW_OK);
		cachew_dataset_release(cur);
		cur = next;
	}
	ck_assert_int_eq(cachew_dataset_to_string(cur, &s), CACHEW_ERANGE);
	ck_assert_ptr_nonnull(strstr(cachew_errmsg(), "nested more than 31 "
							  "levels deep"));
	cachew_dataset_release(cur);
	cachew_dataset_release(r);
}
END_TEST

/* ---- value msgpack --------------------------------------------------------------------- */

START_TEST(test_msgpack_value_canonical_bytes)
{
	static const struct {
		const char *text, *hex;
	} cases[] = {
	    {"0", "00"}, {"127", "7f"}, {"128", "cc80"}, {"255", "ccff"},
	    {"256", "cd0100"}, {"65536", "ce00010000"},
	    {"4294967296", "cf0000000100000000"}, {"-1", "ff"}, {"-32", "e0"},
	    {"-33", "d0df"}, {"-129", "d1ff7f"}, {"-32769", "d2ffff7fff"},
	    {"-2147483649", "d3ffffffff7fffffff"}, {"null", "c0"},
	    {"true", "c3"}, {"false", "c2"}, {"1.5", "cb3ff8000000000000"},
	    {"\"ab\"", "a26162"}, {"[1, 2]", "920102"}, {"{b=1, a=2}", "82a16102a16201"},
	    {"(1, 2)", "c70301920102"}, {"()", "d40190"}, {"(1,)", "d5019101"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cwi_value v = {0};
		cwi_strbuf sb;
		char *h;

		ck_assert_int_eq(cwi_value_parse(&v, cases[i].text), CACHEW_OK);
		cwi_strbuf_init(&sb);
		ck_assert_int_eq(cwi_value_to_msgpack(&v, &sb), CACHEW_OK);
		h = hex(sb.data, sb.len);
		ck_assert_msg(strcmp(h, cases[i].hex) == 0, "%s: got %s, want %s",
		    cases[i].text, h, cases[i].hex);
		free(h);
		cwi_strbuf_free(&sb);
		cwi_value_free(&v);
	}
}
END_TEST

START_TEST(test_msgpack_value_roundtrip_all_types_and_lengths)
{
	static const char *const texts[] = {
	    "[null, true, false, 0, -1, 127, 128, -33, 255, 256, 65535, 65536, "
	    "-129, -32768, -32769, 4294967295, 4294967296, "
	    "-9223372036854775808, 9223372036854775807, 1.5, -0.0, inf, -inf, "
	    "nan, 1e-300]",
	    "{a=(1,), b=(), c=[(1, 2), {d=[]}], e=\"\\x00\\xff\"}",
	};
	static const size_t lens[] = {0, 31, 32, 255, 256, 65535, 65536};

	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		cwi_value v = {0}, back = {0};
		cwi_strbuf sb;
		size_t used = 0;
		char *a, *b;

		ck_assert_int_eq(cwi_value_parse(&v, texts[i]), CACHEW_OK);
		cwi_strbuf_init(&sb);
		ck_assert_int_eq(cwi_value_to_msgpack(&v, &sb), CACHEW_OK);
		ck_assert_int_eq(cwi_value_from_msgpack((const uint8_t *)sb.data,
				     sb.len, &used, &back, 32),
		    CACHEW_OK);
		ck_assert_uint_eq(used, sb.len);
		a = value_str(&v);
		b = value_str(&back);
		ck_assert_str_eq(a, b);
		cachew_free(a);
		cachew_free(b);
		cwi_strbuf_free(&sb);
		cwi_value_free(&v);
		cwi_value_free(&back);
	}
	/* Strings and containers across every header size. */
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		cwi_value s = {0}, list = {.type = CWI_V_LIST}, map = {0}, back = {0};
		cwi_strbuf sb;
		size_t used = 0;
		char *str = malloc(lens[i] + 1);

		memset(str, 'x', lens[i]);
		str[lens[i]] = '\0';
		ck_assert_int_eq(cwi_value_set_str(&s, str, lens[i]), CACHEW_OK);
		for (size_t k = 0; k < lens[i] && k < 70000; k++) {
			cwi_value item = {.type = CWI_V_INT, .u.i = (int64_t)k};
			ck_assert_int_eq(cwi_value_list_push(&list, &item), CACHEW_OK);
		}
		ck_assert_int_eq(cwi_map_set(&map, "s", &s), CACHEW_OK);
		ck_assert_int_eq(cwi_map_set(&map, "l", &list), CACHEW_OK);
		cwi_strbuf_init(&sb);
		ck_assert_int_eq(cwi_value_to_msgpack(&map, &sb), CACHEW_OK);
		ck_assert_int_eq(cwi_value_from_msgpack((const uint8_t *)sb.data,
				     sb.len, &used, &back, 32),
		    CACHEW_OK);
		ck_assert_uint_eq(used, sb.len);
		ck_assert(cwi_value_equal(&map, &back));
		cwi_strbuf_free(&sb);
		cwi_value_free(&map);
		cwi_value_free(&back);
		free(str);
	}
}
END_TEST

START_TEST(test_msgpack_value_decodes_every_width)
{
	assert_msgpack_value("ccff", "255");
	assert_msgpack_value("cd0100", "256");
	assert_msgpack_value("ce00010000", "65536");
	assert_msgpack_value("cf7fffffffffffffff", "9223372036854775807");
	assert_msgpack_value("d0ff", "-1");
	assert_msgpack_value("d1ff00", "-256");
	assert_msgpack_value("d2ffff0000", "-65536");
	assert_msgpack_value("d38000000000000000", "-9223372036854775808");
	assert_msgpack_value("ca3fc00000", "1.5");
	assert_msgpack_value("cb7ff8000000000001", "nan");
	assert_msgpack_value("d9026162", "ab");
	assert_msgpack_value("da00026162", "ab");
	assert_msgpack_value("db000000026162", "ab");
	assert_msgpack_value("dc00020102", "[1, 2]");
	assert_msgpack_value("dd000000020102", "[1, 2]");
	assert_msgpack_value("de0001a16101", "{a=1}");
	assert_msgpack_value("df00000001a16101", "{a=1}");
	/* Keys out of order are sorted. */
	assert_msgpack_value("82a16201a16102", "{a=2, b=1}");
	assert_msgpack_value("c703019201" "02", "(1, 2)");
}
END_TEST

START_TEST(test_msgpack_hostile_counts_are_checked_before_allocating)
{
	/* An array claiming 2^32 - 1 items in 5 bytes. */
	assert_msgpack_fails("ddffffffff", "msgpack: array of 4294967295 items "
					   "exceeds the limit");
	assert_msgpack_fails("dd000f4240", "msgpack: array of 1000000 items "
					   "overruns the input (0 bytes remain) "
					   "at byte 0");
	assert_msgpack_fails("dfffffffff", "map of 4294967295 items");
	assert_msgpack_fails("de0002a16101", "map of 2 items overruns the input");
	assert_msgpack_fails("dbffffffff", "string of 4294967295 bytes exceeds");
	assert_msgpack_fails("db0000000561", "string of 5 bytes overruns the "
					     "input (1 bytes remain) at byte 0");
	assert_msgpack_fails("9301", "array of 3 items overruns the input");
	assert_msgpack_fails("929100", "unexpected end of input at byte 3");
	assert_msgpack_fails("cd01", "truncated header");
	assert_msgpack_fails("", "unexpected end of input at byte 0");
}
END_TEST

START_TEST(test_msgpack_hostile_types_and_values)
{
	assert_msgpack_fails("cfffffffffffffffff", "unsigned integer "
						   "18446744073709551615 is "
						   "larger than INT64_MAX at "
						   "byte 0");
	assert_msgpack_fails("c40100", "bin values are not supported at byte 0");
	assert_msgpack_fails("d40500", "ext type 5 is not supported");
	assert_msgpack_fails("d40101", "tuple payload is not an array (type "
					 "byte 0x01) at byte 2");
	assert_msgpack_fails("d6019101" "0203", "tuple payload has 2 bytes after "
						"its array");
	assert_msgpack_fails("c1", "invalid type byte 0xc1 at byte 0");
	assert_msgpack_fails("810101", "map key is not a string (type byte 0x01) "
				       "at byte 1");
	assert_msgpack_fails("82a16101a16102", "duplicate map key 'a' at byte 4");
	assert_msgpack_fails("81a2610001", "map key contains a NUL byte");
}
END_TEST

START_TEST(test_msgpack_hostile_depth_is_limited)
{
	uint8_t buf[200];
	cwi_value v = {0};
	size_t used;

	memset(buf, 0x91, 100);
	buf[100] = 0x01;
	ck_assert_int_eq(cwi_value_from_msgpack(buf, 101, &used, &v, 32),
	    CACHEW_EPARSE);
	ck_assert_str_eq(cachew_errmsg(),
	    "msgpack: array nested deeper than 32 levels at byte 32");
	ck_assert_int_eq(cwi_value_from_msgpack(buf + 68, 33, &used, &v, 32),
	    CACHEW_OK);
	cwi_value_free(&v);
}
END_TEST

START_TEST(test_msgpack_value_reports_bytes_used)
{
	uint8_t buf[] = {0x92, 0x01, 0x02, 0xc0, 0xc0};
	cwi_value v = {0};
	size_t used = 0;

	ck_assert_int_eq(cwi_value_from_msgpack(buf, sizeof(buf), &used, &v, 8),
	    CACHEW_OK);
	ck_assert_uint_eq(used, 3);
	cwi_value_free(&v);
}
END_TEST

/* ---- graph msgpack ---------------------------------------------------------------------- */

START_TEST(test_graph_msgpack_exact_bytes_of_range)
{
	size_t len = 0;
	void *buf = msgpack_of("range(3)", &len);
	char *h = hex(buf, len);

	/* {format: "cachew-graph", nodes: [{inputs: [], op: "range",
	 *  params: {start: 0, step: 1, stop: 3}}], root: 0, version: 1} */
	ck_assert_str_eq(h,
	    "84"
	    "a6666f726d6174" "ac6361636865772d6772617068"
	    "a56e6f646573" "91"
	    "83" "a6696e70757473" "90" "a26f70" "a572616e6765"
	    "a6706172616d73" "83" "a5737461727400" "a47374657001"
	    "a473746f7003"
	    "a4726f6f74" "00"
	    "a776657273696f6e" "01");
	free(h);
	cachew_free(buf);
}
END_TEST

START_TEST(test_graph_msgpack_roundtrip_keeps_fingerprint)
{
	cachew_dataset *ds = parse_ok("range(10) | map(add, value=3) | batch(4)");
	cachew_dataset *back = NULL;
	void *buf = NULL;
	size_t len = 0;
	char a[33], b[33], *s1, *s2;

	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_from_msgpack(&back, buf, len), CACHEW_OK);
	fp_hex(ds, a);
	fp_hex(back, b);
	ck_assert_str_eq(a, b);
	s1 = to_str(ds);
	s2 = to_str(back);
	ck_assert_str_eq(s1, s2);
	cachew_free(s1);
	cachew_free(s2);
	cachew_free(buf);
	cachew_dataset_release(back);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_graph_msgpack_shared_subgraph_written_once)
{
	cachew_dataset *r = NULL, *z = NULL, *in[2];
	void *a = NULL, *b = NULL;
	size_t alen = 0, blen = 0, used;
	cwi_value doc = {0};
	const cwi_value *nodes, *zin;

	if (!has_op("zip"))
		return; /* not registered in this build yet */
	/* Two equal but separate range nodes, and one shared range node,
	 * encode identically: each distinct node appears once. */
	a = msgpack_of("zip(range(3), range(3))", &alen);
	ck_assert_int_eq(cachew_dataset_range(&r, 0, 3, 1), CACHEW_OK);
	in[0] = in[1] = r;
	ck_assert_int_eq(cachew_dataset_zip(&z, in, 2), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_to_msgpack(z, &b, &blen), CACHEW_OK);
	ck_assert_uint_eq(alen, blen);
	ck_assert_int_eq(memcmp(a, b, alen), 0);
	ck_assert_int_eq(cwi_value_from_msgpack(a, alen, &used, &doc, 40),
	    CACHEW_OK);
	nodes = cwi_map_get(&doc, "nodes");
	ck_assert_uint_eq(nodes->u.list.n, 2);
	zin = cwi_map_get(&nodes->u.list.items[1], "inputs");
	ck_assert_uint_eq(zin->u.list.n, 2);
	ck_assert_int_eq(zin->u.list.items[0].u.i, 0);
	ck_assert_int_eq(zin->u.list.items[1].u.i, 0);
	cwi_value_free(&doc);
	cachew_free(a);
	cachew_free(b);
	cachew_dataset_release(z);
	cachew_dataset_release(r);
}
END_TEST

START_TEST(test_graph_msgpack_tuples_survive)
{
	char a[33], b[33], c[33];
	cachew_dataset *ds, *back = NULL;
	void *buf;
	size_t len;

	if (!has_op("from_tensors"))
		return; /* not registered in this build yet */
	ds = parse_ok("from_tensors((1, 2))");
	fp_hex(ds, a);
	fp_of("from_tensors([1, 2])", c);
	ck_assert_str_ne(a, c); /* a tuple is not a list */
	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_from_msgpack(&back, buf, len), CACHEW_OK);
	fp_hex(back, b);
	ck_assert_str_eq(a, b);
	cachew_free(buf);
	cachew_dataset_release(back);
	cachew_dataset_release(ds);
}
END_TEST

START_TEST(test_graph_msgpack_truncated_at_every_byte_is_an_error)
{
	size_t len = 0;
	uint8_t *buf = msgpack_of("range(10) | map(add, value=2) | batch(4)", &len);

	for (size_t n = 0; n < len; n++) {
		cachew_dataset *ds = NULL;
		uint8_t *cut = malloc(n + 1);
		memcpy(cut, buf, n);
		ck_assert_int_eq(cachew_dataset_from_msgpack(&ds, cut, n),
		    CACHEW_EPARSE);
		ck_assert_ptr_null(ds);
		ck_assert_str_ne(cachew_errmsg(), "");
		free(cut);
	}
	cachew_free(buf);
}
END_TEST

START_TEST(test_graph_msgpack_every_corrupted_byte_is_handled)
{
	size_t len = 0;
	uint8_t *buf = msgpack_of("range(10) | map(add, value=2) | batch(4)", &len);
	static const uint8_t flips[] = {0x00, 0xff, 0x80, 0x01, 0xc1, 0xdd};

	/* Every byte replaced by a few hostile values: an error or a valid
	 * graph, never a crash (fork mode turns a crash into a failure). */
	for (size_t i = 0; i < len; i++)
		for (size_t k = 0; k < sizeof(flips); k++) {
			cachew_dataset *ds = NULL;
			uint8_t saved = buf[i];
			buf[i] = flips[k];
			if (cachew_dataset_from_msgpack(&ds, buf, len) == CACHEW_OK)
				cachew_dataset_release(ds);
			else
				ck_assert_str_ne(cachew_errmsg(), "");
			buf[i] = saved;
		}
	cachew_free(buf);
}
END_TEST

START_TEST(test_graph_msgpack_hostile_documents)
{
	char *h;

	h = graph_hex(NODE_RANGE3, 1, 0, 1);
	{
		uint8_t buf[512];
		size_t n = unhex(h, buf, sizeof(buf));
		cachew_dataset *ds = NULL;
		ck_assert_msg(cachew_dataset_from_msgpack(&ds, buf, n) == CACHEW_OK,
		    "%s", cachew_errmsg());
		cachew_dataset_release(ds);
	}
	free(h);
	h = graph_hex(NODE_RANGE3, 1, 1, 1);
	assert_graph_fails(h, CACHEW_EPARSE,
	    "graph: 'root' is not the index of a node (there are 1)");
	free(h);
	h = graph_hex(NODE_RANGE3, 1, -1, 1);
	assert_graph_fails(h, CACHEW_EPARSE, "'root' is not the index of a node");
	free(h);
	h = graph_hex(NODE_RANGE3, 1, 0, 2);
	assert_graph_fails(h, CACHEW_EPARSE,
	    "graph: version 2 is not supported (this library reads version 1)");
	free(h);
	/* Node 0 naming itself, then node 0 naming node 1 (forward). */
	h = graph_hex(NODE_BATCH("9100"), 1, 0, 1);
	assert_graph_fails(h, CACHEW_EPARSE,
	    "graph: node 0: input 0 refers to node 0, which does not come "
	    "before it");
	free(h);
	h = graph_hex(NODE_BATCH("9101") NODE_RANGE3, 2, 0, 1);
	assert_graph_fails(h, CACHEW_EPARSE,
	    "graph: node 0: input 0 refers to node 1, which does not come "
	    "before it");
	free(h);
	/* An unknown operator keeps ENOENT, with the node's index. */
	h = graph_hex("83a6696e70757473" "90" "a26f70" "a46e6f7065"
		      "a6706172616d73" "80",
	    1, 0, 1);
	assert_graph_fails(h, CACHEW_ENOENT,
	    "graph: node 0: unknown operator 'nope'");
	free(h);
	/* A parameter key that is not a name. */
	h = graph_hex("83a6696e70757473" "90" "a26f70" "a572616e6765"
		      "a6706172616d73" "81" "a3612062" "03",
	    1, 0, 1);
	assert_graph_fails(h, CACHEW_EPARSE,
	    "graph: node 0: parameter key 'a b' is not a name");
	free(h);
	assert_graph_fails("80", CACHEW_EPARSE, "graph map lacks the key 'format'");
	assert_graph_fails("93010203", CACHEW_EPARSE, "the document is not a map");
	h = graph_hex(NODE_RANGE3, 1, 0, 1);
	strcat(h, "c0");
	assert_graph_fails(h, CACHEW_EPARSE,
	    "graph: 1 bytes follow the graph map at byte");
	free(h);
}
END_TEST

START_TEST(test_graph_msgpack_node_count_limit)
{
	/* 65537 empty node maps: the count is refused before any node is
	 * built. */
	size_t n = 65537, len = 0;
	uint8_t *buf = malloc(n + 128);
	cachew_dataset *ds = NULL;
	static const uint8_t head[] = {0x84, 0xa6, 'f', 'o', 'r', 'm', 'a', 't',
	    0xac, 'c', 'a', 'c', 'h', 'e', 'w', '-', 'g', 'r', 'a', 'p', 'h',
	    0xa5, 'n', 'o', 'd', 'e', 's', 0xdd, 0x00, 0x01, 0x00, 0x01};
	static const uint8_t tail[] = {0xa4, 'r', 'o', 'o', 't', 0x00, 0xa7, 'v',
	    'e', 'r', 's', 'i', 'o', 'n', 0x01};

	memcpy(buf, head, sizeof(head));
	len = sizeof(head);
	memset(buf + len, 0x80, n);
	len += n;
	memcpy(buf + len, tail, sizeof(tail));
	len += sizeof(tail);
	ck_assert_int_eq(cachew_dataset_from_msgpack(&ds, buf, len), CACHEW_EPARSE);
	ck_assert_str_eq(cachew_errmsg(),
	    "graph: 65537 nodes exceed the limit of 65536");
	free(buf);
}
END_TEST

START_TEST(test_graph_msgpack_long_chain_within_limit)
{
	size_t cap = 4200 * 12, len = 0;
	char *text = malloc(cap);
	void *buf = NULL;
	cachew_dataset *ds, *back = NULL;
	char a[33], b[33];

	char *end;

	ck_assert_ptr_nonnull(text);
	end = text + sprintf(text, "range(1)");
	/* take, not batch: a batch of a batch ... reaches rank 8 after 8
	 * stages, which building refuses. */
	for (int i = 1; i < 4096; i++)
		end += sprintf(end, " | take(1)");
	ds = parse_ok(text);
	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len), CACHEW_OK);
	ck_assert_int_eq(cachew_dataset_from_msgpack(&back, buf, len), CACHEW_OK);
	fp_hex(ds, a);
	fp_hex(back, b);
	ck_assert_str_eq(a, b);
	cachew_free(buf);
	cachew_dataset_release(back);
	cachew_dataset_release(ds);
	free(text);
}
END_TEST

/* ---- fingerprints --------------------------------------------------------------------- */

START_TEST(test_fingerprint_changes_with_every_data_param)
{
	static const char *const variants[] = {
	    "range(10) | batch(4)",
	    "range(10) | batch(5)",
	    "range(10) | batch(4, drop_remainder=true)",
	    "range(11) | batch(4)",
	    "range(1, 10) | batch(4)",
	    "range(0, 10, 2) | batch(4)",
	    "range(10) | map(add) | batch(4)",
	    "range(10) | map(add, value=2) | batch(4)",
	    "range(10) | map(mul, value=2) | batch(4)",
	    "range(10) | map(add, deterministic=false) | batch(4)",
	};
	char fps[sizeof(variants) / sizeof(variants[0])][33];

	for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
		fp_of(variants[i], fps[i]);
		for (size_t k = 0; k < i; k++)
			ck_assert_msg(strcmp(fps[i], fps[k]) != 0,
			    "'%s' and '%s' share a fingerprint", variants[i],
			    variants[k]);
	}
}
END_TEST

START_TEST(test_fingerprint_ignores_parallelism)
{
	char a[33], b[33], c[33];

	fp_of("range(10) | map(add)", a);
	fp_of("range(10) | map(add, parallel=8)", b);
	fp_of("range(10) | map(add, parallel=auto)", c);
	ck_assert_str_eq(a, b);
	ck_assert_str_eq(a, c);
}
END_TEST

START_TEST(test_fingerprint_ignores_prefetch_and_autocache)
{
	char a[33], b[33];

	fp_of("range(10) | batch(4)", a);
	if (has_op("prefetch")) {
		fp_of("range(10) | prefetch(2) | batch(4) | prefetch(auto)", b);
		ck_assert_str_eq(a, b);
	}
	if (has_op("autocache")) {
		fp_of("range(10) | autocache | batch(4) | autocache", b);
		ck_assert_str_eq(a, b);
	}
}
END_TEST

START_TEST(test_fingerprint_known_value)
{
	char a[33];

	/* Pinned: a change here changes every cache key and profile. */
	fp_of("range(10) | batch(4)", a);
	ck_assert_str_eq(a, "85d24e127403fc48ecb2eb7a9b3b5a31");
}
END_TEST

/* ---- plugin builds --------------------------------------------------------------------- */

/* Loads <build>/plugin_example.so (square, is_even) into this test's
 * process: its functions then carry its identity. */
static void
load_example_plugin(void)
{
	char so[600];

	cwt_build_file(so, sizeof(so), "plugin_example.so");
	ck_assert_msg(cachew_plugin_load(so) == CACHEW_OK, "%s",
	    cachew_errmsg());
}

/* The fingerprint `cachew explain --plugin so` gives the pipeline (its
 * first line's fp=), in another process. */
static void
explain_fp(const char *so, const char *pipeline, char out[33])
{
	char cmd[1400], line[1024], *fp;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "%s/cachew explain --plugin '%s' '%s'",
	    cwt_build_dir(), so, pipeline);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	ck_assert_msg(fgets(line, sizeof(line), p) != NULL, "%s: no output",
	    cmd);
	while (fgetc(p) != EOF)
		;
	ck_assert_int_eq(pclose(p), 0);
	fp = strstr(line, "fp=");
	ck_assert_msg(fp != NULL && strlen(fp) >= 35, "%s: %s", cmd, line);
	memcpy(out, fp + 3, 32);
	out[32] = '\0';
}

/* Copies the file `from` to `to`, then appends `extra` bytes (another
 * build of the same plugin: it still loads, and hashes differently). */
static void
copy_file(const char *from, const char *to, const char *extra)
{
	char *data = cwt_slurp(from);
	struct stat st;
	size_t n;

	ck_assert_ptr_nonnull(data);
	ck_assert_int_eq(stat(from, &st), 0);
	n = (size_t)st.st_size;
	data = realloc(data, n + strlen(extra));
	ck_assert_ptr_nonnull(data);
	memcpy(data + n, extra, strlen(extra));
	cwt_write_file(to, data, n + strlen(extra));
	free(data);
}

/* A plugin's identity (name, version, a hash of the .so) is part of the
 * fingerprint of every pipeline using its functions (issue 20, item 4):
 * another version, or the same version rebuilt, is another fingerprint
 * (never the same cache), while the same bytes at another path are the
 * same plugin. Pipelines without plugin functions keep their pinned
 * fingerprints with the plugin loaded. */
START_TEST(test_fingerprint_changes_with_the_plugin_build)
{
	static const char *const p = "range(5) | map(square)";
	char v1[600], v2[600], same[700], rebuilt[700];
	char fp1[33], fp2[33], fps[33], fpr[33], fpb[33];
	char *dir = cwt_tmpdir();

	cwt_build_file(v1, sizeof(v1), "plugin_example.so");
	cwt_build_file(v2, sizeof(v2), "plugin_example_v2.so");
	snprintf(same, sizeof(same), "%s/renamed_copy.so", dir);
	snprintf(rebuilt, sizeof(rebuilt), "%s/plugin_example.so", dir);
	copy_file(v1, same, "");
	copy_file(v1, rebuilt, "another build");
	explain_fp(v1, p, fp1);
	explain_fp(v2, p, fp2);
	explain_fp(same, p, fps);
	explain_fp(rebuilt, p, fpr);
	ck_assert_str_ne(fp1, fp2);
	ck_assert_str_ne(fp1, fpr);
	ck_assert_str_ne(fp2, fpr);
	ck_assert_str_eq(fp1, fps);
	explain_fp(v1, "range(10) | batch(4)", fpb);
	ck_assert_str_eq(fpb, "85d24e127403fc48ecb2eb7a9b3b5a31");
	/* The function's node changes; its input, range(5), does not. */
	explain_fp(v2, "range(5)", fpb);
	ck_assert_str_eq(fpb, "26ca37204df8a00d924100754c9995cd");
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

/* msgpack hex of a string (fixstr or str8). */
static void
str_hex(char *out, const char *text)
{
	size_t n = strlen(text);

	out += strlen(out);
	out += n < 32 ? sprintf(out, "%02zx", 0xa0 | n)
		      : sprintf(out, "d9%02zx", n);
	for (size_t i = 0; i < n; i++)
		out += sprintf(out, "%02x", (unsigned char)text[i]);
}

/* A graph of range(3) and map(fn) whose map node has a `plugin` entry
 * (name, version, hash) unless name is NULL. */
static char *
map_graph_hex(const char *fn, const char *name, const char *version,
    const char *hash)
{
	char nodes[1024];

	snprintf(nodes, sizeof(nodes), "%s%s%s", NODE_RANGE3,
	    name != NULL ? "84" : "83",
	    "a6696e70757473" "9100" "a26f70" "a36d6170" "a6706172616d73"
	    "81" "a2666e");
	str_hex(nodes, fn);
	if (name != NULL) {
		strcat(nodes, "a6706c7567696e" "83" "a468617368");
		str_hex(nodes, hash);
		strcat(nodes, "a46e616d65");
		str_hex(nodes, name);
		strcat(nodes, "a776657273696f6e");
		str_hex(nodes, version);
	}
	return graph_hex(nodes, 2, 1, 1);
}

/* A graph names the plugin build its functions come from, and a reader
 * with another build, or none, refuses it as the function missing,
 * naming the function, the build wanted and what it has. */
START_TEST(test_graph_msgpack_refuses_another_plugin_build)
{
	const cwi_plugin *pl;
	char fp_a[33], fp_b[33], want[300], *h, bad[33];
	cachew_dataset *ds, *back = NULL;
	void *buf = NULL;
	size_t len = 0;

	load_example_plugin();
	pl = cwi_fn_lookup("square")->plugin;
	ck_assert_ptr_nonnull(pl);
	ck_assert_str_eq(pl->name, "plugin_example");
	ck_assert_str_eq(pl->version, "1.0");
	/* Written with the plugin's build, read back as the same. */
	ds = parse_ok("range(3) | map(square)");
	ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len), CACHEW_OK);
	ck_assert_ptr_nonnull(memmem(buf, len, pl->hash_hex, 32));
	ck_assert_int_eq(cachew_dataset_from_msgpack(&back, buf, len),
	    CACHEW_OK);
	fp_hex(ds, fp_a);
	fp_hex(back, fp_b);
	ck_assert_str_eq(fp_a, fp_b);
	cachew_free(buf);
	cachew_dataset_release(back);
	cachew_dataset_release(ds);
	h = map_graph_hex("square", "plugin_example", "1.0", pl->hash_hex);
	back = NULL;
	{
		uint8_t b[512];
		size_t n = unhex(h, b, sizeof(b));
		ck_assert_msg(cachew_dataset_from_msgpack(&back, b, n) ==
			CACHEW_OK, "%s", cachew_errmsg());
		cachew_dataset_release(back);
	}
	free(h);
	/* Another version, another hash. */
	snprintf(want, sizeof(want), "graph: node 1: function 'square' of "
	    "plugin plugin_example 2.0 (build %.16s) is not loaded here: this "
	    "process has 'square' of plugin plugin_example 1.0 (build %.16s)",
	    pl->hash_hex, pl->hash_hex);
	h = map_graph_hex("square", "plugin_example", "2.0", pl->hash_hex);
	assert_graph_fails(h, CACHEW_ENOENT, want);
	free(h);
	memcpy(bad, pl->hash_hex, 33);
	bad[0] = bad[0] == '0' ? '1' : '0';
	h = map_graph_hex("square", "plugin_example", "1.0", bad);
	assert_graph_fails(h, CACHEW_ENOENT, "is not loaded here: this process "
	    "has 'square' of plugin plugin_example 1.0");
	free(h);
	/* No plugin in the graph, a plugin's function here; the reverse. */
	h = map_graph_hex("square", NULL, NULL, NULL);
	assert_graph_fails(h, CACHEW_ENOENT, "graph: node 1: function 'square' "
	    "(registered from C, of no plugin) is not loaded here: this "
	    "process has 'square' of plugin plugin_example 1.0");
	free(h);
	h = map_graph_hex("add", "plugin_example", "1.0", pl->hash_hex);
	assert_graph_fails(h, CACHEW_ENOENT, "function 'add' of plugin "
	    "plugin_example 1.0 (build");
	assert_graph_fails(h, CACHEW_ENOENT, "this process has a built-in "
	    "function of that name");
	free(h);
	h = map_graph_hex("nope", "plugin_example", "", pl->hash_hex);
	assert_graph_fails(h, CACHEW_ENOENT, "graph: node 1: function 'nope' "
	    "of plugin plugin_example (no version) (build");
	assert_graph_fails(h, CACHEW_ENOENT, "is not loaded here (no function "
	    "of that name)");
	free(h);
	/* Malformed entries. */
	h = map_graph_hex("square", "plugin_example", "1.0", "xyz");
	assert_graph_fails(h, CACHEW_EPARSE, "graph: node 1: 'plugin': 'hash' "
	    "is not 32 lowercase hex digits");
	free(h);
	h = map_graph_hex("square", "", "1.0", pl->hash_hex);
	assert_graph_fails(h, CACHEW_EPARSE, "'name' is not 1 to 63 characters");
	free(h);
	h = map_graph_hex("square", "plugin_example", "1 0", pl->hash_hex);
	assert_graph_fails(h, CACHEW_EPARSE, "'version' is not at most 63");
	free(h);
	h = graph_hex("84" "a6696e70757473" "90" "a26f70" "a572616e6765"
		      "a6706172616d73" "81" "a473746f70" "03"
		      "a6706c7567696e" "80",
	    1, 0, 1);
	assert_graph_fails(h, CACHEW_EPARSE,
	    "graph: node 0: 'plugin' on a node without a function");
	free(h);
}
END_TEST

/* What a process needs to run a graph (cwi_graph_user_fns, the
 * dispatcher's view): each user function once, with the plugin build the
 * graph names, built-in functions left out. */
START_TEST(test_graph_user_functions_name_their_plugin_builds)
{
	cwi_fn_ident *v = NULL;
	const cwi_plugin *pl;
	void *buf = NULL;
	size_t len = 0, n = 9;

	register_test_fns();
	load_example_plugin();
	pl = cwi_fn_lookup("square")->plugin;
	buf = msgpack_of("range(8) | map(square) | map(add) | filter(cwt_keep) "
			 "| map(square) | filter(is_even)", &len);
	ck_assert_int_eq(cwi_graph_user_fns(buf, len, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(v[0].name, "square");
	ck_assert_str_eq(v[0].plugin, "plugin_example");
	ck_assert_str_eq(v[0].version, "1.0");
	ck_assert_str_eq(v[0].hash, pl->hash_hex);
	ck_assert_str_eq(v[1].name, "cwt_keep");
	ck_assert_str_eq(v[1].plugin, "");
	ck_assert_str_eq(v[2].name, "is_even");
	free(v);
	cachew_free(buf);
	buf = msgpack_of("range(8) | map(add) | batch(2)", &len);
	v = NULL;
	ck_assert_int_eq(cwi_graph_user_fns(buf, len, &v, &n), CACHEW_OK);
	ck_assert_uint_eq(n, 0);
	free(v);
	/* A document that does not decode is EPARSE, as for from_msgpack. */
	ck_assert_int_eq(cwi_graph_user_fns(buf, len - 1, &v, &n),
	    CACHEW_EPARSE);
	cachew_free(buf);
}
END_TEST

/* ---- the fingerprint against an independent implementation ----------------------------- */

#define PYTHON "/usr/bin/python3"
#define FP_REF "test/data/fingerprint_ref.py"

/* Pipelines whose fingerprints test/data/fingerprint_ref.py recomputes
 * from docs/graph-format.md section 5 alone; '@' stands for a directory of
 * files the test makes. Together they cover every item of the stream,
 * every value type, the length classes of XXH3-128 (the last pipeline,
 * built by the test, is longer than one 1024-byte block) and the rules
 * for files, passthrough operators and fingerprint parameters. */
static const char *const fp_ref_pipelines[] = {
    "range(10) | batch(4)",
    "range(-5, 100, 7) | batch(3, drop_remainder=true)",
    "from_list([\"a\", \"b\xc3\xa9\", \"\", \"a string long enough for a "
    "stream of 129 to 240 bytes, which XXH3 hashes its own way\"])",
    "from_list([1.5, -0.0, 0.0, 1e300, -inf, inf, nan])",
    "from_tensors((1, [2.5, 3.0], (\"x\", \"yz\"), (true, false), ()))",
    "range(3) | map(cwt_any, a=null, b={y=[1, (2,)], x=\"s\"}, c=-7) | "
    "filter(cwt_keep)",
    "range(10) | map(add, value=2, parallel=4) | batch(2)",
    "range(100) | shuffle(16, seed=7, reshuffle_each_iteration=false)",
    "list_files(\"@/d/*.txt\", shuffle=false) | interleave(text_lines, "
    "cycle=2, block=3, parallel=2)",
    "list_files([\"@/d/./a.txt\", \"@/d/sub/*.txt\"], seed=3)",
    "tfrecord(\"@/d/x.tfrecord\", verify=false, buffer_size=4096)",
    "text_lines(\"@/d/none-*.txt\")",
    "text_lines([\"http://example.com/a.txt\", \"s3://bkt/key.txt\"])",
    "zip(range(3), from_list([\"a\", \"b\"])) | "
    "concatenate(zip(range(3), from_list([\"c\", \"d\"])))",
    "range(10) | prefetch(2) | autocache | batch(4) | prefetch(auto)",
    "cache_get(\"/nowhere\", \"0123456789abcdef0123456789ABCDEF\") | "
    "batch(2)",
    "range(4) | map(square) | filter(is_even) | batch(2)",
};
#define FP_REF_N (sizeof(fp_ref_pipelines) / sizeof(fp_ref_pipelines[0]))

/* `tmpl` with every '@' replaced by `dir` (free). */
static char *
with_dir(const char *tmpl, const char *dir)
{
	cwi_strbuf sb;
	char *out = NULL;

	cwi_strbuf_init(&sb);
	for (const char *t = tmpl; *t != '\0'; t++) {
		if (*t == '@')
			cwi_strbuf_puts(&sb, dir);
		else
			cwi_strbuf_append(&sb, t, 1);
	}
	ck_assert_int_eq(cwi_strbuf_finish(&sb, &out, NULL), CACHEW_OK);
	return out;
}

/* dir/name holding `text`, modified at a time with nanoseconds. */
static void
fp_ref_file(const char *dir, const char *name, const char *text, long nsec)
{
	char path[1024];
	struct timespec times[2] = {{1700000000, nsec}, {1700000000, nsec}};

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	cwt_write_file(path, text, strlen(text));
	ck_assert_int_eq(utimensat(AT_FDCWD, path, times, 0), 0);
}

/* The pipeline strings of the test, files made under dir (free each). */
static char **
fp_ref_cases(const char *dir)
{
	char **v = calloc(FP_REF_N + 1, sizeof(char *));
	char path[1024], *big;

	ck_assert_ptr_nonnull(v);
	snprintf(path, sizeof(path), "%s/d", dir);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/d/sub", dir);
	ck_assert_int_eq(mkdir(path, 0755), 0);
	fp_ref_file(dir, "d/a.txt", "one\ntwo\n", 123456789);
	fp_ref_file(dir, "d/b.txt", "three\n", 0);
	fp_ref_file(dir, "d/sub/c.txt", "four\n", 999999999);
	fp_ref_file(dir, "d/x.tfrecord", "not read when building", 5);
	for (size_t i = 0; i < FP_REF_N; i++)
		v[i] = with_dir(fp_ref_pipelines[i], dir);
	big = malloc(3100);
	ck_assert_ptr_nonnull(big);
	memcpy(big, "from_tensors(\"", 14);
	memset(big + 14, 'z', 3000);
	memcpy(big + 3014, "\")", 3);
	v[FP_REF_N] = big;
	return v;
}

START_TEST(test_fingerprint_agrees_with_the_python_reference_byte_for_byte)
{
	char *dir, **cases, want[FP_REF_N + 1][33], line[256], path[1024];
	char *cmd = NULL;
	cwi_strbuf sb;
	FILE *p;

	if (access(PYTHON, X_OK) != 0) {
		printf("graph: skipping the fingerprint reference test: "
		       PYTHON " is not installed\n");
		return;
	}
	register_test_fns();
	load_example_plugin(); /* square and is_even: the plugin items */
	dir = cwt_tmpdir();
	cases = fp_ref_cases(dir);
	cwi_strbuf_init(&sb);
	cwi_strbuf_puts(&sb, PYTHON " " FP_REF);
	for (size_t i = 0; i <= FP_REF_N; i++) {
		cachew_dataset *ds = parse_ok(cases[i]);
		void *buf = NULL;
		size_t len = 0;

		fp_hex(ds, want[i]);
		ck_assert_int_eq(cachew_dataset_to_msgpack(ds, &buf, &len),
		    CACHEW_OK);
		snprintf(path, sizeof(path), "%s/g%02zu.graph", dir, i);
		cwt_write_file(path, buf, len);
		cwi_strbuf_puts(&sb, " '");
		cwi_strbuf_puts(&sb, path);
		cwi_strbuf_puts(&sb, "'");
		cachew_free(buf);
		cachew_dataset_release(ds);
	}
	ck_assert_int_eq(cwi_strbuf_finish(&sb, &cmd, NULL), CACHEW_OK);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	for (size_t i = 0; i <= FP_REF_N; i++) {
		ck_assert_msg(fgets(line, sizeof(line), p) != NULL,
		    "%s: no fingerprint for '%s'", FP_REF, cases[i]);
		line[strcspn(line, "\n")] = '\0';
		ck_assert_msg(strcmp(line, want[i]) == 0,
		    "'%s': cachew %s, %s %s", cases[i], want[i], FP_REF, line);
	}
	ck_assert_ptr_null(fgets(line, sizeof(line), p));
	ck_assert_int_eq(pclose(p), 0);
	for (size_t i = 0; i <= FP_REF_N; i++)
		free(cases[i]);
	free(cases);
	free(cmd);
	cwt_rmtree(dir);
	free(dir);
}
END_TEST

Suite *
cwt_graph_suite(void)
{
	Suite *s = suite_create("graph");
	TCase *tc = tcase_create("parse");

	tcase_add_test(tc, test_value_parse_integers_decimal_hex_signed);
	tcase_add_test(tc, test_value_parse_integer_overflow_is_error);
	tcase_add_test(tc, test_value_parse_floats_and_specials);
	tcase_add_test(tc, test_value_parse_keywords_and_identifiers);
	tcase_add_test(tc, test_value_parse_strings_with_escapes);
	tcase_add_test(tc, test_value_parse_string_errors);
	tcase_add_test(tc, test_value_parse_lists_tuples_maps);
	tcase_add_test(tc, test_value_parse_one_item_tuple_needs_comma);
	tcase_add_test(tc, test_value_parse_bracket_errors_name_the_opening);
	tcase_add_test(tc, test_value_parse_nesting_limit_is_32);
	tcase_add_test(tc, test_parse_positional_forms_bind_in_spec_order);
	tcase_add_test(tc, test_parse_named_args_any_order);
	tcase_add_test(tc, test_parse_identifier_is_a_string_and_auto_an_int);
	tcase_add_test(tc, test_parse_stage_without_parentheses);
	tcase_add_test(tc, test_parse_comments_and_newlines);
	tcase_add_test(tc, test_parse_nested_pipelines_become_inputs);
	tcase_add_test(tc, test_params_parse_builds_a_map);
	tcase_add_test(tc, test_params_parse_errors);
	tcase_add_test(tc, test_parse_error_double_comma_exact_message);
	tcase_add_test(tc, test_parse_error_unclosed_arguments);
	tcase_add_test(tc, test_parse_error_unknown_operator_keeps_enoent);
	tcase_add_test(tc, test_parse_error_unknown_param_keeps_einval_and_names_it);
	tcase_add_test(tc, test_parse_error_bad_values_keep_their_code);
	tcase_add_test(tc, test_parse_error_float_for_an_int_param);
	tcase_add_test(tc, test_parse_error_trailing_text_and_empty);
	tcase_add_test(tc, test_parse_error_names_line_after_the_first);
	tcase_add_test(tc, test_parse_error_long_line_is_cut_around_the_column);
	tcase_add_test(tc, test_parse_error_duplicate_and_misplaced_arguments);
	tcase_add_test(tc, test_parse_error_in_nested_pipeline_points_inside);
	tcase_add_test(tc, test_parse_limit_deep_nesting_is_an_error);
	tcase_add_test(tc, test_parse_limit_huge_integers_are_errors);
	tcase_add_test(tc, test_parse_limit_input_of_more_than_1mib);
	tcase_add_test(tc, test_parse_limit_4096_stages);
	tcase_add_test(tc, test_parse_rejects_null_arguments);
	tcase_add_test(tc, test_parse_error_nul_in_a_string_parameter);
	suite_add_tcase(s, tc);

	tc = tcase_create("print");
	tcase_add_test(tc, test_canonical_range_batch);
	tcase_add_test(tc, test_canonical_map_fn_first_then_params_then_fn_params);
	tcase_add_test(tc, test_canonical_alias_positional_values_fill_the_function);
	tcase_add_test(tc, test_canonical_fn_params_colliding_with_a_param_stay_a_map);
	tcase_add_test(tc, test_canonical_optional_param_absent_is_skipped);
	tcase_add_test(tc, test_canonical_nested_inputs_print_inside_the_stage);
	tcase_add_test(tc, test_canonical_strings_and_literals);
	tcase_add_test(tc, test_canonical_stage_without_params_prints_empty_parens);
	tcase_add_test(tc, test_canonical_of_builder_api_matches_parser);
	tcase_add_test(tc, test_roundtrip_every_operator_string_and_msgpack);
	tcase_add_test(tc, test_to_string_refuses_nesting_deeper_than_31);
	suite_add_tcase(s, tc);

	tc = tcase_create("msgpack");
	tcase_add_test(tc, test_msgpack_value_canonical_bytes);
	tcase_add_test(tc, test_msgpack_value_roundtrip_all_types_and_lengths);
	tcase_add_test(tc, test_msgpack_value_decodes_every_width);
	tcase_add_test(tc, test_msgpack_hostile_counts_are_checked_before_allocating);
	tcase_add_test(tc, test_msgpack_hostile_types_and_values);
	tcase_add_test(tc, test_msgpack_hostile_depth_is_limited);
	tcase_add_test(tc, test_msgpack_value_reports_bytes_used);
	tcase_add_test(tc, test_graph_msgpack_exact_bytes_of_range);
	tcase_add_test(tc, test_graph_msgpack_roundtrip_keeps_fingerprint);
	tcase_add_test(tc, test_graph_msgpack_shared_subgraph_written_once);
	tcase_add_test(tc, test_graph_msgpack_tuples_survive);
	tcase_add_test(tc, test_graph_msgpack_truncated_at_every_byte_is_an_error);
	tcase_add_test(tc, test_graph_msgpack_every_corrupted_byte_is_handled);
	tcase_add_test(tc, test_graph_msgpack_hostile_documents);
	tcase_add_test(tc, test_graph_msgpack_node_count_limit);
	tcase_add_test(tc, test_graph_msgpack_long_chain_within_limit);
	tcase_add_test(tc, test_graph_msgpack_refuses_another_plugin_build);
	tcase_add_test(tc, test_graph_user_functions_name_their_plugin_builds);
	suite_add_tcase(s, tc);

	tc = tcase_create("fingerprint");
	tcase_add_test(tc, test_fingerprint_changes_with_every_data_param);
	tcase_add_test(tc, test_fingerprint_ignores_parallelism);
	tcase_add_test(tc, test_fingerprint_ignores_prefetch_and_autocache);
	tcase_add_test(tc, test_fingerprint_known_value);
	tcase_add_test(tc, test_fingerprint_changes_with_the_plugin_build);
	tcase_add_test(tc,
	    test_fingerprint_agrees_with_the_python_reference_byte_for_byte);
	suite_add_tcase(s, tc);
	return s;
}
