/*
 * fn_text.c - text map functions: tokenize (hashed word ids) and
 * pad_truncate. docs/preprocessing.md is their reference.
 *
 * tokenize splits on ASCII whitespace only, like Python's str.split() on
 * ASCII text: punctuation stays part of its word ("end." and "end" are
 * different tokens). With lowercase=true the ASCII letters A-Z are folded
 * first (other bytes are kept as they are; no Unicode case folding). Each
 * token's id is XXH3_64bits(token bytes) mod vocab, so ids are stable
 * across runs, machines and library versions.
 *
 * The states built by init are immutable and shared by all threads.
 */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

static void
free_state(void *state)
{
	free(state);
}

/* ---- tokenize -------------------------------------------------------------------- */

/*
 * The scan is driven by one table: byte_class[b] is b (A-Z folded when
 * lowercase) or SPACE for Python's str.split() whitespace within ASCII:
 * \t \n \v \f \r, space, and the separators 0x1c-0x1f.
 */
#define SPACE 0x100u

typedef struct tokenize_state {
	bool lowercase;
	uint64_t vocab;
	int64_t component;
	uint16_t byte_class[256];
} tokenize_state;

#define TOKENIZE_MAX_VOCAB (INT64_C(1) << 62)

static cachew_err
tokenize_init(const cachew_params *params, void **state, char *err,
    size_t errlen)
{
	tokenize_state *s;
	int64_t vocab = 262144, comp = 0;
	bool lower = true;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "lowercase, vocab, component", err,
	    errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_bool(params, "lowercase", true, &lower, err,
		    errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "vocab", 262144, 1,
		    TOKENIZE_MAX_VOCAB, &vocab, err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->lowercase = lower;
	s->vocab = (uint64_t)vocab;
	s->component = comp;
	for (unsigned b = 0; b < 256; b++) {
		bool sp = (b >= '\t' && b <= '\r') || (b >= 0x1c && b <= 0x1f) ||
		    b == ' ';
		s->byte_class[b] = (uint16_t)(sp ? SPACE
		    : lower && b - 'A' < 26u ? b + 32 : b);
	}
	*state = s;
	return CACHEW_OK;
}

#define TOKENIZE_STACK_IDS 512
#define TOKENIZE_STACK_WORD 256

/* Appends id to the growable array (*ids, *n, *cap) whose first storage
 * is the caller's stack array `stack`. false on ENOMEM. */
static bool
push_id(int64_t **ids, size_t *n, size_t *cap, int64_t *stack, int64_t id)
{
	if (*n == *cap) {
		size_t ncap = *cap * 2;
		int64_t *p = *ids == stack ? malloc(ncap * sizeof(int64_t))
					   : realloc(*ids, ncap * sizeof(int64_t));
		if (p == NULL)
			return false;
		if (*ids == stack)
			memcpy(p, stack, *n * sizeof(int64_t));
		*ids = p;
		*cap = ncap;
	}
	(*ids)[(*n)++] = id;
	return true;
}

/* The hashed ids of the words of text, in one pass; *ids is `stack` or a
 * heap array the caller frees. false on ENOMEM. */
static bool
hash_words(const tokenize_state *s, const uint8_t *text, size_t len,
    int64_t *stack, int64_t **ids, size_t *n)
{
	const uint16_t *cls = s->byte_class;
	uint8_t word_stack[TOKENIZE_STACK_WORD], *word = word_stack;
	size_t cap = TOKENIZE_STACK_IDS, i = 0;
	uint64_t mask = s->vocab - 1;
	bool pow2 = (s->vocab & mask) == 0, ok = true;

	*ids = stack;
	*n = 0;
	if (len > sizeof(word_stack) && (word = malloc(len)) == NULL)
		return false;
	while (i < len && ok) {
		size_t k = 0;
		uint64_t h;
		uint16_t c;

		while (i < len && cls[text[i]] == SPACE)
			i++;
		if (i == len)
			break;
		while (i < len && (c = cls[text[i]]) != SPACE) {
			word[k++] = (uint8_t)c;
			i++;
		}
		h = XXH3_64bits(word, k);
		ok = push_id(ids, n, &cap, stack,
		    (int64_t)(pow2 ? h & mask : h % s->vocab));
	}
	if (word != word_stack)
		free(word);
	return ok;
}

static cachew_err
tokenize_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const tokenize_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	int64_t stack[TOKENIZE_STACK_IDS], *ids = NULL, shape[1];
	const uint8_t *text;
	cwi_tensor *t, res;
	uint8_t *dst;
	size_t len, n = 0;
	char spec[64];
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	if ((uint64_t)s->component >= e->n) {
		cachew_op_ctx_fail(ctx, "no component %lld: the element has %u",
		    (long long)s->component, e->n);
		rv = CACHEW_EINVAL;
		goto fail;
	}
	t = &e->comp[s->component];
	if (t->dtype != CACHEW_BYTES || cwi_tensor_numel(t) != 1) {
		cachew_op_ctx_fail(ctx, "component %lld is %s: expected text, "
		    "a bytes scalar", (long long)s->component,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		rv = CACHEW_ETYPE;
		goto fail;
	}
	text = cwi_tensor_str(t, 0, &len);
	if (!hash_words(s, text, len, stack, &ids, &n)) {
		rv = cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	shape[0] = (int64_t)n;
	rv = cwi_tensor_init_alloc(&res, CACHEW_I64, 1, shape, false, &dst);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	if (n > 0)
		memcpy(dst, ids, n * sizeof(int64_t));
	if (ids != stack)
		free(ids);
	cwi_tensor_clear(t);
	*t = res;
	*out = e;
	return CACHEW_OK;
fail:
	if (ids != stack)
		free(ids);
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_tokenize = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "tokenize",
    .doc = "tokenize(lowercase=true, vocab=262144, component=0): text bytes -> i64 [n] ids, XXH3_64 of each whitespace-separated word mod vocab",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 2000,
    .init = tokenize_init,
    .fini = free_state,
    .map = tokenize_map,
};

/* ---- pad_truncate ---------------------------------------------------------------- */

typedef struct pad_state {
	int64_t len;
	int64_t pad;
	int64_t component;
} pad_state;

#define PAD_MAX_LEN (INT64_C(1) << 32)

static cachew_err
pad_init(const cachew_params *params, void **state, char *err, size_t errlen)
{
	pad_state *s;
	int64_t len = 128, pad = 0, comp = 0;
	cachew_err rv;

	rv = cwi_fn_check_keys(params, "len, pad, component", err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "len", 128, 0, PAD_MAX_LEN, &len,
		    err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "pad", 0, INT64_MIN, INT64_MAX,
		    &pad, err, errlen);
	if (rv == CACHEW_OK)
		rv = cwi_fn_get_int(params, "component", 0, 0,
		    CACHEW_MAX_COMPONENTS - 1, &comp, err, errlen);
	if (rv != CACHEW_OK)
		return rv;
	s = malloc(sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->len = len;
	s->pad = pad;
	s->component = comp;
	*state = s;
	return CACHEW_OK;
}

/* Keeps the first len values of a rank-1 i64 or i32 tensor and fills the
 * rest with pad (converted to i32 with wrap-around, as cast does). */
static cachew_err
pad_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const pad_state *s = cachew_op_ctx_state(ctx);
	cwi_element *e = cwi_element_make_unique(in);
	int64_t n, keep, shape[1] = {s->len};
	cwi_tensor *t, res;
	const uint8_t *src;
	uint8_t *dst;
	char spec[64];
	cachew_err rv;

	if (e == NULL)
		return cachew_op_ctx_fail(ctx, "out of memory");
	if ((uint64_t)s->component >= e->n) {
		cachew_op_ctx_fail(ctx, "no component %lld: the element has %u",
		    (long long)s->component, e->n);
		rv = CACHEW_EINVAL;
		goto fail;
	}
	t = &e->comp[s->component];
	if ((t->dtype != CACHEW_I64 && t->dtype != CACHEW_I32) || t->rank != 1) {
		cachew_op_ctx_fail(ctx, "component %lld is %s: expected i64 or "
		    "i32 [n]", (long long)s->component,
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		rv = CACHEW_ETYPE;
		goto fail;
	}
	n = t->shape[0];
	if (n == s->len) {
		*out = e;
		return CACHEW_OK;
	}
	rv = cwi_op_ctx_check_bytes(ctx,
	    (uint64_t)s->len * cwi_dtype_sizes[t->dtype & 15],
	    "padding to %lld values", (long long)s->len);
	if (rv != CACHEW_OK)
		goto fail;
	rv = cwi_tensor_init_alloc(&res, (cachew_dtype)t->dtype, 1, shape,
	    false, &dst);
	if (rv != CACHEW_OK) {
		cachew_op_ctx_fail(ctx, "out of memory");
		goto fail;
	}
	keep = n < s->len ? n : s->len;
	src = cwi_tensor_data(t);
	if (t->dtype == CACHEW_I64) {
		int64_t *d = (int64_t *)(void *)dst;
		if (keep > 0)
			memcpy(d, src, (size_t)keep * 8);
		for (int64_t i = keep; i < s->len; i++)
			d[i] = s->pad;
	} else {
		int32_t *d = (int32_t *)(void *)dst;
		int32_t pad = (int32_t)(uint32_t)(uint64_t)s->pad;
		if (keep > 0)
			memcpy(d, src, (size_t)keep * 4);
		for (int64_t i = keep; i < s->len; i++)
			d[i] = pad;
	}
	cwi_tensor_clear(t);
	*t = res;
	*out = e;
	return CACHEW_OK;
fail:
	cwi_element_release(e);
	return rv;
}

const cachew_op_def cwi_fn_pad_truncate = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "pad_truncate",
    .doc = "pad_truncate(len=128, pad=0, component=0): i64/i32 [n] -> [len]: the first len values, then pad",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 200,
    .init = pad_init,
    .fini = free_state,
    .map = pad_map,
};

/* ---- dataset-operator aliases ------------------------------------------------------ */

const cwi_dataset_op cwi_op_tokenize = {
    .name = "tokenize",
    .doc = "text bytes to hashed word ids (map(tokenize))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "tokenize",
};

const cwi_dataset_op cwi_op_pad_truncate = {
    .name = "pad_truncate",
    .doc = "pads or truncates a rank-1 tensor to len (map(pad_truncate))",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "pad_truncate",
};
