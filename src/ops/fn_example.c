/*
 * fn_example.c - parse_example: decodes serialized tf.train.Example protos
 * into tensors with a small hand-written protobuf wire decoder, and the
 * matching encoder (the data generator and the tests build Examples with
 * it).
 *
 * The messages (tensorflow/core/example/{example,feature}.proto):
 *   Example   { Features features = 1; }
 *   Features  { map<string, Feature> feature = 1; }   entries {1: key, 2: value}
 *   Feature   { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
 *                       Int64List int64_list = 3; } }
 *   BytesList { repeated bytes value = 1; }
 *   FloatList { repeated float value = 1 [packed]; }
 *   Int64List { repeated int64 value = 1 [packed]; }
 *
 * The decoder never recurses: the nesting is fixed, and fields it does not
 * know are skipped by wire type. Every length is checked against the end
 * of its enclosing message before use; varints longer than 10 bytes,
 * groups, field number 0 and wrong wire types are CACHEW_ECORRUPT.
 * Protobuf merge rules apply: a repeated Features field or map entry with
 * the same key is "last wins" per key, and within a Feature the last oneof
 * member wins, repeated occurrences of it concatenating their values.
 * Only the Features of requested keys are decoded; the others are
 * skipped as whole length-delimited fields.
 */
#include "ops.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- the specification: params -> features ------------------------------------- */

typedef struct ex_feature {
	const char *name;  /* the param name (borrowed from the spec strings) */
	char *key;         /* the feature key */
	size_t key_len;
	cachew_dtype dtype; /* BYTES, I64 or F32 */
	int rank;          /* -1: rank 0 for one value, else [n] */
	int64_t shape[CACHEW_MAX_RANK]; /* one dim may be -1 */
	bool has_default;
	int64_t def_i;
	float def_f;
	char *def_s;
} ex_feature;

struct cwi_example_spec {
	size_t n;
	ex_feature *f;   /* in output order: sorted by param name */
	size_t *by_key;  /* feature indices sorted by key */
	char *names;     /* the param names, back to back */
};

void
cwi_example_spec_destroy(cwi_example_spec *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < s->n; i++) {
		free(s->f[i].key);
		free(s->f[i].def_s);
	}
	free(s->f);
	free(s->by_key);
	free(s->names);
	free(s);
}

size_t
cwi_example_spec_size(const cwi_example_spec *s)
{
	return s->n;
}

static cachew_err
spec_error(char *err, size_t errlen, const char *name, const char *why)
{
	snprintf(err, errlen,
	    "feature %s: %s (expected \"key:dtype[:[shape]][:default=V]\", "
	    "dtype bytes, i64 or f32)",
	    name, why);
	return CACHEW_EINVAL;
}

/* "[3]", "[2, 3]", "[-1]", "[]" at *p; advances past the ']'. */
static cachew_err
parse_shape(const char **p, ex_feature *f, const char *name, char *err,
    size_t errlen)
{
	const char *s = *p + 1;
	bool wild = false;

	f->rank = 0;
	for (;;) {
		char *end;
		long long d;

		while (*s == ' ')
			s++;
		if (*s == ']' && f->rank == 0)
			break;
		errno = 0;
		d = strtoll(s, &end, 10);
		if (end == s || errno != 0 || d < -1 || d > INT32_MAX)
			return spec_error(err, errlen, name,
			    "a shape holds sizes >= 0 or one -1");
		if (d == -1 && wild)
			return spec_error(err, errlen, name,
			    "a shape may have one -1");
		wild = wild || d == -1;
		if (f->rank == CACHEW_MAX_RANK)
			return spec_error(err, errlen, name,
			    "a shape has at most 8 dimensions");
		f->shape[f->rank++] = d;
		s = end;
		while (*s == ' ')
			s++;
		if (*s == ',') {
			s++;
			continue;
		}
		if (*s == ']')
			break;
		return spec_error(err, errlen, name, "malformed shape");
	}
	*p = s + 1;
	return CACHEW_OK;
}

static cachew_err
parse_default(const char *v, ex_feature *f, const char *name, char *err,
    size_t errlen)
{
	char *end;

	f->has_default = true;
	errno = 0;
	switch (f->dtype) {
	case CACHEW_I64:
		f->def_i = strtoll(v, &end, 10);
		break;
	case CACHEW_F32:
		f->def_f = strtof(v, &end);
		break;
	default:
		f->def_s = cwi_strdup(v);
		return f->def_s != NULL ? CACHEW_OK : CACHEW_ENOMEM;
	}
	if (end == v || *end != '\0' || errno != 0)
		return spec_error(err, errlen, name,
		    "the default is not a number of the dtype");
	return CACHEW_OK;
}

static cachew_err
parse_feature(const char *name, const char *text, ex_feature *f, char *err,
    size_t errlen)
{
	const char *colon = strchr(text, ':'), *dt, *p;
	size_t dl;

	f->name = name;
	f->rank = -1;
	if (colon == NULL || colon == text)
		return spec_error(err, errlen, name, "no key or no dtype");
	f->key_len = (size_t)(colon - text);
	f->key = cwi_strndup(text, f->key_len);
	if (f->key == NULL)
		return CACHEW_ENOMEM;
	dt = colon + 1;
	dl = strcspn(dt, ":");
	if (dl == 5 && memcmp(dt, "bytes", 5) == 0)
		f->dtype = CACHEW_BYTES;
	else if (dl == 3 && memcmp(dt, "i64", 3) == 0)
		f->dtype = CACHEW_I64;
	else if (dl == 3 && memcmp(dt, "f32", 3) == 0)
		f->dtype = CACHEW_F32;
	else
		return spec_error(err, errlen, name, "unknown dtype");
	p = dt + dl;
	if (p[0] == ':' && p[1] == '[') {
		p++;
		cachew_err rv = parse_shape(&p, f, name, err, errlen);
		if (rv != CACHEW_OK)
			return rv;
	}
	if (strncmp(p, ":default=", 9) == 0) {
		int64_t numel = 1;
		for (int i = 0; i < f->rank && numel <= (1 << 20); i++)
			numel *= f->shape[i] < 1 ? 1 : f->shape[i];
		if (numel > (1 << 20))
			return spec_error(err, errlen, name,
			    "a default fills at most 2^20 values");
		return parse_default(p + 9, f, name, err, errlen);
	}
	if (*p != '\0')
		return spec_error(err, errlen, name, "unexpected text after the dtype");
	return CACHEW_OK;
}

static int
by_key_cmp(const void *a, const void *b, void *ctx)
{
	const cwi_example_spec *s = ctx;
	return strcmp(s->f[*(const size_t *)a].key, s->f[*(const size_t *)b].key);
}

cachew_err
cwi_example_spec_create(const cachew_params *params, cwi_example_spec **out,
    char *err, size_t errlen)
{
	size_t n = cachew_params_count(params), names_len = 0, at = 0;
	cwi_example_spec *s;
	cachew_err rv = CACHEW_ENOMEM;

	if (n == 0 || n > CACHEW_MAX_COMPONENTS) {
		snprintf(err, errlen,
		    "parse_example takes 1 to %d features, name=\"key:dtype\"",
		    CACHEW_MAX_COMPONENTS);
		return CACHEW_EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		names_len += strlen(cachew_params_key(params, i)) + 1;
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return CACHEW_ENOMEM;
	s->f = calloc(n, sizeof(*s->f));
	s->by_key = calloc(n, sizeof(*s->by_key));
	s->names = malloc(names_len);
	if (s->f == NULL || s->by_key == NULL || s->names == NULL)
		goto fail;
	s->n = n;
	for (size_t i = 0; i < n; i++) {
		const char *name = cachew_params_key(params, i), *text;
		size_t nl = strlen(name) + 1;

		memcpy(s->names + at, name, nl);
		name = s->names + at;
		at += nl;
		if (cachew_params_get_str(params, name, &text) != CACHEW_OK) {
			rv = spec_error(err, errlen, name, "not a string");
			goto fail;
		}
		rv = parse_feature(name, text, &s->f[i], err, errlen);
		if (rv != CACHEW_OK)
			goto fail;
		s->by_key[i] = i;
	}
	qsort_r(s->by_key, n, sizeof(size_t), by_key_cmp, s);
	*out = s;
	return CACHEW_OK;
fail:
	if (rv == CACHEW_ENOMEM)
		snprintf(err, errlen, "out of memory");
	cwi_example_spec_destroy(s);
	return rv;
}

/* ---- wire decoding ---------------------------------------------------------------- */

typedef struct wire {
	const uint8_t *p, *end;
} wire;

typedef struct ex_ctx {
	const cwi_example_spec *spec;
	const uint8_t *base; /* the serialized Example */
	char *err;
	size_t errlen;
} ex_ctx;

static cachew_err
corrupt(ex_ctx *c, const uint8_t *at, const char *why)
{
	snprintf(c->err, c->errlen, "malformed Example at byte %zu: %s",
	    (size_t)(at - c->base), why);
	return CACHEW_ECORRUPT;
}

static cachew_err
read_varint(ex_ctx *c, wire *w, uint64_t *out)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < 10; i++) {
		uint8_t b;
		if (w->p == w->end)
			return corrupt(c, w->p, "varint runs past the end");
		b = *w->p++;
		if (i == 9 && b > 1)
			return corrupt(c, w->p - 1, "varint overflows 64 bits");
		v |= (uint64_t)(b & 0x7f) << (7 * i);
		if ((b & 0x80) == 0) {
			*out = v;
			return CACHEW_OK;
		}
	}
	return corrupt(c, w->p, "varint longer than 10 bytes");
}

/* Reads a tag: field number and wire type. */
static cachew_err
read_tag(ex_ctx *c, wire *w, uint32_t *field, unsigned *wt)
{
	const uint8_t *at = w->p;
	uint64_t tag;
	cachew_err rv = read_varint(c, w, &tag);

	if (rv != CACHEW_OK)
		return rv;
	if (tag >> 3 == 0 || tag >> 3 > 0x1fffffff)
		return corrupt(c, at, "invalid field number");
	*field = (uint32_t)(tag >> 3);
	*wt = (unsigned)(tag & 7);
	return CACHEW_OK;
}

/* A length-delimited payload: *sub spans it and w moves past it. */
static cachew_err
read_len(ex_ctx *c, wire *w, wire *sub)
{
	uint64_t len;
	cachew_err rv = read_varint(c, w, &len);

	if (rv != CACHEW_OK)
		return rv;
	if (len > (uint64_t)(w->end - w->p))
		return corrupt(c, w->p, "length runs past the end");
	sub->p = w->p;
	sub->end = w->p + len;
	w->p = sub->end;
	return CACHEW_OK;
}

static cachew_err
skip_field(ex_ctx *c, wire *w, unsigned wt)
{
	uint64_t v;
	wire sub;

	switch (wt) {
	case 0:
		return read_varint(c, w, &v);
	case 1:
	case 5: {
		size_t n = wt == 1 ? 8 : 4;
		if ((size_t)(w->end - w->p) < n)
			return corrupt(c, w->p, "fixed-width value runs past "
						"the end");
		w->p += n;
		return CACHEW_OK;
	}
	case 2:
		return read_len(c, w, &sub);
	default:
		return corrupt(c, w->p, "unsupported wire type (group or "
					"invalid)");
	}
}

/* Where each requested feature's Feature message is (last wins). */
typedef struct ex_found {
	wire feat;
	bool present;
} ex_found;

static void
found_set(const cwi_example_spec *s, const uint8_t *key, size_t klen,
    const wire *feat, ex_found *found)
{
	size_t lo = 0, hi = s->n;

	/* Lower bound of key among the sorted keys; equal keys are
	 * adjacent (two names may ask for one feature). */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		const ex_feature *f = &s->f[s->by_key[mid]];
		int cmp = memcmp(f->key, key, klen < f->key_len ? klen : f->key_len);
		if (cmp < 0 || (cmp == 0 && f->key_len < klen))
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < s->n; lo++) {
		const ex_feature *f = &s->f[s->by_key[lo]];
		if (f->key_len != klen || memcmp(f->key, key, klen) != 0)
			break;
		found[s->by_key[lo]].feat = *feat;
		found[s->by_key[lo]].present = true;
	}
}

/* One map entry {1: key, 2: Feature}. */
static cachew_err
scan_entry(ex_ctx *c, wire w, ex_found *found)
{
	wire key = {w.p, w.p}, feat = {w.p, w.p}; /* protobuf defaults */

	while (w.p < w.end) {
		const uint8_t *at = w.p;
		uint32_t field;
		unsigned wt;
		cachew_err rv = read_tag(c, &w, &field, &wt);

		if (rv != CACHEW_OK)
			return rv;
		if ((field == 1 || field == 2) && wt != 2)
			return corrupt(c, at, "map entry field with a wrong "
					      "wire type");
		if (field == 1)
			rv = read_len(c, &w, &key);
		else if (field == 2)
			rv = read_len(c, &w, &feat);
		else
			rv = skip_field(c, &w, wt);
		if (rv != CACHEW_OK)
			return rv;
	}
	found_set(c->spec, key.p, (size_t)(key.end - key.p), &feat, found);
	return CACHEW_OK;
}

/* Walks the repeated field `want` (length-delimited) of message w,
 * calling fn on each payload; other fields are skipped. */
static cachew_err
scan_message(ex_ctx *c, wire w, uint32_t want,
    cachew_err (*fn)(ex_ctx *c, wire sub, ex_found *found), ex_found *found)
{
	while (w.p < w.end) {
		const uint8_t *at = w.p;
		uint32_t field;
		unsigned wt;
		wire sub;
		cachew_err rv = read_tag(c, &w, &field, &wt);

		if (rv != CACHEW_OK)
			return rv;
		if (field != want) {
			rv = skip_field(c, &w, wt);
		} else if (wt != 2) {
			rv = corrupt(c, at, "message field with a wrong wire "
					    "type");
		} else {
			rv = read_len(c, &w, &sub);
			if (rv == CACHEW_OK)
				rv = fn(c, sub, found);
		}
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

static cachew_err
scan_features(ex_ctx *c, wire w, ex_found *found)
{
	return scan_message(c, w, 1, scan_entry, found);
}

/* ---- one Feature -> one tensor --------------------------------------------------- */

/* The values of a Feature: its kind (1 bytes, 2 float, 3 int64; 0 for an
 * empty Feature) and where the occurrences of that kind start. */
typedef struct ex_values {
	unsigned kind;
	wire from;
	size_t n;
	const cwi_tensor *src; /* the serialized Example (for views) */
} ex_values;

static cachew_err
feature_kind(ex_ctx *c, wire w, ex_values *v)
{
	v->kind = 0;
	v->from = w;
	while (w.p < w.end) {
		const uint8_t *at = w.p;
		uint32_t field;
		unsigned wt;
		cachew_err rv = read_tag(c, &w, &field, &wt);

		if (rv != CACHEW_OK)
			return rv;
		if (field >= 1 && field <= 3) {
			if (wt != 2)
				return corrupt(c, at, "Feature list with a "
						      "wrong wire type");
			if (field != v->kind) {
				v->kind = field;
				v->from.p = at;
			}
		}
		rv = skip_field(c, &w, wt);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

/* Calls `each` on every value of the list field 1 of list message w (of
 * kind k), packed or not. `each` may be NULL (counting only). */
typedef struct ex_sink {
	size_t n;
	void *out;       /* int64_t * or float * or a list of spans */
	const uint8_t **items;
	size_t *lens;
} ex_sink;

static cachew_err
list_values(ex_ctx *c, wire w, unsigned kind, ex_sink *sink)
{
	while (w.p < w.end) {
		const uint8_t *at = w.p;
		uint32_t field;
		unsigned wt;
		wire sub;
		uint64_t v;
		cachew_err rv = read_tag(c, &w, &field, &wt);

		if (rv != CACHEW_OK)
			return rv;
		if (field != 1) {
			rv = skip_field(c, &w, wt);
		} else if (kind == 1) { /* bytes */
			if (wt != 2)
				return corrupt(c, at, "bytes value with a "
						      "wrong wire type");
			rv = read_len(c, &w, &sub);
			if (rv == CACHEW_OK && sink->items != NULL) {
				sink->items[sink->n] = sub.p;
				sink->lens[sink->n] = (size_t)(sub.end - sub.p);
			}
			sink->n++;
		} else if (kind == 2 && wt == 5) { /* one float */
			if (w.end - w.p < 4)
				return corrupt(c, w.p, "float runs past the end");
			if (sink->out != NULL)
				memcpy((float *)sink->out + sink->n, w.p, 4);
			w.p += 4;
			sink->n++;
		} else if (kind == 2 && wt == 2) { /* packed floats */
			rv = read_len(c, &w, &sub);
			if (rv == CACHEW_OK && (sub.end - sub.p) % 4 != 0)
				return corrupt(c, sub.p, "packed floats are not "
							 "a multiple of 4 bytes");
			if (rv == CACHEW_OK && sink->out != NULL)
				memcpy((float *)sink->out + sink->n, sub.p,
				    (size_t)(sub.end - sub.p));
			sink->n += (size_t)(sub.end - sub.p) / 4;
		} else if (kind == 3 && wt == 0) { /* one int64 */
			rv = read_varint(c, &w, &v);
			if (rv == CACHEW_OK && sink->out != NULL)
				((int64_t *)sink->out)[sink->n] = (int64_t)v;
			sink->n++;
		} else if (kind == 3 && wt == 2) { /* packed int64s */
			rv = read_len(c, &w, &sub);
			while (rv == CACHEW_OK && sub.p < sub.end) {
				rv = read_varint(c, &sub, &v);
				if (rv == CACHEW_OK && sink->out != NULL)
					((int64_t *)sink->out)[sink->n] =
					    (int64_t)v;
				sink->n++;
			}
		} else {
			return corrupt(c, at, "list value with a wrong wire "
					      "type");
		}
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

/* Runs list_values over every occurrence of the winning kind. */
static cachew_err
feature_values(ex_ctx *c, const ex_values *v, ex_sink *sink)
{
	wire w = v->from;

	sink->n = 0;
	while (w.p < w.end) {
		uint32_t field;
		unsigned wt;
		wire sub;
		cachew_err rv = read_tag(c, &w, &field, &wt);

		if (rv != CACHEW_OK)
			return rv;
		if (field != v->kind) {
			rv = skip_field(c, &w, wt);
		} else {
			rv = read_len(c, &w, &sub);
			if (rv == CACHEW_OK)
				rv = list_values(c, sub, v->kind, sink);
		}
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

static const char *const kind_names[] = {"empty", "bytes_list", "float_list",
    "int64_list"};

/* The output shape for n values; CACHEW_ETYPE when they do not fit. */
static cachew_err
resolve_shape(ex_ctx *c, const ex_feature *f, size_t n, unsigned *rank,
    int64_t *shape)
{
	int64_t known = 1;
	int wild = -1;

	if (f->rank < 0) {
		*rank = n == 1 ? 0 : 1;
		shape[0] = (int64_t)n;
		return CACHEW_OK;
	}
	*rank = (unsigned)f->rank;
	for (int i = 0; i < f->rank; i++) {
		shape[i] = f->shape[i];
		if (f->shape[i] < 0)
			wild = i;
		else
			known *= f->shape[i];
	}
	if (wild >= 0 && known > 0 && (int64_t)n % known == 0) {
		shape[wild] = (int64_t)n / known;
		return CACHEW_OK;
	}
	if (wild < 0 && known == (int64_t)n)
		return CACHEW_OK;
	if (wild >= 0 && known == 0 && n == 0) {
		shape[wild] = 0;
		return CACHEW_OK;
	}
	snprintf(c->err, c->errlen,
	    "feature '%s' (%s) has %zu values, which do not fit its shape",
	    f->key, f->name, n);
	return CACHEW_ETYPE;
}

static cachew_err
make_bytes(ex_ctx *c, const ex_values *v, ex_sink *sink, unsigned rank,
    const int64_t *shape, cwi_tensor *out)
{
	const cwi_tensor *src = v->src;
	cachew_err rv;

	if (sink->n == 1 && src->buf != NULL) {
		/* One string: a zero-copy view of the serialized Example. */
		size_t start = (size_t)cwi_tensor_offsets(src)[0] +
		    (size_t)(sink->items[0] - c->base);
		cwi_tensor_init_bytes_view(out, src->buf, start, sink->lens[0]);
		out->rank = (uint8_t)rank;
		for (unsigned i = 0; i < rank; i++)
			out->shape[i] = shape[i];
		return CACHEW_OK;
	}
	rv = cwi_tensor_init_bytes_list(out, rank, shape,
	    (const void *const *)sink->items, sink->lens);
	if (rv != CACHEW_OK)
		snprintf(c->err, c->errlen, "out of memory");
	return rv;
}

static cachew_err
decode_feature(ex_ctx *c, const ex_feature *f, const ex_found *fd,
    const cwi_tensor *src, cwi_tensor *out)
{
	static const unsigned want_kind[] = {[CACHEW_BYTES] = 1,
	    [CACHEW_F32] = 2, [CACHEW_I64] = 3};
	ex_values v = {.src = src};
	ex_sink count = {0}, sink = {0};
	int64_t shape[CACHEW_MAX_RANK];
	unsigned rank;
	uint8_t *data;
	cachew_err rv;

	rv = feature_kind(c, fd->feat, &v);
	if (rv == CACHEW_OK && v.kind != 0)
		rv = feature_values(c, &v, &count);
	if (rv != CACHEW_OK)
		return rv;
	if (v.kind != 0 && v.kind != want_kind[f->dtype]) {
		snprintf(c->err, c->errlen,
		    "feature '%s' (%s) is a %s, not %s", f->key, f->name,
		    kind_names[v.kind], cachew_dtype_name(f->dtype));
		return CACHEW_ETYPE;
	}
	rv = resolve_shape(c, f, count.n, &rank, shape);
	if (rv != CACHEW_OK || count.n == 0) {
		if (rv == CACHEW_OK && f->dtype == CACHEW_BYTES)
			rv = cwi_tensor_init_bytes_list(out, rank, shape, NULL,
			    NULL);
		else if (rv == CACHEW_OK)
			rv = cwi_tensor_init_alloc(out, f->dtype, rank, shape,
			    true, &data);
		return rv;
	}
	if (f->dtype == CACHEW_BYTES) {
		sink.items = malloc(count.n * sizeof(*sink.items));
		sink.lens = malloc(count.n * sizeof(*sink.lens));
		rv = sink.items != NULL && sink.lens != NULL ? CACHEW_OK
							     : CACHEW_ENOMEM;
		if (rv == CACHEW_OK)
			rv = feature_values(c, &v, &sink);
		if (rv == CACHEW_OK)
			rv = make_bytes(c, &v, &sink, rank, shape, out);
		free(sink.items);
		free(sink.lens);
		return rv;
	}
	rv = cwi_tensor_init_alloc(out, f->dtype, rank, shape, false, &data);
	if (rv != CACHEW_OK)
		return rv;
	/* Small tensors live inline in *out: write through the accessor. */
	sink.out = data;
	return feature_values(c, &v, &sink);
}

static cachew_err
default_value(ex_ctx *c, const ex_feature *f, cwi_tensor *out)
{
	int64_t shape[CACHEW_MAX_RANK];
	unsigned rank = f->rank < 0 ? 0 : (unsigned)f->rank;
	int64_t numel;
	uint8_t *data;
	cachew_err rv;

	if (!f->has_default) {
		snprintf(c->err, c->errlen, "feature '%s' (%s) is missing",
		    f->key, f->name);
		return CACHEW_EOP;
	}
	for (unsigned i = 0; i < rank; i++)
		shape[i] = f->shape[i] < 0 ? 1 : f->shape[i];
	numel = cwi_shape_numel(rank, shape);
	if (f->dtype == CACHEW_BYTES) {
		size_t len = strlen(f->def_s);
		const void **items = malloc((size_t)numel * sizeof(*items) + 1);
		size_t *lens = malloc((size_t)numel * sizeof(*lens) + 1);
		rv = items != NULL && lens != NULL ? CACHEW_OK : CACHEW_ENOMEM;
		for (int64_t i = 0; rv == CACHEW_OK && i < numel; i++) {
			items[i] = f->def_s;
			lens[i] = len;
		}
		if (rv == CACHEW_OK)
			rv = cwi_tensor_init_bytes_list(out, rank, shape, items,
			    lens);
		free(items);
		free(lens);
		return rv;
	}
	rv = cwi_tensor_init_alloc(out, f->dtype, rank, shape, false, &data);
	for (int64_t i = 0; rv == CACHEW_OK && i < numel; i++) {
		if (f->dtype == CACHEW_I64)
			memcpy(data + 8 * i, &f->def_i, 8);
		else
			memcpy(data + 4 * i, &f->def_f, 4);
	}
	return rv;
}

cachew_err
cwi_example_decode(const cwi_example_spec *s, const cwi_tensor *serialized,
    cwi_tensor *out, char *err, size_t errlen)
{
	ex_found found[CACHEW_MAX_COMPONENTS];
	ex_ctx c = {.spec = s, .err = err, .errlen = errlen};
	size_t len, done = 0;
	wire w;
	cachew_err rv;

	err[0] = '\0';
	for (size_t i = 0; i < s->n; i++)
		cwi_tensor_init_i64(&out[i], 0);
	c.base = cwi_tensor_str(serialized, 0, &len);
	w.p = c.base;
	w.end = c.base + len;
	memset(found, 0, sizeof(found));
	rv = scan_message(&c, w, 1, scan_features, found);
	for (; rv == CACHEW_OK && done < s->n; done++) {
		/* Built in place: a small tensor's values are written
		 * through a pointer into its inline storage. */
		if (found[done].present)
			rv = decode_feature(&c, &s->f[done], &found[done],
			    serialized, &out[done]);
		else
			rv = default_value(&c, &s->f[done], &out[done]);
	}
	if (rv != CACHEW_OK) {
		for (size_t i = 0; i < s->n; i++)
			cwi_tensor_clear(&out[i]);
		if (err[0] == '\0')
			snprintf(err, errlen, "%s",
			    cachew_errmsg()[0] != '\0' ? cachew_errmsg()
						      : cachew_strerror(rv));
	}
	return rv;
}

cachew_err
cwi_example_spec_out(const cwi_example_spec *s, cwi_spec *out)
{
	cachew_err rv = cwi_spec_init(out, (uint32_t)s->n);

	for (size_t i = 0; rv == CACHEW_OK && i < s->n; i++) {
		const ex_feature *f = &s->f[i];
		cwi_comp_spec *c = &out->comp[i];

		c->dtype = (uint8_t)f->dtype;
		if (f->rank >= 0) {
			c->rank = (uint8_t)f->rank;
			memcpy(c->shape, f->shape, sizeof(c->shape));
		}
		rv = cwi_comp_spec_name(c, f->name);
	}
	if (rv != CACHEW_OK)
		cwi_spec_free(out);
	return rv;
}

/* ---- the map function ------------------------------------------------------------------ */

static cachew_err
parse_example_init(
    const cachew_params *params, void **state, char *err, size_t errlen)
{
	cwi_example_spec *s = NULL;
	cachew_err rv = cwi_example_spec_create(params, &s, err, errlen);

	if (rv == CACHEW_OK)
		*state = s;
	return rv;
}

static void
parse_example_fini(void *state)
{
	cwi_example_spec_destroy(state);
}

static cachew_err
parse_example_map(cachew_op_ctx *ctx, cachew_element *in, cachew_element **out)
{
	const cwi_example_spec *s = cachew_op_ctx_state(ctx);
	const cwi_tensor *t = &in->comp[0];
	char err[400], spec[64];
	cwi_element *e;
	cachew_err rv;

	if (t->dtype != CACHEW_BYTES || t->rank != 0) {
		cachew_op_ctx_fail(ctx, "component 0 is %s, expected a bytes "
					"scalar (a serialized Example)",
		    cwi_tensor_spec_str(t, spec, sizeof(spec)));
		cwi_element_release(in);
		return CACHEW_ETYPE;
	}
	e = cwi_element_new((uint32_t)s->n);
	if (e == NULL) {
		cwi_element_release(in);
		cachew_op_ctx_fail(ctx, "out of memory");
		return CACHEW_ENOMEM;
	}
	rv = cwi_example_decode(s, t, e->comp, err, sizeof(err));
	cwi_element_release(in);
	if (rv != CACHEW_OK) {
		/* The components were cleared: release frees nothing twice. */
		cwi_element_release(e);
		cachew_op_ctx_fail(ctx, "%s", err);
		return rv;
	}
	*out = e;
	return CACHEW_OK;
}

const cachew_op_def cwi_fn_parse_example = {
    .version = CACHEW_OP_DEF_VERSION,
    .name = "parse_example",
    .doc = "parse_example(<name>=\"<key>:<bytes|i64|f32>[:[shape]][:default=V]\", ...): decodes the tf.train.Example in component 0 into one component per name, in name order",
    .kind = CACHEW_OP_MAP,
    .cost_ns = 500,
    .init = parse_example_init,
    .fini = parse_example_fini,
    .map = parse_example_map,
};

const cwi_dataset_op cwi_op_parse_example = {
    .name = "parse_example",
    .doc = "decodes serialized tf.train.Example protos into tensors "
	   "(map(parse_example), features as name=\"key:dtype\")",
    .min_inputs = 1,
    .max_inputs = 1,
    .map_alias = "parse_example",
};

/* ---- the encoder -------------------------------------------------------------------- */

static void
put_varint(cwi_strbuf *sb, uint64_t v)
{
	uint8_t b[10];
	size_t n = 0;

	while (v >= 0x80) {
		b[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	b[n++] = (uint8_t)v;
	cwi_strbuf_append(sb, b, n);
}

static void
put_bytes_field(cwi_strbuf *sb, uint32_t field, const void *data, size_t len)
{
	put_varint(sb, (uint64_t)field << 3 | 2);
	put_varint(sb, len);
	cwi_strbuf_append(sb, data, len);
}

void
cwi_example_enc_init(cwi_example_enc *e)
{
	cwi_strbuf_init(&e->features);
}

void
cwi_example_enc_free(cwi_example_enc *e)
{
	cwi_strbuf_free(&e->features);
}

/* Appends the map entry {key, Feature{kind: list}}. */
static void
enc_entry(cwi_example_enc *e, const char *key, uint32_t kind,
    const cwi_strbuf *list)
{
	cwi_strbuf feat, entry;

	cwi_strbuf_init(&feat);
	cwi_strbuf_init(&entry);
	put_bytes_field(&feat, kind, list->data, list->len);
	put_bytes_field(&entry, 1, key, strlen(key));
	put_bytes_field(&entry, 2, feat.data, feat.len);
	put_bytes_field(&e->features, 1, entry.data, entry.len);
	e->features.oom = e->features.oom || feat.oom || entry.oom || list->oom;
	cwi_strbuf_free(&feat);
	cwi_strbuf_free(&entry);
}

void
cwi_example_enc_bytes(cwi_example_enc *e, const char *key,
    const void *const *items, const size_t *lens, size_t n)
{
	cwi_strbuf list;

	cwi_strbuf_init(&list);
	for (size_t i = 0; i < n; i++)
		put_bytes_field(&list, 1, items[i], lens[i]);
	enc_entry(e, key, 1, &list);
	cwi_strbuf_free(&list);
}

void
cwi_example_enc_int64(cwi_example_enc *e, const char *key, const int64_t *v,
    size_t n, bool packed)
{
	cwi_strbuf list, body;

	cwi_strbuf_init(&list);
	cwi_strbuf_init(&body);
	for (size_t i = 0; i < n; i++) {
		if (!packed)
			put_varint(&list, 1 << 3 | 0);
		put_varint(packed ? &body : &list, (uint64_t)v[i]);
	}
	if (packed && n > 0)
		put_bytes_field(&list, 1, body.data, body.len);
	list.oom = list.oom || body.oom;
	enc_entry(e, key, 3, &list);
	cwi_strbuf_free(&list);
	cwi_strbuf_free(&body);
}

void
cwi_example_enc_float(cwi_example_enc *e, const char *key, const float *v,
    size_t n, bool packed)
{
	cwi_strbuf list;

	cwi_strbuf_init(&list);
	if (packed && n > 0) {
		put_varint(&list, 1 << 3 | 2);
		put_varint(&list, 4 * n);
		cwi_strbuf_append(&list, v, 4 * n);
	}
	for (size_t i = 0; !packed && i < n; i++) {
		put_varint(&list, 1 << 3 | 5);
		cwi_strbuf_append(&list, &v[i], 4);
	}
	enc_entry(e, key, 2, &list);
	cwi_strbuf_free(&list);
}

cachew_err
cwi_example_enc_finish(cwi_example_enc *e, cwi_strbuf *out)
{
	bool oom = e->features.oom;

	put_bytes_field(out, 1, e->features.data, e->features.len);
	cwi_strbuf_free(&e->features);
	cwi_strbuf_init(&e->features);
	return oom || out->oom ? CACHEW_ENOMEM : CACHEW_OK;
}
