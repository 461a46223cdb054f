/*
 * element_codec.c - the msgpack form of an element (docs/cache-format.md,
 * "Element encoding"), shared by cache chunks and the service's data
 * messages.
 *
 *   element   = array(n) of component             1 <= n <= 64
 *   component = array(4) [dtype, shape, aux, data]
 *     dtype   = positive int: the cachew_dtype code (1 u8 .. 9 bytes)
 *     shape   = array(rank) of non-negative ints   rank <= 8
 *     fixed-width dtypes:
 *       aux   = bin of 0..63 bytes: padding so that data's payload starts
 *               at a multiple of 16 bytes from the start of the encoding
 *               buffer (payloads over 16 bytes); readers ignore its bytes
 *       data  = bin of exactly numel * dtype size bytes, little-endian
 *     bytes:
 *       aux   = array(numel) of non-negative ints: each string's length
 *       data  = bin: the strings concatenated, length = sum of lengths
 *
 * The padding is what lets the decoder hand out payloads as zero-copy
 * slices of a 64-byte aligned frame buffer that are aligned for their
 * dtype; a payload that is not (another writer, a shifted buffer) is
 * copied instead, never read misaligned.
 */
#include "element_codec.h"

#include "value_msgpack.h"

#include <stdio.h>
#include <stdlib.h>

#define PAYLOAD_ALIGN 16
#define MAX_PAD 63

/* Where the encoding goes: all of it into sb, or, with g, the small bytes
 * into g->sb and the large payloads by reference (g->refs). */
typedef struct enc_out {
	cwi_strbuf *sb;
	cwi_gather *g; /* NULL: everything is copied into sb */
} enc_out;

/* The offset the alignment is reckoned from: bytes so far in the stream
 * the receiver will see. */
static size_t
enc_pos(const enc_out *o)
{
	return o->g == NULL ? o->sb->len
			    : o->sb->len - o->g->skew + o->g->ref_bytes;
}

/* A payload of len bytes: appended, or referenced when g takes it. */
static void
enc_payload(enc_out *o, const void *data, size_t len)
{
	cwi_gather *g = o->g;

	if (g == NULL || len < g->ref_min || len == 0) {
		if (len > 0)
			cwi_strbuf_append(o->sb, data, len);
		return;
	}
	if (!CWI_GROW(g->refs, g->cap, g->nrefs + 1)) {
		o->sb->oom = true;
		return;
	}
	g->refs[g->nrefs].at = o->sb->len;
	g->refs[g->nrefs].data = data;
	g->refs[g->nrefs].len = len;
	g->nrefs++;
	g->ref_bytes += len;
}

static cachew_err
encode_fixed(const cwi_tensor *t, enc_out *o)
{
	size_t nbytes = cwi_tensor_nbytes(t);
	size_t pad = 0;

	if (nbytes > CWI_INLINE_BYTES) {
		/* Payload offset = here + pad bin header (2) + pad + the data
		 * bin header. */
		size_t at = enc_pos(o) + 2 + cwi_msgpack_bin_header_size(nbytes);
		pad = (PAYLOAD_ALIGN - at % PAYLOAD_ALIGN) % PAYLOAD_ALIGN;
	}
	cwi_msgpack_put_bin_header(o->sb, pad);
	if (pad > 0) {
		static const uint8_t zeros[PAYLOAD_ALIGN];
		cwi_strbuf_append(o->sb, zeros, pad);
	}
	cwi_msgpack_put_bin_header(o->sb, nbytes);
	enc_payload(o, cwi_tensor_data(t), nbytes);
	return CACHEW_OK;
}

static cachew_err
encode_bytes(const cwi_tensor *t, enc_out *o)
{
	int64_t n = cwi_tensor_numel(t);
	const uint64_t *off = cwi_tensor_offsets(t);
	size_t total = (size_t)(off[n] - off[0]);

	if ((uint64_t)n > 0xffffffffu || total > 0xffffffffu)
		return cwi_fail(CACHEW_ERANGE,
		    "element: bytes tensor of %lld strings, %zu bytes is too "
		    "large to encode",
		    (long long)n, total);
	cwi_msgpack_put_array(o->sb, (size_t)n);
	for (int64_t i = 0; i < n; i++)
		cwi_msgpack_put_uint(o->sb, off[i + 1] - off[i]);
	cwi_msgpack_put_bin_header(o->sb, t->buf != NULL ? total : 0);
	if (t->buf != NULL)
		enc_payload(o, t->buf->data + off[0], total);
	return CACHEW_OK;
}

static cachew_err
encode_element(const cwi_element *e, enc_out *o)
{
	cachew_err rv;

	if (e->n == 0 || e->n > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_EINVAL,
		    "element: %u components (expected 1 to %d)", e->n,
		    CACHEW_MAX_COMPONENTS);
	cwi_msgpack_put_array(o->sb, e->n);
	for (uint32_t i = 0; i < e->n; i++) {
		const cwi_tensor *t = &e->comp[i];
		cwi_msgpack_put_array(o->sb, 4);
		cwi_msgpack_put_uint(o->sb, t->dtype);
		cwi_msgpack_put_array(o->sb, t->rank);
		for (unsigned d = 0; d < t->rank; d++)
			cwi_msgpack_put_uint(o->sb, (uint64_t)t->shape[d]);
		if (t->dtype == CACHEW_BYTES) {
			rv = encode_bytes(t, o);
		} else {
			if (cwi_tensor_nbytes(t) > 0xffffffffu)
				return cwi_fail(CACHEW_ERANGE,
				    "element: component %u of %zu bytes is too "
				    "large to encode",
				    i, cwi_tensor_nbytes(t));
			rv = encode_fixed(t, o);
		}
		if (rv != CACHEW_OK)
			return rv;
	}
	if (o->sb->oom)
		return cwi_fail(CACHEW_ENOMEM, "element: out of memory encoding");
	return CACHEW_OK;
}

cachew_err
cwi_element_encode(const cwi_element *e, cwi_strbuf *sb)
{
	enc_out o = {sb, NULL};

	return encode_element(e, &o);
}

cachew_err
cwi_element_encode_gather(const cwi_element *e, cwi_gather *g)
{
	enc_out o = {&g->sb, g};

	return encode_element(e, &o);
}

/* ---- decoder ------------------------------------------------------------ */

typedef struct dec {
	cwi_mp_cursor c;
	cwi_buffer *buf; /* NULL: copy payloads */
	size_t start;    /* offset of the element, for messages */
	uint32_t comp;   /* component being decoded */
} dec;

static cachew_err
dec_fail(const dec *d, const char *what)
{
	return cwi_fail(CACHEW_ECORRUPT,
	    "element at byte %zu: component %u: %s at byte %zu", d->start,
	    d->comp, what, d->c.pos);
}

/* dtype and shape; *numel is checked not to overflow. */
static cachew_err
dec_head(dec *d, cwi_tensor *t, uint64_t *numel)
{
	uint64_t n, v, rank;

	if (!cwi_mp_get_array(&d->c, &n) || n != 4)
		return dec_fail(d, "not an array of 4 items");
	if (!cwi_mp_get_uint(&d->c, &v))
		return dec_fail(d, "dtype is not a non-negative integer");
	if (v == CACHEW_INVALID || v > CACHEW_BYTES)
		return dec_fail(d, "unknown dtype code");
	t->dtype = (uint8_t)v;
	if (!cwi_mp_get_array(&d->c, &rank))
		return dec_fail(d, "shape is not an array");
	if (rank > CACHEW_MAX_RANK)
		return dec_fail(d, "rank exceeds 8");
	t->rank = (uint8_t)rank;
	*numel = 1;
	for (unsigned i = 0; i < rank; i++) {
		if (!cwi_mp_get_uint(&d->c, &v) || v > (uint64_t)INT64_MAX)
			return dec_fail(d, "dimension is not a non-negative "
					   "int64");
		t->shape[i] = (int64_t)v;
		/* Any numel above 2^62 cannot match the bytes present;
		 * refusing it keeps the arithmetic below exact. */
		if (v != 0 && *numel > ((uint64_t)1 << 62) / v)
			return dec_fail(d, "shape has too many values");
		*numel *= v;
	}
	return CACHEW_OK;
}

static cachew_err
dec_fixed(dec *d, cwi_tensor *t, uint64_t numel)
{
	size_t es = cwi_dtype_sizes[t->dtype], off, len;
	const uint8_t *p;
	cachew_err rv;

	if (!cwi_mp_get_bin(&d->c, &off, &len) || len > MAX_PAD)
		return dec_fail(d, "padding is not a bin of at most 63 bytes");
	if (!cwi_mp_get_bin(&d->c, &off, &len))
		return dec_fail(d, "data is not a bin within the input");
	if (numel > ((uint64_t)1 << 62) / es || numel * es != len)
		return dec_fail(d, "data length does not match dtype and shape");
	p = d->c.buf + off;
	if (len <= CWI_INLINE_BYTES) {
		memcpy(t->inl.b, p, len);
		return CACHEW_OK;
	}
	if (d->buf != NULL && (uintptr_t)p % es == 0) {
		t->buf = cwi_buffer_ref(d->buf);
		t->off = off;
		return CACHEW_OK;
	}
	rv = cwi_buffer_alloc(&t->buf, len, false);
	if (rv != CACHEW_OK)
		return rv;
	memcpy(t->buf->data, p, len);
	return CACHEW_OK;
}

static cachew_err
dec_bytes(dec *d, cwi_tensor *t, uint64_t numel)
{
	cwi_buffer *obuf = NULL;
	uint64_t n, total = 0, base, *o;
	size_t off, len;
	cachew_err rv;

	if (!cwi_mp_get_array(&d->c, &n))
		return dec_fail(d, "string lengths are not an array");
	if (n != numel)
		return dec_fail(d, "string count does not match the shape");
	/* Each length takes at least one byte: n is bounded by the input
	 * before the offsets are allocated. */
	if (n > d->c.len - d->c.pos)
		return dec_fail(d, "string count overruns the input");
	if (n <= 1) {
		o = t->inl.u64;
	} else {
		rv = cwi_buffer_alloc(&obuf, ((size_t)n + 1) * sizeof(uint64_t),
		    false);
		if (rv != CACHEW_OK)
			return rv;
		t->obuf = obuf;
		o = (uint64_t *)obuf->data;
	}
	o[0] = 0;
	if (n == 0)
		o[1] = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint64_t l;
		if (!cwi_mp_get_uint(&d->c, &l) || l > d->c.len - total)
			return dec_fail(d, "string length is not a valid "
					   "integer or overruns the input");
		total += l; /* total <= len: no overflow */
		o[i + 1] = total;
	}
	if (!cwi_mp_get_bin(&d->c, &off, &len))
		return dec_fail(d, "string data is not a bin within the input");
	if (len != total)
		return dec_fail(d, "string data length differs from the sum of "
				   "the lengths");
	if (d->buf != NULL) {
		t->buf = cwi_buffer_ref(d->buf);
		base = off;
	} else {
		rv = cwi_buffer_alloc(&t->buf, len, false);
		if (rv != CACHEW_OK)
			return rv;
		if (len > 0)
			memcpy(t->buf->data, d->c.buf + off, len);
		base = 0;
	}
	/* Offsets are relative to buf->data. */
	for (uint64_t i = 0; i <= (n == 0 ? 1 : n); i++)
		o[i] += base;
	return CACHEW_OK;
}

cachew_err
cwi_element_decode(cwi_buffer *buf, const uint8_t *data, size_t len,
    size_t *off, cwi_element **out)
{
	dec d = {.c = {.buf = data, .len = len, .pos = *off}, .buf = buf,
	    .start = *off};
	cwi_element *e;
	uint64_t n, numel = 0;
	cachew_err rv;

	if (buf != NULL && (buf->data != data || buf->size < len))
		return cwi_fail(CACHEW_EINVAL,
		    "element decode: buf does not hold the data");
	if (*off > len)
		return cwi_fail(CACHEW_EINVAL, "element decode: offset past "
					       "the end");
	if (!cwi_mp_get_array(&d.c, &n))
		return cwi_fail(CACHEW_ECORRUPT,
		    "element at byte %zu: not an array", d.start);
	if (n == 0 || n > CACHEW_MAX_COMPONENTS)
		return cwi_fail(CACHEW_ECORRUPT,
		    "element at byte %zu: %llu components (expected 1 to %d)",
		    d.start, (unsigned long long)n, CACHEW_MAX_COMPONENTS);
	/* A component takes at least 6 bytes: bound n before allocating. */
	if (n > (len - d.c.pos) / 6)
		return cwi_fail(CACHEW_ECORRUPT,
		    "element at byte %zu: %llu components overrun the input",
		    d.start, (unsigned long long)n);
	e = cwi_element_new((uint32_t)n);
	if (e == NULL)
		return cwi_fail(CACHEW_ENOMEM, "out of memory");
	for (d.comp = 0; d.comp < n; d.comp++) {
		cwi_tensor *t = &e->comp[d.comp];
		rv = dec_head(&d, t, &numel);
		if (rv == CACHEW_OK)
			rv = t->dtype == CACHEW_BYTES ? dec_bytes(&d, t, numel)
						      : dec_fixed(&d, t, numel);
		if (rv != CACHEW_OK) {
			cwi_element_release(e);
			return rv;
		}
	}
	*off = d.c.pos;
	*out = e;
	return CACHEW_OK;
}
