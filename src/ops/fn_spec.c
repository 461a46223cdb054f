/*
 * fn_spec.c - the typing rules of the built-in map and filter functions:
 * what each yields for an input spec, and the inputs each refuses when the
 * pipeline is built (decode_jpeg of an i64 component, a component index
 * past the element's end) instead of at the first element.
 *
 * A rule reads the function's explicit fn_params (the function's own init
 * has already accepted them when the rule runs) and checks only what the
 * input spec knows: an unknown dtype or rank passes.
 */
#include "ops.h"

#include <stdio.h>

#define DT(x) (1u << (x))
#define DT_NUMERIC                                                       \
	(DT(CACHEW_U8) | DT(CACHEW_I32) | DT(CACHEW_I64) | DT(CACHEW_F16) |  \
	    DT(CACHEW_BF16) | DT(CACHEW_F32) | DT(CACHEW_F64) | DT(CACHEW_BOOL))

static int64_t
fn_int(const cwi_node *node, const char *key, int64_t def)
{
	const cwi_value *v = node->fn_params != NULL
	    ? cwi_map_get(&node->fn_params->map, key)
	    : NULL;

	if (v != NULL && v->type == CWI_V_INT)
		return v->u.i;
	if (v != NULL && v->type == CWI_V_FLOAT)
		return (int64_t)v->u.f;
	return def;
}

static const cwi_value *
fn_value(const cwi_node *node, const char *key)
{
	return node->fn_params != NULL ? cwi_map_get(&node->fn_params->map, key)
				       : NULL;
}

/* The component the function works on (its `component` param, 0 by
 * default), which must exist. */
static cachew_err
fn_component(const cwi_node *node, const cwi_spec *in, uint32_t *c)
{
	int64_t i = fn_int(node, "component", 0);

	if (i < 0 || (uint64_t)i >= in->n)
		return cwi_fail(CACHEW_EINVAL, "%s: component %lld: the "
		    "elements have %u component%s", node->fn->name,
		    (long long)i, in->n, in->n == 1 ? "" : "s");
	*c = (uint32_t)i;
	return CACHEW_OK;
}

/* Refuses component c unless its dtype is in `dtypes` and its rank in
 * [min_rank, max_rank] (where known); `want` says what was expected. */
static cachew_err
fn_want(const cwi_node *node, const cwi_spec *in, uint32_t c,
    unsigned dtypes, unsigned min_rank, unsigned max_rank, const char *want)
{
	const cwi_comp_spec *s = &in->comp[c];
	char label[96];
	cwi_strbuf sb;
	cachew_err rv;

	if ((s->dtype == CACHEW_INVALID || (dtypes & DT(s->dtype))) &&
	    (s->rank == CWI_RANK_UNKNOWN ||
		(s->rank >= min_rank && s->rank <= max_rank)))
		return CACHEW_OK;
	cwi_strbuf_init(&sb);
	cwi_comp_spec_print(&sb, s);
	rv = cwi_fail(CACHEW_ETYPE, "%s: %s is %s; expected %s",
	    node->fn->name, cwi_comp_spec_label(in, c, label, sizeof(label)),
	    sb.data != NULL && !sb.oom ? sb.data : "?", want);
	cwi_strbuf_free(&sb);
	return rv;
}

/* out = in with component c replaced by dtype and rank (dims unknown). */
static cachew_err
fn_replace(const cwi_spec *in, cwi_spec *out, uint32_t c, cachew_dtype dtype,
    unsigned rank)
{
	cachew_err rv = cwi_spec_copy(out, in);

	if (rv != CACHEW_OK)
		return rv;
	out->comp[c].dtype = (uint8_t)dtype;
	out->comp[c].rank = (uint8_t)rank;
	for (unsigned d = 0; d < CACHEW_MAX_RANK; d++)
		out->comp[c].shape[d] = -1;
	return CACHEW_OK;
}

static cachew_err
rule_same(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	(void)node;
	return cwi_spec_copy(out, in);
}

/* mod: integer components only. */
static cachew_err
rule_mod(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	cachew_err rv = CACHEW_OK;

	for (uint32_t c = 0; rv == CACHEW_OK && c < in->n; c++)
		rv = fn_want(node, in, c, DT(CACHEW_U8) | DT(CACHEW_I32) |
		    DT(CACHEW_I64), 0, CACHEW_MAX_RANK, "an integer (u8, i32 "
		    "or i64)");
	return rv != CACHEW_OK ? rv : cwi_spec_copy(out, in);
}

static cachew_err
rule_cast(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	const cwi_value *v = fn_value(node, "dtype");
	cachew_dtype dt = CACHEW_INVALID;
	cachew_err rv = cwi_spec_copy(out, in);

	if (v != NULL && v->type == CWI_V_STR &&
	    cachew_dtype_from_name(v->u.s.ptr, &dt) != CACHEW_OK)
		dt = CACHEW_INVALID;
	cwi_clear_errmsg();
	for (uint32_t i = 0; rv == CACHEW_OK && i < out->n; i++)
		out->comp[i].dtype = (uint8_t)dt;
	return rv;
}

static cachew_err
rule_uniform(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	cachew_err rv;

	(void)node;
	if (in->n >= CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_ETYPE, "uniform: the elements already "
		    "have %d components", CACHEW_MAX_COMPONENTS);
	rv = cwi_spec_init(out, in->n + 1);
	for (uint32_t i = 0; rv == CACHEW_OK && i < in->n; i++) {
		out->comp[i] = in->comp[i];
		out->comp[i].name = NULL;
		rv = cwi_comp_spec_name(&out->comp[i], in->comp[i].name);
	}
	if (rv == CACHEW_OK) {
		out->comp[in->n].dtype = CACHEW_F64;
		out->comp[in->n].rank = 0;
	}
	return rv;
}

static cachew_err
rule_decode_jpeg(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	int64_t ch = fn_int(node, "channels", 3);
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv == CACHEW_OK)
		rv = fn_want(node, in, c, DT(CACHEW_BYTES), 0, 0,
		    "JPEG bytes (a bytes scalar)");
	if (rv == CACHEW_OK)
		rv = fn_replace(in, out, c, CACHEW_U8, 3);
	if (rv == CACHEW_OK && ch > 0)
		out->comp[c].shape[2] = ch;
	return rv;
}

static cachew_err
rule_is_valid_jpeg(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv == CACHEW_OK)
		rv = fn_want(node, in, c, DT(CACHEW_BYTES), 0, 0,
		    "JPEG bytes (a bytes scalar)");
	return rv == CACHEW_OK ? cwi_spec_copy(out, in) : rv;
}

/* size=224 or size=[h, w]: the output's first two dimensions. */
static void
crop_size(const cwi_node *node, int64_t *h, int64_t *w)
{
	const cwi_value *v = fn_value(node, "size");

	*h = *w = 224;
	if (v != NULL && v->type == CWI_V_INT)
		*h = *w = v->u.i;
	else if (v != NULL && v->type == CWI_V_LIST && v->u.list.n == 2 &&
	    v->u.list.items[0].type == CWI_V_INT &&
	    v->u.list.items[1].type == CWI_V_INT) {
		*h = v->u.list.items[0].u.i;
		*w = v->u.list.items[1].u.i;
	} else if (v != NULL)
		*h = *w = -1;
}

static cachew_err
rule_random_resized_crop(const cwi_node *node, const cwi_spec *in,
    cwi_spec *out)
{
	int64_t ch = fn_int(node, "channels", 3);
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv == CACHEW_OK)
		rv = fn_want(node, in, c, DT(CACHEW_BYTES) | DT(CACHEW_U8) |
		    DT(CACHEW_F32), 0, 3, "JPEG bytes or a u8/f32 image");
	if (rv != CACHEW_OK)
		return rv;
	if (in->comp[c].dtype == CACHEW_BYTES) {
		rv = fn_replace(in, out, c, CACHEW_U8, 3);
		if (rv == CACHEW_OK && ch > 0)
			out->comp[c].shape[2] = ch;
	} else {
		rv = cwi_spec_copy(out, in);
	}
	if (rv == CACHEW_OK && out->comp[c].rank != CWI_RANK_UNKNOWN &&
	    out->comp[c].rank >= 2)
		crop_size(node, &out->comp[c].shape[0], &out->comp[c].shape[1]);
	return rv;
}

/* An image [H, W(, C)] of u8 or f32 whose first two dimensions become
 * h and w (resize, center_crop), or stay (flip_left_right). */
static cachew_err
image_rule(const cwi_node *node, const cwi_spec *in, cwi_spec *out,
    bool sized)
{
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv == CACHEW_OK)
		rv = fn_want(node, in, c, DT_NUMERIC, 2, 3,
		    "an image [H, W(, C)]");
	if (rv == CACHEW_OK)
		rv = cwi_spec_copy(out, in);
	if (rv == CACHEW_OK && sized &&
	    out->comp[c].rank != CWI_RANK_UNKNOWN) {
		out->comp[c].shape[0] = fn_int(node, "h", -1);
		out->comp[c].shape[1] = fn_int(node, "w", -1);
	}
	return rv;
}

static cachew_err
rule_resize(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	return image_rule(node, in, out, true);
}

static cachew_err
rule_flip(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	return image_rule(node, in, out, false);
}

static cachew_err
rule_normalize(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	const cwi_value *chw = fn_value(node, "channels_first");
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv == CACHEW_OK)
		rv = fn_want(node, in, c, DT(CACHEW_U8) | DT(CACHEW_F32), 1,
		    CACHEW_MAX_RANK, "u8 or f32 values");
	if (rv == CACHEW_OK)
		rv = cwi_spec_copy(out, in);
	if (rv != CACHEW_OK)
		return rv;
	out->comp[c].dtype = CACHEW_F32;
	if (chw != NULL && chw->type == CWI_V_BOOL && chw->u.b)
		for (unsigned d = 0; d < CACHEW_MAX_RANK; d++)
			out->comp[c].shape[d] = -1;
	return CACHEW_OK;
}

static cachew_err
rule_transpose(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	static const int64_t hwc_to_chw[3] = {2, 0, 1};
	const cwi_value *v = fn_value(node, "perm");
	const cwi_comp_spec *s;
	int64_t perm[CACHEW_MAX_RANK];
	size_t n = 3;
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv != CACHEW_OK || (rv = cwi_spec_copy(out, in)) != CACHEW_OK)
		return rv;
	memcpy(perm, hwc_to_chw, sizeof(hwc_to_chw));
	if (v != NULL && v->type == CWI_V_LIST && v->u.list.n <= CACHEW_MAX_RANK) {
		n = v->u.list.n;
		for (size_t i = 0; i < n; i++)
			perm[i] = v->u.list.items[i].type == CWI_V_INT
			    ? v->u.list.items[i].u.i
			    : -1;
	}
	s = &in->comp[c];
	if (s->rank == CWI_RANK_UNKNOWN)
		return CACHEW_OK;
	if (s->rank != n) {
		char label[96];
		cwi_spec_free(out);
		return cwi_fail(CACHEW_ETYPE, "transpose: %s has rank %u but "
		    "perm has %zu axes", cwi_comp_spec_label(in, c, label,
		    sizeof(label)), s->rank, n);
	}
	for (size_t i = 0; i < n; i++)
		out->comp[c].shape[i] = perm[i] >= 0 && perm[i] < (int64_t)n
		    ? s->shape[perm[i]]
		    : -1;
	return CACHEW_OK;
}

static cachew_err
rule_tokenize(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv == CACHEW_OK)
		rv = fn_want(node, in, c, DT(CACHEW_BYTES), 0, 0,
		    "text (a bytes scalar)");
	return rv == CACHEW_OK ? fn_replace(in, out, c, CACHEW_I64, 1) : rv;
}

static cachew_err
rule_pad_truncate(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	uint32_t c = 0;
	cachew_err rv = fn_component(node, in, &c);

	if (rv == CACHEW_OK)
		rv = fn_want(node, in, c, DT(CACHEW_I64) | DT(CACHEW_I32), 1, 1,
		    "i64 or i32 [n] ids");
	if (rv == CACHEW_OK)
		rv = cwi_spec_copy(out, in);
	if (rv == CACHEW_OK) {
		out->comp[c].rank = 1;
		out->comp[c].shape[0] = fn_int(node, "len", 128);
	}
	return rv;
}

/* The file and Example functions read component 0, a bytes scalar (a path,
 * a serialized Example). */
static cachew_err
want_bytes0(const cwi_node *node, const cwi_spec *in, const char *what)
{
	return in->n > 0 ? fn_want(node, in, 0, DT(CACHEW_BYTES), 0, 0, what)
			 : CACHEW_OK;
}

/* read_file replaces the path in component 0 with the file's bytes. */
static cachew_err
rule_read_file(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	cachew_err rv = want_bytes0(node, in, "a path (a bytes scalar)");

	return rv == CACHEW_OK ? cwi_spec_copy(out, in) : rv;
}

/* The file functions of flat_map and interleave yield bytes scalars. */
static cachew_err
rule_file_records(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	cachew_err rv = want_bytes0(node, in, "a path (a bytes scalar)");

	return rv == CACHEW_OK ? cwi_spec_scalar(out, CACHEW_BYTES) : rv;
}

static cachew_err
rule_parse_example(const cwi_node *node, const cwi_spec *in, cwi_spec *out)
{
	cachew_err rv = want_bytes0(node, in,
	    "a serialized tf.train.Example (a bytes scalar)");

	return rv == CACHEW_OK ? cwi_example_spec_out(node->fn_state, out) : rv;
}

const cwi_fn_spec cwi_builtin_fn_specs[] = {
    {"add", rule_same},
    {"mul", rule_same},
    {"mod", rule_mod},
    {"cast", rule_cast},
    {"identity", rule_same},
    {"sleep_us", rule_same},
    {"spin_us", rule_same},
    {"uniform", rule_uniform},
    {"decode_jpeg", rule_decode_jpeg},
    {"is_valid_jpeg", rule_is_valid_jpeg},
    {"random_resized_crop", rule_random_resized_crop},
    {"resize", rule_resize},
    {"center_crop", rule_resize},
    {"flip_left_right", rule_flip},
    {"normalize", rule_normalize},
    {"transpose", rule_transpose},
    {"tokenize", rule_tokenize},
    {"pad_truncate", rule_pad_truncate},
    {"parse_example", rule_parse_example},
    {"read_file", rule_read_file},
    {"text_lines", rule_file_records},
    {"fixed_length_records", rule_file_records},
    {"tfrecord", rule_file_records},
    {NULL, NULL},
};
