/*
 * value_msgpack.c - the msgpack codec of values: a canonical encoder and a
 * decoder for hostile input (see value_msgpack.h for the mapping).
 *
 * The decoder never trusts a length: a string must fit in the bytes that
 * remain, and a container of n items needs at least n bytes (2n for a
 * map), so the memory it allocates is bounded by a small multiple of the
 * input size. Recursion is bounded by max_depth.
 */
#include "value_msgpack.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- encoder ------------------------------------------------------------ */

static void
put_u8(cwi_strbuf *sb, uint8_t b)
{
	cwi_strbuf_append(sb, &b, 1);
}

static void
put_be(cwi_strbuf *sb, uint8_t tag, uint64_t x, unsigned nbytes)
{
	uint8_t b[9];

	b[0] = tag;
	for (unsigned i = 0; i < nbytes; i++)
		b[1 + i] = (uint8_t)(x >> (8 * (nbytes - 1 - i)));
	cwi_strbuf_append(sb, b, 1 + nbytes);
}

void
cwi_msgpack_put_int(cwi_strbuf *sb, int64_t i)
{
	if (i >= 0) {
		uint64_t u = (uint64_t)i;
		if (u <= 0x7f)
			put_u8(sb, (uint8_t)u);
		else if (u <= 0xff)
			put_be(sb, 0xcc, u, 1);
		else if (u <= 0xffff)
			put_be(sb, 0xcd, u, 2);
		else if (u <= 0xffffffffu)
			put_be(sb, 0xce, u, 4);
		else
			put_be(sb, 0xcf, u, 8);
	} else if (i >= -32) {
		put_u8(sb, (uint8_t)(0xe0 | (uint8_t)(i + 32)));
	} else if (i >= INT8_MIN) {
		put_be(sb, 0xd0, (uint64_t)i, 1);
	} else if (i >= INT16_MIN) {
		put_be(sb, 0xd1, (uint64_t)i, 2);
	} else if (i >= INT32_MIN) {
		put_be(sb, 0xd2, (uint64_t)i, 4);
	} else {
		put_be(sb, 0xd3, (uint64_t)i, 8);
	}
}

void
cwi_msgpack_put_array(cwi_strbuf *sb, size_t n)
{
	if (n < 16)
		put_u8(sb, (uint8_t)(0x90 | n));
	else if (n <= 0xffff)
		put_be(sb, 0xdc, n, 2);
	else
		put_be(sb, 0xdd, n, 4);
}

void
cwi_msgpack_put_map(cwi_strbuf *sb, size_t n)
{
	if (n < 16)
		put_u8(sb, (uint8_t)(0x80 | n));
	else if (n <= 0xffff)
		put_be(sb, 0xde, n, 2);
	else
		put_be(sb, 0xdf, n, 4);
}

void
cwi_msgpack_put_str(cwi_strbuf *sb, const char *s, size_t len)
{
	if (len < 32)
		put_u8(sb, (uint8_t)(0xa0 | len));
	else if (len <= 0xff)
		put_be(sb, 0xd9, len, 1);
	else if (len <= 0xffff)
		put_be(sb, 0xda, len, 2);
	else
		put_be(sb, 0xdb, len, 4);
	cwi_strbuf_append(sb, s, len);
}

/* A tuple is ext type 1 around the array of its items: the smallest ext
 * header for the payload length, fixext when the length allows it. */
static void
put_ext_header(cwi_strbuf *sb, size_t len)
{
	uint8_t fix = len == 1 ? 0xd4
	    : len == 2	       ? 0xd5
	    : len == 4	       ? 0xd6
	    : len == 8	       ? 0xd7
	    : len == 16	       ? 0xd8
			       : 0;
	if (fix != 0)
		put_u8(sb, fix);
	else if (len <= 0xff)
		put_be(sb, 0xc7, len, 1);
	else if (len <= 0xffff)
		put_be(sb, 0xc8, len, 2);
	else
		put_be(sb, 0xc9, len, 4);
	put_u8(sb, CWI_MSGPACK_EXT_TUPLE);
}

static cachew_err enc_value(cwi_strbuf *sb, const cwi_value *v, unsigned depth);

static cachew_err
enc_items(cwi_strbuf *sb, const cwi_value *v, unsigned depth)
{
	cachew_err rv;

	cwi_msgpack_put_array(sb, v->u.list.n);
	for (size_t i = 0; i < v->u.list.n; i++) {
		rv = enc_value(sb, &v->u.list.items[i], depth + 1);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

static cachew_err
enc_tuple(cwi_strbuf *sb, const cwi_value *v, unsigned depth)
{
	cwi_strbuf payload;
	cachew_err rv;

	/* The ext header carries the payload length, so the items are
	 * encoded first. */
	cwi_strbuf_init(&payload);
	rv = enc_items(&payload, v, depth);
	if (rv == CACHEW_OK && payload.oom)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	if (rv == CACHEW_OK && payload.len > 0xffffffffu)
		rv = cwi_fail(CACHEW_ERANGE, "msgpack: tuple too large");
	if (rv == CACHEW_OK) {
		put_ext_header(sb, payload.len);
		cwi_strbuf_append(sb, payload.data, payload.len);
	}
	cwi_strbuf_free(&payload);
	return rv;
}

static cachew_err
enc_value(cwi_strbuf *sb, const cwi_value *v, unsigned depth)
{
	uint64_t bits;
	cachew_err rv;

	if (depth > CWI_VALUE_MAX_DEPTH)
		return cwi_fail(CACHEW_ERANGE,
		    "msgpack: value nested deeper than %d levels",
		    CWI_VALUE_MAX_DEPTH);
	switch (v->type) {
	case CWI_V_NIL:
		put_u8(sb, 0xc0);
		break;
	case CWI_V_BOOL:
		put_u8(sb, v->u.b ? 0xc3 : 0xc2);
		break;
	case CWI_V_INT:
		cwi_msgpack_put_int(sb, v->u.i);
		break;
	case CWI_V_FLOAT:
		/* Always float64: fingerprints hash the double's bits. */
		memcpy(&bits, &v->u.f, sizeof(bits));
		put_be(sb, 0xcb, bits, 8);
		break;
	case CWI_V_STR:
		if (v->u.s.len > 0xffffffffu)
			return cwi_fail(CACHEW_ERANGE, "msgpack: string too long");
		cwi_msgpack_put_str(sb, v->u.s.ptr, v->u.s.len);
		break;
	case CWI_V_LIST:
		if (v->u.list.n > 0xffffffffu)
			return cwi_fail(CACHEW_ERANGE, "msgpack: list too long");
		if (v->tuple)
			return enc_tuple(sb, v, depth);
		return enc_items(sb, v, depth);
	case CWI_V_MAP:
		if (v->u.map.n > 0xffffffffu)
			return cwi_fail(CACHEW_ERANGE, "msgpack: map too large");
		cwi_msgpack_put_map(sb, v->u.map.n);
		for (size_t i = 0; i < v->u.map.n; i++) {
			const cwi_kv *kv = &v->u.map.items[i];
			cwi_msgpack_put_str(sb, kv->key, strlen(kv->key));
			rv = enc_value(sb, &kv->val, depth + 1);
			if (rv != CACHEW_OK)
				return rv;
		}
		break;
	}
	return CACHEW_OK;
}

cachew_err
cwi_value_to_msgpack(const cwi_value *v, cwi_strbuf *out)
{
	cachew_err rv = enc_value(out, v, 0);

	if (rv == CACHEW_OK && out->oom)
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
	return rv;
}

/* ---- decoder ------------------------------------------------------------ */

typedef struct mp_reader {
	const uint8_t *buf;
	size_t len; /* end of what may be read now (shrinks inside a tuple) */
	size_t pos;
	unsigned max_depth;
} mp_reader;

static cachew_err
mp_fail(size_t at, const char *fmt, ...) CACHEW_PRINTF(2, 3);

static cachew_err
mp_fail(size_t at, const char *fmt, ...)
{
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return cwi_fail(CACHEW_EPARSE, "msgpack: %s at byte %zu", what, at);
}

static size_t
remain(const mp_reader *r)
{
	return r->len - r->pos;
}

/* Reads an n-byte big-endian unsigned integer; the caller checked room. */
static uint64_t
get_be(mp_reader *r, unsigned n)
{
	uint64_t x = 0;

	for (unsigned i = 0; i < n; i++)
		x = (x << 8) | r->buf[r->pos + i];
	r->pos += n;
	return x;
}

/* Reads the n-byte length or value that follows a header byte at `at`. */
static cachew_err
get_field(mp_reader *r, size_t at, unsigned n, uint64_t *out)
{
	if (remain(r) < n)
		return mp_fail(at, "truncated header (needs %u more bytes, %zu "
				   "remain)",
		    n, remain(r));
	*out = get_be(r, n);
	return CACHEW_OK;
}

static cachew_err dec_value(mp_reader *r, unsigned depth, cwi_value *out);

/* The length of a string whose header byte b was just read, or false if
 * b is not a string header. */
static bool
str_header(mp_reader *r, uint8_t b, size_t at, uint64_t *len, cachew_err *rv)
{
	*rv = CACHEW_OK;
	if ((b & 0xe0) == 0xa0)
		*len = b & 0x1f;
	else if (b == 0xd9)
		*rv = get_field(r, at, 1, len);
	else if (b == 0xda)
		*rv = get_field(r, at, 2, len);
	else if (b == 0xdb)
		*rv = get_field(r, at, 4, len);
	else
		return false;
	return true;
}

static cachew_err
check_str_len(const mp_reader *r, size_t at, uint64_t len)
{
	if (len > CWI_VALUE_MAX_STR)
		return mp_fail(at, "string of %llu bytes exceeds the limit of %u",
		    (unsigned long long)len, CWI_VALUE_MAX_STR);
	if (len > remain(r))
		return mp_fail(at, "string of %llu bytes overruns the input "
				   "(%zu bytes remain)",
		    (unsigned long long)len, remain(r));
	return CACHEW_OK;
}

static cachew_err
check_count(const mp_reader *r, size_t at, const char *what, uint64_t n,
    size_t min_item_bytes, unsigned depth)
{
	if (depth >= r->max_depth)
		return mp_fail(at, "%s nested deeper than %u levels", what,
		    r->max_depth);
	if (n > CWI_VALUE_MAX_ITEMS)
		return mp_fail(at, "%s of %llu items exceeds the limit of %d",
		    what, (unsigned long long)n, CWI_VALUE_MAX_ITEMS);
	/* Every item takes at least one byte (two for a map entry). */
	if (n > remain(r) / min_item_bytes)
		return mp_fail(at, "%s of %llu items overruns the input (%zu "
				   "bytes remain)",
		    what, (unsigned long long)n, remain(r));
	return CACHEW_OK;
}

static cachew_err
dec_array(mp_reader *r, size_t at, uint64_t n, unsigned depth, cwi_value *out)
{
	size_t cap;
	cachew_err rv = check_count(r, at, "array", n, 1, depth);

	if (rv != CACHEW_OK)
		return rv;
	out->type = CWI_V_LIST;
	if (n == 0)
		return CACHEW_OK;
	/* Allocate the capacity cwi_value_list_push assumes for n items (4,
	 * then powers of two), so a later push stays in bounds. */
	for (cap = 4; cap < n; cap *= 2)
		;
	out->u.list.items = calloc(cap, sizeof(cwi_value));
	if (out->u.list.items == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		/* Counted before decoding, so a failure frees its parts. */
		out->u.list.n = i + 1;
		rv = dec_value(r, depth + 1, &out->u.list.items[i]);
		if (rv != CACHEW_OK)
			return rv;
	}
	return CACHEW_OK;
}

typedef struct kv_at {
	cwi_kv kv;
	size_t at; /* offset of the key, for errors */
} kv_at;

static int
kv_at_cmp(const void *a, const void *b)
{
	const kv_at *x = a, *y = b;
	int c = strcmp(x->kv.key, y->kv.key);

	if (c != 0)
		return c;
	return x->at < y->at ? -1 : x->at > y->at;
}

static cachew_err
dec_key(mp_reader *r, char **key)
{
	size_t at = r->pos;
	uint64_t len;
	uint8_t b;
	cachew_err rv;

	if (remain(r) == 0)
		return mp_fail(at, "unexpected end of input");
	b = r->buf[r->pos++];
	if (!str_header(r, b, at, &len, &rv))
		return mp_fail(at, "map key is not a string (type byte 0x%02x)",
		    b);
	if (rv == CACHEW_OK)
		rv = check_str_len(r, at, len);
	if (rv != CACHEW_OK)
		return rv;
	if (memchr(r->buf + r->pos, 0, (size_t)len) != NULL)
		return mp_fail(at, "map key contains a NUL byte");
	*key = cwi_strndup((const char *)r->buf + r->pos, (size_t)len);
	if (*key == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	r->pos += (size_t)len;
	return CACHEW_OK;
}

/* Decodes n entries, sorts them by key (they usually arrive sorted) and
 * refuses duplicates; the result is the sorted map cwi_map_* expect. */
static cachew_err
dec_map(mp_reader *r, size_t at, uint64_t n, unsigned depth, cwi_value *out)
{
	kv_at *tmp = NULL;
	size_t got = 0;
	bool sorted = true;
	cachew_err rv = check_count(r, at, "map", n, 2, depth);

	if (rv != CACHEW_OK)
		return rv;
	out->type = CWI_V_MAP;
	if (n == 0)
		return CACHEW_OK;
	tmp = calloc((size_t)n, sizeof(*tmp));
	if (tmp == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (; got < n; got++) {
		tmp[got].at = r->pos;
		rv = dec_key(r, &tmp[got].kv.key);
		if (rv != CACHEW_OK)
			goto fail;
		rv = dec_value(r, depth + 1, &tmp[got].kv.val);
		if (rv != CACHEW_OK) {
			got++; /* its key needs freeing */
			goto fail;
		}
		if (got > 0 && strcmp(tmp[got - 1].kv.key, tmp[got].kv.key) >= 0)
			sorted = false;
	}
	if (!sorted)
		qsort(tmp, got, sizeof(*tmp), kv_at_cmp);
	for (size_t i = 1; i < got; i++) {
		if (strcmp(tmp[i - 1].kv.key, tmp[i].kv.key) == 0) {
			size_t dup = tmp[i - 1].at > tmp[i].at ? tmp[i - 1].at
							       : tmp[i].at;
			rv = mp_fail(dup, "duplicate map key '%.64s'",
			    tmp[i].kv.key);
			goto fail;
		}
	}
	out->u.map.items = malloc((size_t)n * sizeof(cwi_kv));
	if (out->u.map.items == NULL) {
		rv = cwi_fail(CACHEW_ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < got; i++)
		out->u.map.items[i] = tmp[i].kv;
	out->u.map.n = got;
	free(tmp);
	return CACHEW_OK;
fail:
	for (size_t i = 0; i < got; i++) {
		free(tmp[i].kv.key);
		cwi_value_free(&tmp[i].kv.val);
	}
	free(tmp);
	return rv;
}

/* ext: only type 1 (a tuple, whose payload is exactly one array). */
static cachew_err
dec_ext(mp_reader *r, size_t at, uint64_t len, unsigned depth, cwi_value *out)
{
	size_t saved_len = r->len, end;
	uint8_t b;
	int8_t type;
	cachew_err rv;

	if (remain(r) < 1)
		return mp_fail(at, "truncated ext header");
	type = (int8_t)r->buf[r->pos++];
	if (type != CWI_MSGPACK_EXT_TUPLE)
		return mp_fail(at, "ext type %d is not supported (only %d, a "
				   "tuple)",
		    type, CWI_MSGPACK_EXT_TUPLE);
	if (len > remain(r))
		return mp_fail(at, "ext payload of %llu bytes overruns the input "
				   "(%zu bytes remain)",
		    (unsigned long long)len, remain(r));
	if (len == 0)
		return mp_fail(at, "tuple payload is empty");
	b = r->buf[r->pos];
	if ((b & 0xf0) != 0x90 && b != 0xdc && b != 0xdd)
		return mp_fail(r->pos, "tuple payload is not an array (type "
				       "byte 0x%02x)",
		    b);
	end = r->pos + (size_t)len;
	r->len = end;
	rv = dec_value(r, depth, out);
	r->len = saved_len;
	if (rv != CACHEW_OK)
		return rv;
	out->tuple = true;
	if (r->pos != end)
		return mp_fail(r->pos, "tuple payload has %zu bytes after its "
				       "array",
		    end - r->pos);
	return CACHEW_OK;
}

static cachew_err
dec_scalar_int(mp_reader *r, size_t at, uint8_t b, cwi_value *out)
{
	static const unsigned width[] = {1, 2, 4, 8};
	uint64_t x;
	cachew_err rv;

	if (b >= 0xcc && b <= 0xcf) {
		rv = get_field(r, at, width[b - 0xcc], &x);
		if (rv != CACHEW_OK)
			return rv;
		if (x > (uint64_t)INT64_MAX)
			return mp_fail(at, "unsigned integer %llu is larger than "
					   "INT64_MAX",
			    (unsigned long long)x);
		out->u.i = (int64_t)x;
	} else {
		unsigned w = width[b - 0xd0];
		rv = get_field(r, at, w, &x);
		if (rv != CACHEW_OK)
			return rv;
		/* Sign-extend from w bytes. */
		if (w < 8 && (x >> (8 * w - 1)) != 0)
			x |= ~(uint64_t)0 << (8 * w);
		out->u.i = (int64_t)x;
	}
	out->type = CWI_V_INT;
	return CACHEW_OK;
}

static cachew_err
dec_float(mp_reader *r, size_t at, uint8_t b, cwi_value *out)
{
	uint64_t x;
	cachew_err rv = get_field(r, at, b == 0xca ? 4 : 8, &x);

	if (rv != CACHEW_OK)
		return rv;
	out->type = CWI_V_FLOAT;
	if (b == 0xca) {
		uint32_t u = (uint32_t)x;
		float f;
		memcpy(&f, &u, sizeof(f));
		out->u.f = (double)f;
	} else {
		memcpy(&out->u.f, &x, sizeof(out->u.f));
	}
	/* One NaN, the one the pipeline syntax writes as `nan`, so a graph
	 * keeps its fingerprint through a string round trip. */
	if (isnan(out->u.f))
		out->u.f = NAN;
	return CACHEW_OK;
}

static cachew_err
dec_value(mp_reader *r, unsigned depth, cwi_value *out)
{
	static const unsigned fixext[] = {1, 2, 4, 8, 16};
	size_t at = r->pos;
	uint64_t n;
	uint8_t b;
	cachew_err rv;

	memset(out, 0, sizeof(*out));
	if (remain(r) == 0)
		return mp_fail(at, "unexpected end of input");
	b = r->buf[r->pos++];
	if (b <= 0x7f || b >= 0xe0) {
		out->type = CWI_V_INT;
		out->u.i = (int8_t)b;
		return CACHEW_OK;
	}
	if ((b & 0xf0) == 0x80)
		return dec_map(r, at, b & 0x0f, depth, out);
	if ((b & 0xf0) == 0x90)
		return dec_array(r, at, b & 0x0f, depth, out);
	if (str_header(r, b, at, &n, &rv)) {
		if (rv == CACHEW_OK)
			rv = check_str_len(r, at, n);
		if (rv != CACHEW_OK)
			return rv;
		rv = cwi_value_set_str(out, (const char *)r->buf + r->pos,
		    (size_t)n);
		r->pos += (size_t)n;
		return rv;
	}
	switch (b) {
	case 0xc0:
		out->type = CWI_V_NIL;
		return CACHEW_OK;
	case 0xc2:
	case 0xc3:
		out->type = CWI_V_BOOL;
		out->u.b = b == 0xc3;
		return CACHEW_OK;
	case 0xc4:
	case 0xc5:
	case 0xc6:
		return mp_fail(at, "bin values are not supported");
	case 0xc7:
	case 0xc8:
	case 0xc9:
		rv = get_field(r, at, b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4, &n);
		if (rv != CACHEW_OK)
			return rv;
		return dec_ext(r, at, n, depth, out);
	case 0xd4:
	case 0xd5:
	case 0xd6:
	case 0xd7:
	case 0xd8:
		return dec_ext(r, at, fixext[b - 0xd4], depth, out);
	case 0xca:
	case 0xcb:
		return dec_float(r, at, b, out);
	case 0xcc:
	case 0xcd:
	case 0xce:
	case 0xcf:
	case 0xd0:
	case 0xd1:
	case 0xd2:
	case 0xd3:
		return dec_scalar_int(r, at, b, out);
	case 0xdc:
	case 0xdd:
		rv = get_field(r, at, b == 0xdc ? 2 : 4, &n);
		if (rv != CACHEW_OK)
			return rv;
		return dec_array(r, at, n, depth, out);
	case 0xde:
	case 0xdf:
		rv = get_field(r, at, b == 0xde ? 2 : 4, &n);
		if (rv != CACHEW_OK)
			return rv;
		return dec_map(r, at, n, depth, out);
	default:
		return mp_fail(at, "invalid type byte 0x%02x", b);
	}
}

cachew_err
cwi_value_from_msgpack(const uint8_t *buf, size_t len, size_t *used,
    cwi_value *out, unsigned max_depth)
{
	mp_reader r = {.buf = buf, .len = len, .pos = 0, .max_depth = max_depth};
	cachew_err rv;

	if (buf == NULL && len > 0)
		return cwi_fail(CACHEW_EINVAL, "msgpack: NULL buffer");
	rv = dec_value(&r, 0, out);
	if (rv != CACHEW_OK) {
		cwi_value_free(out);
		return rv;
	}
	if (used != NULL)
		*used = r.pos;
	return CACHEW_OK;
}

/* ---- binary documents: bin writers and a cursor ------------------------- */

void
cwi_msgpack_put_uint(cwi_strbuf *sb, uint64_t u)
{
	if (u <= 0x7f)
		put_u8(sb, (uint8_t)u);
	else if (u <= 0xff)
		put_be(sb, 0xcc, u, 1);
	else if (u <= 0xffff)
		put_be(sb, 0xcd, u, 2);
	else if (u <= 0xffffffffu)
		put_be(sb, 0xce, u, 4);
	else
		put_be(sb, 0xcf, u, 8);
}

void
cwi_msgpack_put_bin_header(cwi_strbuf *sb, size_t len)
{
	if (len <= 0xff)
		put_be(sb, 0xc4, len, 1);
	else if (len <= 0xffff)
		put_be(sb, 0xc5, len, 2);
	else
		put_be(sb, 0xc6, len, 4);
}

void
cwi_msgpack_put_bin(cwi_strbuf *sb, const void *data, size_t len)
{
	cwi_msgpack_put_bin_header(sb, len);
	if (len > 0)
		cwi_strbuf_append(sb, data, len);
}

/* Reads the n-byte big-endian field after the type byte at c->pos. */
static bool
cur_field(const cwi_mp_cursor *c, unsigned n, uint64_t *out)
{
	uint64_t x = 0;

	if (c->len - c->pos < 1 + (size_t)n)
		return false;
	for (unsigned i = 0; i < n; i++)
		x = (x << 8) | c->buf[c->pos + 1 + i];
	*out = x;
	return true;
}

bool
cwi_mp_get_array(cwi_mp_cursor *c, uint64_t *n)
{
	uint8_t b;

	if (c->pos >= c->len)
		return false;
	b = c->buf[c->pos];
	if ((b & 0xf0) == 0x90) {
		*n = b & 0x0f;
		c->pos++;
		return true;
	}
	if (b == 0xdc || b == 0xdd) {
		unsigned w = b == 0xdc ? 2 : 4;
		if (!cur_field(c, w, n))
			return false;
		c->pos += 1 + w;
		return true;
	}
	return false;
}

bool
cwi_mp_get_int(cwi_mp_cursor *c, int64_t *v)
{
	static const unsigned width[] = {1, 2, 4, 8};
	uint64_t x;
	unsigned w;
	uint8_t b;

	if (c->pos >= c->len)
		return false;
	b = c->buf[c->pos];
	if (b <= 0x7f || b >= 0xe0) {
		*v = (int8_t)b;
		c->pos++;
		return true;
	}
	if (b < 0xcc || b > 0xd3)
		return false;
	w = width[(b - 0xcc) & 3];
	if (!cur_field(c, w, &x))
		return false;
	if (b <= 0xcf) {
		if (x > (uint64_t)INT64_MAX)
			return false;
	} else if (w < 8 && (x >> (8 * w - 1)) != 0) {
		x |= ~(uint64_t)0 << (8 * w); /* sign-extend */
	}
	*v = (int64_t)x;
	c->pos += 1 + w;
	return true;
}

bool
cwi_mp_get_uint(cwi_mp_cursor *c, uint64_t *v)
{
	size_t at = c->pos;
	uint64_t x;
	int64_t i;

	if (at < c->len && c->buf[at] == 0xcf) {
		if (!cur_field(c, 8, &x))
			return false;
		*v = x;
		c->pos += 9;
		return true;
	}
	if (!cwi_mp_get_int(c, &i))
		return false;
	if (i < 0) {
		c->pos = at;
		return false;
	}
	*v = (uint64_t)i;
	return true;
}

static bool
get_sized(cwi_mp_cursor *c, uint8_t t8, uint8_t t16, uint8_t t32, bool fix,
    size_t *off, size_t *len)
{
	uint64_t n;
	unsigned w;
	uint8_t b;

	if (c->pos >= c->len)
		return false;
	b = c->buf[c->pos];
	if (fix && (b & 0xe0) == 0xa0) {
		n = b & 0x1f;
		w = 0;
	} else if (b == t8 || b == t16 || b == t32) {
		w = b == t8 ? 1 : b == t16 ? 2 : 4;
		if (!cur_field(c, w, &n))
			return false;
	} else {
		return false;
	}
	if (n > c->len - c->pos - 1 - w)
		return false;
	*off = c->pos + 1 + w;
	*len = (size_t)n;
	c->pos = *off + (size_t)n;
	return true;
}

bool
cwi_mp_get_bin(cwi_mp_cursor *c, size_t *off, size_t *len)
{
	return get_sized(c, 0xc4, 0xc5, 0xc6, false, off, len);
}

bool
cwi_mp_get_str(cwi_mp_cursor *c, size_t *off, size_t *len)
{
	return get_sized(c, 0xd9, 0xda, 0xdb, true, off, len);
}
